"""`key-rotation-runbook`: the whole key rotation, guided, with every phase gated on every API server.

Issue 19 item 3. Seed 003's order as five phases (storage_migrator/rotation/runbook.py):
1. the new key added as a read key everywhere; 2. made the write key everywhere;
3. re-encrypt and prove (`rotate-encryption-key`, gated on every server);
4. the old key removed everywhere; 5. the rotation proven again under the configuration
every server runs now (issue 39: the same path as any rerun; it writes nothing that is
not due, and reports objects lost with the old key), then every object read through
every server. A run of a runbook already done does phase 5 again.

For phases 1, 2 and 4 the run pauses with a Prefect input form (the UI shows it with
what to change on each server and an EncryptionConfiguration snippet without
secrets). A submitted "done" is checked: the run goes on only once every live API
server reports one configuration hash on /metrics, other than the one the phase
began with; otherwise it says what is missing and asks again. The phase reached
is recorded in a Prefect Variable (`storage-migrator-runbook-<key>`), so a run
that crashed or was cancelled is resumed at its phase by running the same
deployment again. `rotate-encryption-key` called alone keeps working unattended.

    prefect deployment run 'key-rotation-runbook/key-rotation-runbook' -p key=key2 -p old_key=key1
"""

from __future__ import annotations

import time
from typing import Any
from uuid import UUID

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import State
from prefect.context import FlowRunContext
from prefect.exceptions import ObjectNotFound
from prefect.flow_runs import pause_flow_run
from prefect.input import RunInput
from prefect.states import Failed
from prefect.variables import Variable
from pydantic import BaseModel, Field

from flows.cluster_scope import cluster_settings, entered_cluster
from flows.rotate_encryption_key import DEFAULT_RESOURCES, rotate_encryption_key
from flows.server_config_gate import show_configs
from storage_migrator.rotation.decisions import check_key_name
from storage_migrator.rotation.runbook import (
    OPERATOR_PHASES,
    ActiveRunbook,
    PhaseCheck,
    RunbookRecord,
    active_name,
    blocking_runbook,
    instructions,
    next_phase,
    phase_reached,
    record_name,
)
from storage_migrator.settings import Settings
from tasks.dispatching import resolve_targets
from tasks.reading_check import ReadCheck, read_through_every_server
from tasks.server_configs import observe_configs

__all__ = ["PhaseDone", "RunbookSummary", "key_rotation_runbook"]


class PhaseDone(RunInput):
    """The form of each operator phase (the Prefect UI renders it under the instructions)."""

    done: bool = Field(default=False, title="Done on every API server",
                       description="Tick once every API server runs the changed EncryptionConfiguration.")  # fmt: skip


class RunbookSummary(BaseModel):
    key: str
    reached: dict[str, str] = Field(description="Phase -> the configuration hash every API server ran after it.")
    message: str


def _load(key: str, old_key: str, resources: list[str], cluster: str | None) -> RunbookRecord:
    saved = Variable.get(record_name(key, cluster))
    if isinstance(saved, dict):
        record = RunbookRecord.model_validate(saved)
        if record.old_key != old_key or record.resources != resources:
            raise ValueError(
                f"a runbook for key {key} is recorded with old key {record.old_key} and resources "
                f"{record.resources} (Prefect Variable {record_name(key, cluster)}); run it with those, or delete the "
                "variable to start over"
            )
        return record
    return RunbookRecord(key=key, old_key=old_key, resources=resources)


def _save(record: RunbookRecord, cluster: str | None) -> None:
    Variable.set(record_name(record.key, cluster), record.model_dump(mode="json"), overwrite=True)


def _this_run() -> str:
    context = FlowRunContext.get()
    if context is None or context.flow_run is None:
        raise RuntimeError("the runbook claims its place from inside its flow run")
    return str(context.flow_run.id)


def _claim(key: str, cluster: str | None) -> str | None:
    """Hold the cluster's claim (`active_name`) for this run; why not, if another live runbook run holds it.

    Best effort: a Variable has no compare-and-set, so two runs started in the same
    instant can both pass. Not a deployment concurrency limit: Prefect releases that
    slot when the run pauses, then crashes the paused run (docs/key-rotation.md)."""
    me = _this_run()
    variable = active_name(cluster)
    held = Variable.get(variable)
    active = ActiveRunbook.model_validate(held) if isinstance(held, dict) else None
    state, final = None, False
    if active is not None and active.run_id != me:
        with get_client(sync_client=True) as client:
            try:
                holder = client.read_flow_run(UUID(active.run_id)).state
            except (ObjectNotFound, ValueError):
                holder = None
        if holder is not None:
            state, final = holder.name, holder.is_final()
    why = blocking_runbook(active, me=me, holder_state=state, holder_final=final, variable=variable)
    if why is None:
        Variable.set(variable, ActiveRunbook(run_id=me, key=key).model_dump(), overwrite=True)
    return why


def _release(cluster: str | None) -> None:
    held = Variable.get(active_name(cluster))
    if isinstance(held, dict) and held.get("run_id") == _this_run():
        Variable.unset(active_name(cluster))


def _wait_reached(settings: Settings, baseline: str | None, seconds: float) -> PhaseCheck:
    """After a "done": servers restarting one by one may take a while to all report the new hash."""
    deadline = time.monotonic() + seconds
    while True:
        check = phase_reached(observe_configs(settings), baseline=baseline)
        if check.reached or time.monotonic() >= deadline:
            return check
        time.sleep(settings.server_config_poll_seconds)


def _operator_phase(settings: Settings, record: RunbookRecord, *, pause_timeout: int, settle_seconds: float) -> None:
    """Pause until a person says the change is done everywhere and every server shows it."""
    logger = get_run_logger()
    phase = record.phase
    if record.baseline is None:  # when the phase begins; a resumed run keeps it
        record.baseline = observe_configs(settings).common_hash
        _save(record, settings.cluster)
    not_yet = ""
    while True:
        form = PhaseDone.with_initial_data(description=instructions(phase, record, not_yet=not_yet))
        answer = pause_flow_run(wait_for_input=form, timeout=pause_timeout,
                                poll_interval=max(1, int(settings.server_config_poll_seconds)))  # fmt: skip
        if not answer.done:
            not_yet = "the form was submitted without ticking done"
            continue
        check = _wait_reached(settings, record.baseline, settle_seconds)
        if check.reached and check.config_hash:
            record.reached[phase] = check.config_hash
            logger.info("phase %s reached: every API server runs %s", phase, check.config_hash)
            return
        logger.warning("phase %s: done was submitted, but %s; asking again", phase, check.why)
        show_configs(observe_configs(settings), key=f"runbook-{record.key}", description=f"{phase}: not yet")
        not_yet = check.why


def _proof_again(record: RunbookRecord, reencrypt: dict[str, Any]) -> State[Any] | None:
    """Issue 39: the rotation run again, as a rerun or a schedule would run it: proven again under the
    configuration every API server runs now (the old key gone), writing nothing that is not due."""
    state = rotate_encryption_key(key=record.key, resources=record.resources, return_state=True, **reencrypt)
    if state.is_completed():
        return None
    return Failed(message=f"phase 5: the rotation to {record.key}, run again under the configuration every API "
                          f"server runs now ({record.old_key} removed in phase 4), is not proven: {state.message}")  # fmt: skip


def _final_check(settings: Settings, record: RunbookRecord, reencrypt: dict[str, Any]) -> State[Any] | None:
    """Phase 5 (and a run of a finished runbook): the proof again, then every object read through every server."""
    failed = _proof_again(record, reencrypt)
    if failed is not None:
        return failed
    checks = read_through_every_server(settings, resolve_targets(settings, record.resources))
    create_table_artifact(table=[_row(c) for c in checks], key=f"runbook-{record.key}-read-check"[:100],
                          description="phase 5: every object read through every API server")  # fmt: skip
    bad = [c for c in checks if c.error]
    if bad:
        named = "; ".join(f"{c.resource} through {c.server}: {c.error}"
                          + (f" ({c.unreadable.describe()} cannot be read: {c.unreadable.named()})"
                             if c.unreadable else "") for c in bad)  # fmt: skip
        return Failed(message=f"phase 5: not every object reads through every API server ({named}). Put the old "
                              f"key {record.old_key} back as a read key on every server, then run this again.")  # fmt: skip
    return None


def _row(check: ReadCheck) -> dict[str, Any]:
    row = check.model_dump(exclude={"unreadable"})
    row["unreadable"] = check.unreadable.describe() if check.unreadable else "-"
    return row


def _run_phases(
    settings: Settings, record: RunbookRecord, *, pause_timeout: int, settle_seconds: float, reencrypt: dict[str, Any]
) -> State[Any] | None:
    """Every phase from the one recorded to done; a Failed state if one cannot be finished. A runbook
    already done checks again (issue 39: a rerun after the old key is gone proves again): phase 5 once more."""
    logger = get_run_logger()
    if record.phase == "done":
        logger.info("key rotation %s -> %s is done: checking again under what every API server runs now",
                    record.old_key, record.key)  # fmt: skip
        return _final_check(settings, record, reencrypt)
    while record.phase != "done":
        phase = record.phase
        if phase in OPERATOR_PHASES:
            _operator_phase(settings, record, pause_timeout=pause_timeout, settle_seconds=settle_seconds)
        elif phase == "reencrypt":
            state = rotate_encryption_key(key=record.key, resources=record.resources, return_state=True, **reencrypt)
            if not state.is_completed():
                return Failed(message=f"phase 3 (re-encrypt and prove): {state.message} Run this runbook again "
                                      "to resume at phase 3.")  # fmt: skip
            record.reached[phase] = observe_configs(settings).common_hash or ""
        else:
            failed = _final_check(settings, record, reencrypt)
            if failed is not None:
                return failed
            record.reached[phase] = observe_configs(settings).common_hash or ""
        record.phase, record.baseline = next_phase(phase), None
        _save(record, settings.cluster)
        logger.info("phase %s done; next: %s", phase, record.phase)
    return None


def _done_message(record: RunbookRecord, now: str | None) -> str:
    """What a finished runbook says, about the configuration the servers run now (issue 39)."""
    removed = record.reached.get("remove-old-key")
    gone = (f"{record.old_key} is gone from every API server (they run {now}, the configuration phase 4 left)"
            if removed and removed == now else
            f"{record.old_key} was removed in phase 4 (configuration {removed or 'unknown'}); every API server runs "
            f"{now or 'no one configuration'} now")  # fmt: skip
    return (
        f"key rotation {record.old_key} -> {record.key} done: {gone}; every object of "
        f"{', '.join(record.resources)} is stored under {record.key} and reads back under that configuration "
        "(the rotation proved again, writing nothing that was not due), and every object reads through every "
        "API server."
    )


@flow(name="key-rotation-runbook", flow_run_name="key-rotation-runbook-{key}", persist_result=False,
      log_prints=False)  # fmt: skip
def key_rotation_runbook(
    key: str,
    old_key: str,
    resources: list[str] | None = None,
    pause_timeout: int = 86400,
    settle_seconds: float = 120.0,
    server_config_timeout: float | None = None,
    chunk_size: int | None = None,
    write_rate_per_second: float | None = None,
    write_concurrency: int | None = None,
    max_parallel: int | None = None,
    kubeconfig: str | None = None,
    context: str | None = None,
    cluster: str | None = None,
) -> RunbookSummary | State[Any]:
    """Rotate from `old_key` to `key` (their names in the EncryptionConfiguration) on every
    API server, pausing for each change a person makes; `pause_timeout` seconds per pause,
    `settle_seconds` for every server to show a change after "done". `cluster` names the
    cluster's KubernetesClusterConfig block (issue 20; each cluster has its own runbook record and claim)."""
    logger = get_run_logger()
    check_key_name(key)
    record = _load(key, old_key, list(DEFAULT_RESOURCES if resources is None else resources), cluster)
    settings = cluster_settings(cluster, kubeconfig=kubeconfig, context=context,
                                server_config_timeout_seconds=server_config_timeout)  # fmt: skip
    with entered_cluster(settings):  # issue 20: the cluster is the one its name recorded
        busy = _claim(key, settings.cluster)
        if busy is not None:
            return Failed(message=busy)
        try:
            logger.info("key rotation %s -> %s: at phase %s", old_key, key, record.phase)
            failed = _run_phases(settings, record, pause_timeout=pause_timeout, settle_seconds=settle_seconds,
                                 reencrypt={"chunk_size": chunk_size, "write_rate_per_second": write_rate_per_second,
                                            "max_parallel": max_parallel, "write_concurrency": write_concurrency,
                                            "kubeconfig": kubeconfig, "context": context, "cluster": cluster,
                                            "server_config_timeout": server_config_timeout})  # fmt: skip
        finally:
            _release(settings.cluster)
        if failed is not None:
            return failed
        message = _done_message(record, observe_configs(settings).common_hash)
        logger.info("%s", message)
        return RunbookSummary(key=key, reached=record.reached, message=message)
