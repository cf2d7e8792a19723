"""The one settings model of the migrator (DESIGN 5).

Design decision: every knob is read from the environment with the prefix
``STORAGE_MIGRATOR_`` by pydantic-settings, validated at start-up with a message
that names the variable, and documented on the field itself (unit, default,
why). Flow parameters override these values; nothing else reads the
environment.
"""

from __future__ import annotations

from typing import Any

from pydantic import model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from storage_migrator.settings.agreement import AgreementSettings
from storage_migrator.settings.connection import ConnectionSettings
from storage_migrator.settings.detection import DEFAULT_POLL_SECONDS, DetectionPollSettings
from storage_migrator.settings.engine import EngineSetting, EngineSettings
from storage_migrator.settings.ledger import LedgerSettings
from storage_migrator.settings.migration import MigrationSettings

__all__ = [
    "DEFAULT_POLL_SECONDS",
    "AgreementSettings",
    "ConnectionSettings",
    "DetectionPollSettings",
    "EngineSetting",
    "EngineSettings",
    "LedgerSettings",
    "MigrationSettings",
    "Settings",
]


# Pydantic lists the fields of the last base first: connection, migration, detection ...
class Settings(
    EngineSettings,
    LedgerSettings,
    AgreementSettings,
    DetectionPollSettings,
    MigrationSettings,
    ConnectionSettings,
    BaseSettings,
):
    """Settings of the storage version migrator, from ``STORAGE_MIGRATOR_*`` variables.

    One flat model (the variables' names, the flows' overrides and ``settings.X`` stay
    as they were) composed of one model per concern; the checks across concerns are here.
    """

    model_config = SettingsConfigDict(
        env_prefix="STORAGE_MIGRATOR_",
        extra="ignore",
        validate_default=True,
    )

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
        if self.cluster_config_block and self.cluster and self.cluster != self.cluster_config_block:
            raise ValueError(
                f"cluster ({self.cluster!r}) and cluster_config_block ({self.cluster_config_block!r}) name two "
                "clusters: a pull-mode worker (STORAGE_MIGRATOR_CLUSTER) uses its own credentials, not a block"
            )
        if self.cluster_config_block and self.cluster is None:
            self.cluster = self.cluster_config_block  # push mode: the block's name is the cluster's
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
