"""Issue 20: "The cluster's identity is the UID of the kube-system namespace ... A block whose
identity changed (its kubeconfig now points at another cluster) fails the run before any
write, and the message names both identities." And "everything scoped by cluster"."""

from __future__ import annotations

import pytest

from storage_migrator.fleet.identity import IdentityVerdict, judge_identity
from storage_migrator.fleet.names import cluster_tag, identity_variable

A, B = "6f1c2d3e-0000-4000-8000-00000000000a", "6f1c2d3e-0000-4000-8000-00000000000b"


def test_first_seen_is_recorded_same_goes_on_changed_names_both() -> None:
    assert judge_identity("prod-eu", recorded=None, observed=A)[0] is IdentityVerdict.FIRST_SEEN
    assert judge_identity("prod-eu", recorded=A, observed=A)[0] is IdentityVerdict.SAME
    verdict, message = judge_identity("prod-eu", recorded=A, observed=B)
    assert verdict is IdentityVerdict.CHANGED
    assert A in message and B in message and "'prod-eu'" in message
    assert "Nothing was written" in message and "prefect variable delete storage-migrator-cluster-prod-eu" in message


def test_the_default_cluster_keeps_todays_names_a_named_one_gets_its_own() -> None:
    assert (cluster_tag(None), cluster_tag("prod-eu")) == ("cluster:default", "cluster:prod-eu")


@pytest.mark.parametrize("name", ["Prod", "prod_eu", "-prod", "", "prod eu"])
def test_a_name_prefect_would_not_give_a_block_is_refused_never_mapped(name: str) -> None:
    """Mapping `Prod` and `prod` to one name would give two clusters one identity record."""
    with pytest.raises(ValueError, match="KubernetesClusterConfig block name"):
        identity_variable(name)


def test_keys_deployments_and_runbook_records_are_the_clusters_own() -> None:
    """Issue 20: "run names and tags (`cluster:NAME`), event resource labels, artifact keys" scoped
    by cluster; the default cluster keeps a single-cluster install's names."""
    from storage_migrator.fleet.names import block_of, deployment_name, scoped_key
    from storage_migrator.rotation.runbook import ACTIVE_NAME, active_name, record_name

    assert (block_of(None), block_of("default"), block_of("prod-eu")) == (None, None, "prod-eu")
    assert scoped_key("migration-secrets-x", None) == "migration-secrets-x"
    assert scoped_key("migration-secrets-x", "prod-eu") == "cluster-prod-eu-migration-secrets-x"
    assert len(scoped_key("migration-" + "x" * 200, "prod-eu")) == 100
    assert deployment_name("run-migrations", None) == "run-migrations/run-migrations"
    assert deployment_name("run-migrations", "prod-eu") == "run-migrations/prod-eu"
    assert (record_name("key2"), active_name(None)) == ("storage-migrator-runbook-key2", ACTIVE_NAME)
    # A named cluster's record can never be the default's record of another key (block names have no `_`).
    assert record_name("key2", "eu") == "storage-migrator-runbook_eu_key2" != record_name("eu_key2")
    assert active_name("eu") != active_name("prod-eu") != ACTIVE_NAME


def test_a_fleet_verdict_is_each_clusters_own_and_completed_only_when_all_are() -> None:
    """Issue 20: "One failing or unreachable cluster never blocks or fails the others' verdicts";
    "the verdict is per cluster, a is Completed, b is Failed, and the summary says so"."""
    from storage_migrator.fleet.verdicts import ClusterOutcome, fleet_verdict

    a = ClusterOutcome(cluster="a", state="Completed", message="proven", flow_run="r1")
    b = ClusterOutcome(cluster="b", state="Failed", message="secrets: 1 object failed")
    c = ClusterOutcome(cluster="c", state="Crashed", message="")
    verdict = fleet_verdict("rotation to key key2", [a, b, c])
    assert not verdict.completed
    assert [(r["cluster"], r["verdict"]) for r in verdict.rows] == [("a", "Completed"), ("b", "Failed"),
                                                                    ("c", "Crashed")]  # fmt: skip
    assert "Completed on 1 of 3 clusters" in verdict.message
    assert "b: Failed (secrets: 1 object failed)" in verdict.message and "c: Crashed" in verdict.message
    assert "a:" not in verdict.message.split("not on", 1)[1]
    assert fleet_verdict("rotation to key key2", [a]).completed
    with pytest.raises(ValueError, match="no cluster"):
        fleet_verdict("rotation to key key2", [])
