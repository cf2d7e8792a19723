"""The settings of the ledger, and of the Prefect UI its history links to (DESIGN 4.9 and 5)."""

from __future__ import annotations

from pydantic import AliasChoices, BaseModel, Field


class LedgerSettings(BaseModel):
    """The ledger's database and writer, and the Prefect UI its history links to (DESIGN 4.9)."""

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
