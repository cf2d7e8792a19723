"""The one settings model of the migrator (DESIGN 5).

Design decision: every knob is read from the environment with the prefix
``STORAGE_MIGRATOR_`` by pydantic-settings, validated at start-up with a message
that names the variable, and documented on the field itself (unit, default,
why). Flow parameters override these values; nothing else reads the
environment.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

__all__ = ["Settings"]

DEFAULT_POLL_SECONDS = 600.0


class Settings(BaseSettings):
    """Settings of the storage version migrator, from ``STORAGE_MIGRATOR_*`` variables."""

    model_config = SettingsConfigDict(
        env_prefix="STORAGE_MIGRATOR_",
        extra="ignore",
        validate_default=True,
    )

    kubeconfig: Path | None = Field(
        default=None,
        description=(
            "Path of the kubeconfig file. Default: none, which means KUBECONFIG or "
            "~/.kube/config, or the in-cluster service account when running in a pod."
        ),
    )
    context: str | None = Field(
        default=None,
        description="kubeconfig context to use. Default: the file's current-context.",
    )
    in_cluster: bool | None = Field(
        default=None,
        description=(
            "Use the pod's service account (true) or a kubeconfig (false). Default: "
            "auto, i.e. in-cluster when KUBERNETES_SERVICE_HOST is set and no "
            "kubeconfig path is given."
        ),
    )
    cluster_config_block: str | None = Field(
        default=None,
        min_length=1,
        description=(
            "Name of a Prefect KubernetesClusterConfig block (prefect-kubernetes) whose "
            "kubeconfig and context the flows use instead of kubeconfig or in_cluster. "
            "Default: none. The block holds its credentials in clear in the Prefect "
            "database: prefer the pod's service account (DESIGN 4.1, PREFECT.md)."
        ),
    )
    request_timeout_seconds: float = Field(
        default=60.0,
        gt=0,
        description=(
            "Timeout of one API request, in seconds. Default 60: a LIST page of 500 "
            "large objects takes seconds; a hung connection must not hang a run."
        ),
    )
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
    poll_seconds: float = Field(
        default=DEFAULT_POLL_SECONDS,
        gt=0,
        description=(
            "Period of the detection poll in seconds. Default 600: seed 000 polls discovery every 10 minutes."
        ),
    )
    settle_seconds: float = Field(
        default=60.0,
        ge=0,
        description=(
            "Delay in seconds after a storage version change is seen before a "
            "migration starts. Default 60: seed 004's 'loose guarantee' lets API "
            "servers take about a minute to agree."
        ),
    )
    stale_after_seconds: float | None = Field(
        default=None,
        gt=0,
        description=(
            "Age in seconds after which a StorageState heartbeat counts as stale and "
            "is reset. Default: two poll periods (DESIGN 4.3); a healthy heartbeat is "
            "already about one period old, so one period would reset healthy states."
        ),
    )
    retry_base_seconds: float = Field(
        default=600.0,
        gt=0,
        description=(
            "Delay before detection re-requests a failed migration, in seconds, doubled "
            "after each further failure (DESIGN 4.3: not every poll). Default 600: one poll period."
        ),
    )
    retry_max_seconds: float = Field(
        default=86400.0,
        gt=0,
        description="Upper bound of that delay, in seconds. Default 86400: a day.",
    )
    api_servers: list[str] = Field(
        default_factory=list,
        description=(
            "URLs of every API server, for HA agreement when the StorageVersion API is not "
            "served (DESIGN 4.4: one discovery poll per server), e.g. "
            "'https://10.0.0.1:6443,https://10.0.0.2:6443'; the kubeconfig's credentials are "
            "used for each. Default: none, which means the EndpointSlices of the `kubernetes` "
            "Service, and one server when they list one address."
        ),
    )
    server_config_timeout_seconds: float = Field(
        default=600.0,
        ge=0,
        description=(
            "How long a run that names an encryption key waits, before its first write, for every "
            "API server to report the same encryption configuration on /metrics (issue 19); past it "
            "the run fails and nothing is written. Default 600: a rolling restart of the servers."
        ),
    )
    server_config_poll_seconds: float = Field(
        default=5.0,
        gt=0,
        description="Seconds between two looks at the API servers' configurations while waiting. Default 5.",
    )
    database_url: str = Field(
        default="sqlite:///storage-migrator.db",
        description=(
            "SQLAlchemy URL of the ledger (DESIGN 4.9). Default: a SQLite file in the "
            "working directory; use postgresql+psycopg://... for a shared ledger."
        ),
    )
    ledger_retry_seconds: float = Field(
        default=300.0,
        ge=0,
        description=(
            "How long the ledger writer retries an unreachable database (in the background, "
            "with backoff) before it gives rows up and records the gap, in seconds. Default 300: "
            "a database restart or failover; a ledger outage never fails or blocks a migration (issue 12)."
        ),
    )
    ledger_flush_seconds: float = Field(
        default=10.0,
        ge=0,
        description=(
            "How long a run waits at its end, and a process at its exit, for queued ledger rows "
            "to be written, in seconds. Default 10: enough for a healthy database; rows still "
            "queued after that are lost with the process: `history` then lists the run as `unrecorded` "
            "(no start row) or `unknown` (no outcome row), from the cluster's requests."
        ),
    )
    ledger_queue_size: int = Field(
        default=10_000,
        ge=1,
        description=(
            "Ledger rows queued in memory at most while the database is slow or down; more are "
            "given up and recorded as a gap. Default 10000: a day of chunk rows of a large cluster."
        ),
    )
    prefect_ui_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("STORAGE_MIGRATOR_PREFECT_UI_URL", "PREFECT_UI_URL", "prefect_ui_url"),
        description=(
            "Base URL of the Prefect UI (e.g. http://127.0.0.1:4200), for the flow-run links "
            "`history` prints as <url>/runs/flow-run/<id>. Read from STORAGE_MIGRATOR_PREFECT_UI_URL "
            "or Prefect's own PREFECT_UI_URL environment variable (the CLI does not import Prefect). "
            "Default: none, no links."
        ),
    )
    include_resources: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description=(
            "Resources detection tracks and initialize requests, as '<resource>' (core) or "
            "'<resource>.<group>'; comma-separated or a JSON list. Default: empty, meaning all."
        ),
    )
    exclude_resources: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description=(
            "Resources never migrated, same form as include_resources. Applied after the include list. Default: empty."
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
    request_retention_seconds: float = Field(
        default=604800.0,
        gt=0,
        description=(
            "How long a finished StorageVersionMigration is kept after it finished "
            "(status.finishedAt), in seconds; then the detection poll deletes it. Default "
            "604800: 7 days (issue 11), long enough to look at after a weekend. Never "
            "deleted: pending or Running requests, the newest finished request of each "
            "resource (seed 003: the record that it ran), and a Failed request until a "
            "person acknowledges it with the annotation "
            '`migration.k8s.io/acknowledged: "true"` (kubectl annotate).'
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
    rate_limit_name: str = Field(
        default="storage-migrator-writes",
        min_length=1,
        description=(
            "Name of the Prefect global concurrency limit that budgets writes across "
            "all workers (created idempotently, acquired with strict=True)."
        ),
    )

    @field_validator("api_servers", mode="before")
    @classmethod
    def _split_servers(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            return json.loads(text) if text.startswith("[") else [p.strip() for p in text.split(",") if p.strip()]
        return value

    @field_validator("api_servers")
    @classmethod
    def _check_servers(cls, value: list[str]) -> list[str]:
        for url in value:
            if not url.startswith(("https://", "http://")):
                raise ValueError(f"{url!r} is not an API server URL: expected https://HOST:PORT")
        return [url.rstrip("/") for url in value]

    @field_validator("include_resources", "exclude_resources", mode="before")
    @classmethod
    def _split_resources(cls, value: Any) -> Any:
        """Accept 'a,b', '["a","b"]' or a list, so shells and JSON both work."""
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [part.strip() for part in text.split(",") if part.strip()]
        return value

    @field_validator("include_resources", "exclude_resources")
    @classmethod
    def _check_resources(cls, value: list[str]) -> list[str]:
        for item in value:
            if "/" in item or " " in item:
                raise ValueError(f"{item!r} is not '<resource>' or '<resource>.<group>' (e.g. 'deployments.apps')")
        return [item.lower() for item in value]

    @model_validator(mode="after")
    def _check_consistency(self) -> Settings:
        if self.backoff_max_seconds < self.backoff_base_seconds:
            raise ValueError(
                f"backoff_max_seconds ({self.backoff_max_seconds}) must be >= "
                f"backoff_base_seconds ({self.backoff_base_seconds})"
            )
        if self.in_cluster and self.kubeconfig is not None:
            raise ValueError("set either in_cluster=true or kubeconfig, not both")
        if self.cluster_config_block and (self.in_cluster or self.kubeconfig is not None):
            raise ValueError(
                f"cluster_config_block ({self.cluster_config_block!r}) names the credentials: "
                "unset STORAGE_MIGRATOR_KUBECONFIG and STORAGE_MIGRATOR_IN_CLUSTER, or unset the block"
            )
        if self.stale_after_seconds is not None and self.stale_after_seconds < self.poll_seconds:
            raise ValueError(
                f"stale_after_seconds ({self.stale_after_seconds}) must be >= poll_seconds "
                f"({self.poll_seconds}): a healthy heartbeat is up to one period old"
            )
        return self

    @classmethod
    def with_overrides(cls, **overrides: Any) -> Settings:
        """The environment's settings with the flow parameters that were given (None: not given).

        Flow parameters override settings (DESIGN 5); validation errors name the field.
        """
        values: dict[str, Any] = {k: v for k, v in overrides.items() if v is not None}
        return cls(**values)

    @property
    def stale_after(self) -> float:
        """The stale threshold in seconds: the explicit value or two poll periods."""
        if self.stale_after_seconds is not None:
            return self.stale_after_seconds
        return 2 * self.poll_seconds
