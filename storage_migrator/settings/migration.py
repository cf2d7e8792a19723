"""The settings of a migration's writes: chunks, writers, retries, the budget (DESIGN 4.5, 4.6, 5)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class MigrationSettings(BaseModel):
    """How a migration writes: chunks, writers, retries, the write budget (DESIGN 4.5, 4.6)."""

    chunk_size: int = Field(
        default=500,
        ge=1,
        le=10_000,
        description=(
            "Objects per LIST page (the `limit`), which is also the checkpoint "
            "granularity. Default 500, as kubectl and the upstream migrator: a crash "
            "re-does at most one chunk."
        ),
    )
    write_rate_per_second: float = Field(
        default=10.0,
        gt=0,
        description=(
            "Object writes per second, shared by every migration writing in the cluster (issue 37: "
            "each writer holds a Lease in the install's namespace carrying this rate; each paces "
            "at the smallest rate of the live writers divided by their number, docs/migrations.md). "
            "Default 10: seed 002's goal of 'less than 10 qps of single object operations'."
        ),
    )
    write_concurrency: int = Field(
        default=8,
        ge=1,
        le=256,
        description=(
            "Writes in flight at once inside one chunk. Default 8: enough to reach "
            "the rate with ~100 ms round trips without bursting the API server."
        ),
    )
    max_write_attempts: int = Field(
        default=6,
        ge=1,
        le=100,
        description=(
            "Attempts per object for transient answers (429, 500, 503, 504, "
            "connection errors) before the object counts as failed. Default 6: about "
            "a minute of backoff; bounded on purpose (upstream issue #83)."
        ),
    )
    backoff_base_seconds: float = Field(
        default=0.5,
        gt=0,
        description=(
            "First retry delay in seconds, doubled per attempt with jitter; a server's Retry-After wins. Default 0.5."
        ),
    )
    backoff_max_seconds: float = Field(
        default=30.0,
        gt=0,
        description="Upper bound of one retry delay in seconds. Default 30.",
    )
    apiserver_restart_window_seconds: float = Field(
        default=60.0,
        ge=0,
        description=(
            "Seconds after a connection error, timeout or 5xx during which a 401/403 is "
            "taken as an API server settling after a restart (its RBAC caches not filled "
            "yet) and waited out, not as a denial of the object. Default 60: a restarted "
            "kube-apiserver fills its caches within seconds; a minute covers a slow one "
            "without making real denials suspect for long. 0: only a failing /readyz counts."
        ),
    )
    apiserver_settle_timeout_seconds: float = Field(
        default=120.0,
        ge=0,
        description=(
            "Longest wait, in seconds of backoff per request, for a settling API server "
            "(401/403 while /readyz fails or right after errors), not counted in "
            "max_write_attempts; also bounds the wait for /readyz before failed objects "
            "of a chunk are tried once more. Default 120: two restarts of an upgrade; "
            "bounded so that a real denial during an outage still ends (upstream issue #83)."
        ),
    )
    max_parallel_migrations: int = Field(
        default=2,
        ge=1,
        le=64,
        description=(
            "Resources migrated at once by run-migrations, each in its own flow run "
            "(one at a time per resource, always). Default 2: the write budget is "
            "shared anyway; more resources in parallel only help when chunks wait on LISTs."
        ),
    )
    lease_seconds: float = Field(
        default=600.0,
        gt=0,
        description=(
            "How long a flow run that a worker took may go without its request's writer Lease "
            "before run-migrations presumes it dead and marks it Crashed in Prefect, in seconds "
            "(the longest a flow run may take to start on your workers); also how often (a "
            "quarter of it) a waiting run-migrations reads the requests again. Which run holds a "
            "request is its writer Lease's (issue 37), not this. Default 600."
        ),
    )
    shared_write_budget: bool = Field(
        default=True,
        description=(
            "Share write_rate_per_second with every migration writing in the cluster: the run's "
            "writer Lease counts it among the writers, and it paces at its share (docs/migrations.md). "
            "Default true. False paces the run alone at write_rate_per_second (the promise then "
            "holds per run only); it still takes its request's Lease, the one-writer lock."
        ),
    )
    namespace: str = Field(
        default="storage-migrator",
        min_length=1,
        max_length=63,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description=(
            "The install's namespace, where each writing run holds its request's Lease "
            "(coordination.k8s.io/v1; issue 37). Default storage-migrator, the namespace of "
            "`kubectl apply -k deployments/`. It must exist: a run refuses to write without it."
        ),
    )
    prefect_outage_seconds: float = Field(
        default=1800.0,
        gt=0,
        description=(
            "How long a migration whose work is done waits for an unreachable Prefect server to "
            "record its end, in seconds (issue 37). Writes never wait for Prefect: the budget and "
            "the request's lock are Leases in the cluster. A run that ends while the server is down "
            "asks it every few seconds, then reports its final state; after this long it gives up "
            "(its request's verdict is in the cluster either way). Default 1800."
        ),
    )
