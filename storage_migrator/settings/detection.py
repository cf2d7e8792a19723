"""The settings of the detection poll: period, settle delay, what it tracks and keeps (DESIGN 4.3, 4.8, 5)."""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import BaseModel, Field, field_validator
from pydantic_settings import NoDecode

DEFAULT_POLL_SECONDS = 600.0


class DetectionPollSettings(BaseModel):
    """The detection poll: its period, its settle delay, what it tracks and keeps (DESIGN 4.3, 4.8)."""

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
