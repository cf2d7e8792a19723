"""`detect-storage-changes`: one poll of seed 000's storage migration triggering controller.

Reads like the seed: fetch the discovery document, the StorageStates and the
migrations; decide (a pure plan: create states, touch heartbeats, record a new
storage version hash and request a migration once it has settled, refine
`persistedStorageVersionHashes` when a migration to the current hash has
succeeded, trim a CRD's `storedVersions`); apply; and start `run-migrations`
for every pending request, its own or anyone's. The 10-minute cadence is the Prefect scheduler's
(prefect.yaml); the deployment's concurrency limit of 1 keeps a slow poll from
overlapping the next, which makes one poll at a time our "leader".
"""

from __future__ import annotations

from typing import Any

from prefect import flow
from prefect.client.schemas.objects import State
from prefect.runtime import deployment
from prefect.states import Failed

from flows.cluster_scope import cluster_settings, entered_cluster, run_for_cluster
from flows.events import delivered_events
from flows.polling import PollSummary, poll
from flows.run_logs import our_logs_in_the_run
from flows.run_migrations import run_migrations

__all__ = ["PollSummary", "detect_storage_changes"]


@flow(name="detect-storage-changes", persist_result=False, log_prints=False)
def detect_storage_changes(
    settle_seconds: float | None = None,
    poll_seconds: float | None = None,
    start_migrations: bool = True,
    kubeconfig: str | None = None,
    context: str | None = None,
    cluster: str | None = None,
) -> PollSummary | State[Any]:
    """One poll. `poll_seconds` is the period staleness is judged against (two periods),
    `settle_seconds` the delay after a change before a migration is requested. `cluster`
    names a KubernetesClusterConfig block (issue 20; left out: the environment's cluster)."""
    settings = cluster_settings(cluster, settle_seconds=settle_seconds, poll_seconds=poll_seconds,
                                kubeconfig=kubeconfig, context=context)  # fmt: skip
    # Issue 12: an ephemeral run ends once its events are stored; our threads' warnings reach its log.
    with delivered_events(), our_logs_in_the_run(), entered_cluster(settings):
        summary = poll(settings)
        # Every pending request is run, whoever made it (DESIGN 4.6): one applied with
        # kubectl, or one the closing poll of run-migrations made, starts within a poll.
        if summary.runnable and start_migrations:
            if deployment.id is not None:
                run_for_cluster("run-migrations", cluster, {}, timeout=0, as_subflow=False)
            else:
                run_migrations(kubeconfig=kubeconfig, context=context, cluster=cluster)
    if summary.applied.denied:
        # Issue 14: a permission RBAC denies is no race a later poll wins: fail, naming it and the fix.
        return Failed(message="; ".join(summary.applied.denied))
    return summary
