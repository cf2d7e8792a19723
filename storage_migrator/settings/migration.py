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
            "Object writes per second, shared by all workers (a Prefect global "
            "concurrency limit with slot decay). Default 10: seed 002's goal of "
            "'less than 10 qps of single object operations'."
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
            "How long a Running migration counts as owned by a live run after its last "
            "checkpoint, in seconds; after that run-migrations resumes it. Default 600: "
            "a chunk of 500 objects at 10 writes/s takes about a minute, with retries a few."
        ),
    )
    shared_write_budget: bool = Field(
        default=True,
        description=(
            "Share the write rate among all workers through the Prefect server: the rate is "
            "the slot decay of the global concurrency limit rate_limit_name, and each running "
            "migration holds a lease on '<rate_limit_name>-writers' and writes its share "
            "(docs/migrations.md). Default true. False paces each run locally at "
            "write_rate_per_second (the budget then holds per run only)."
        ),
    )
    prefect_outage_seconds: float = Field(
        default=1800.0,
        gt=0,
        description=(
            "How long a migration on the shared budget waits for an unreachable Prefect "
            "server before it gives up, in seconds (issue 31). It writes nothing meanwhile "
            "(the budget cannot be shared without the server) and keeps its request's lease; "
            "when it gives up, its request is left Running=False, reason PrefectUnreachable, "
            "with its checkpoint, and the next run-migrations resumes it at once. Default 1800."
        ),
    )
    rate_limit_name: str = Field(
        default="storage-migrator-writes",
        min_length=1,
        description=(
            "Name of the Prefect global concurrency limit that budgets writes across "
            "all workers (created idempotently, acquired with strict=True)."
        ),
    )
