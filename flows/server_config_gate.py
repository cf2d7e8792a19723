"""The gate of every run that names an encryption key: no write until every API server runs one configuration.

Issue 19: a rotation started mid-way through a rolling change of the servers'
EncryptionConfiguration must not write (and so cannot "prove" anything) until
the last server has changed. The flow waits, showing which servers differ in its
log and as a table artifact, up to a timeout; then asks again at every later
moment (between chunks, before a verdict). The decisions are
`storage_migrator.agreement.server_configs.decide_config_gate`'s; this module only asks,
waits and shows. The override is never the default: it is a parameter of
`rotate-encryption-key` or an annotation on the request, and is logged as a
warning each time it lets a run through.
"""

from __future__ import annotations

import re
import time
from typing import Any

from prefect import get_run_logger
from prefect.artifacts import create_table_artifact
from pydantic import BaseModel, ConfigDict

from storage_migrator.agreement.server_configs import GATE_GO, ServerConfigs, decide_config_gate
from storage_migrator.agreement.storage_versions import AgreementMoment, AgreementVerdict
from storage_migrator.settings import Settings
from tasks.server_configs import observe_configs

__all__ = ["GateOutcome", "check_configs", "show_configs", "wait_for_one_config"]


class GateOutcome(BaseModel):
    """What the wait ended with: the servers as last seen, go or abort, and whether the override let it through."""

    model_config = ConfigDict(frozen=True)

    configs: ServerConfigs
    verdict: AgreementVerdict
    overridden: bool = False


def show_configs(configs: ServerConfigs, *, key: str, description: str) -> None:
    """The per-server table as an artifact (the Prefect UI's Artifacts tab)."""
    create_table_artifact(table=configs.rows(), key=re.sub(r"[^a-z0-9-]+", "-", f"server-configs-{key}".lower())[:100],
                          description=description)  # fmt: skip


def _override(configs: ServerConfigs, verdict: AgreementVerdict, *, what: str, key: str) -> GateOutcome:
    get_run_logger().warning(
        "%s: the API servers' check was OVERRIDDEN (skip_server_check): %s Going on anyway: an object written "
        "through a server with another write key stays under that key, and no proof covers it.",
        what, verdict.message,
    )  # fmt: skip
    show_configs(configs, key=key, description=f"{what}: check OVERRIDDEN by the operator")
    return GateOutcome(configs=configs, verdict=GATE_GO, overridden=True)


def wait_for_one_config(
    settings: Settings, *, what: str, key: str, override: bool = False, timeout: float | None = None
) -> GateOutcome:
    """Wait until every live API server reports the same configuration hash, at most `timeout` seconds
    (default: the settings'). `what` names the run for messages, `key` the artifact."""
    logger = get_run_logger()
    limit = settings.server_config_timeout_seconds if timeout is None else timeout
    deadline = time.monotonic() + limit
    shown: list[Any] | None = None
    while True:
        configs = observe_configs(settings)
        verdict = decide_config_gate(moment="start", baseline=None, now=configs)
        if verdict.action == "go":
            if shown is not None:
                show_configs(configs, key=key, description=f"{what}: every API server runs {configs.common_hash}")
            logger.info("%s: every API server (%d) runs encryption configuration %s", what, len(configs.servers),
                        configs.common_hash)  # fmt: skip
            return GateOutcome(configs=configs, verdict=verdict)
        if override:
            return _override(configs, verdict, what=what, key=key)
        seen = [(s.server_id, s.config_hash) for s in configs.servers]
        if seen != shown:  # log and show each new state once, not every poll
            shown = seen
            logger.warning("%s waits (up to %.0f s) before any write: %s", what, limit, verdict.message)
            for row in configs.rows():
                logger.warning("  API server %s: %s (heard %s via %s)", row["server"], row["config hash"],
                               row["heard"], row["via"])  # fmt: skip
            show_configs(configs, key=key, description=f"{what}: waiting for every API server to run one configuration")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            message = f"after waiting {limit:.0f} s: {verdict.message}"
            return GateOutcome(configs=configs, verdict=verdict.model_copy(update={"message": message}))
        time.sleep(min(settings.server_config_poll_seconds, remaining))


def check_configs(
    configs: ServerConfigs, *, moment: AgreementMoment, baseline: str | None, passes: int = 1, override: bool = False
) -> AgreementVerdict:
    """A later look (between chunks, before a verdict): the decision, with the override logged if it mattered."""
    verdict = decide_config_gate(moment=moment, baseline=baseline, now=configs, passes=passes)
    if verdict.action != "go" and override:
        get_run_logger().warning("the API servers' check was OVERRIDDEN (skip_server_check): %s", verdict.message)
        return GATE_GO
    return verdict
