"""The whole key-rotation runbook as phases, and when a phase is reached (issue 19 item 3).

Design decision: seed 003's order (the new key readable everywhere, then the write
key everywhere, then re-encrypt, then the old key removed) is the one Gardener's
phases and k3s's ``secrets-encrypt prepare/rotate/reencrypt`` follow. The three
phases a person carries out (editing the EncryptionConfiguration of every API
server) are not taken on their word: a phase is reached only once every live API
server reports one configuration hash on /metrics, other than the one the phase
began with (:func:`phase_reached`). "Done" clicked too early is never taken as done.
The migrator never sees key material: the snippets it shows carry placeholders.

Pure functions and models; the flow ``key-rotation-runbook`` pauses, waits and
records the phase reached, so that a crashed or cancelled run resumes at it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from storage_migrator.agreement.server_configs import ServerConfigs
from storage_migrator.fleet.names import block_of

__all__ = [
    "ACTIVE_NAME",
    "OPERATOR_PHASES",
    "PHASES",
    "ActiveRunbook",
    "Phase",
    "PhaseCheck",
    "RunbookRecord",
    "active_name",
    "blocking_runbook",
    "instructions",
    "next_phase",
    "phase_reached",
    "record_name",
]

Phase = Literal["add-read-key", "make-write-key", "reencrypt", "remove-old-key", "final-check", "done"]
PHASES: Final[tuple[Phase, ...]] = (
    "add-read-key", "make-write-key", "reencrypt", "remove-old-key", "final-check", "done",
)  # fmt: skip
#: The phases a person carries out on every API server (the flow pauses for each).
OPERATOR_PHASES: Final[frozenset[Phase]] = frozenset({"add-read-key", "make-write-key", "remove-old-key"})

_TITLES: Final[dict[Phase, str]] = {
    "add-read-key": "1 of 5: add the new key as a read key on every API server",
    "make-write-key": "2 of 5: make the new key the write key on every API server",
    "reencrypt": "3 of 5: re-encrypt every object and prove it",
    "remove-old-key": "4 of 5: remove the old key from every API server",
    "final-check": "5 of 5: read every object through every API server",
    "done": "done",
}


#: The Prefect Variable naming the runbook run in progress: one at a time, because each
#: takes "every server moved off the phase's starting configuration" as its own change.
ACTIVE_NAME: Final = "storage-migrator-runbook-active"


class ActiveRunbook(BaseModel):
    """The runbook run that holds :data:`ACTIVE_NAME`."""

    run_id: str
    key: str


def active_name(cluster: str | None) -> str:
    """The claim of one cluster (issue 20): the rotations of two clusters never see each other's changes,
    so each has its own; named ones as `storage-migrator-runbook_<cluster>_active` (block names have no `_`)."""
    block = block_of(cluster)
    return ACTIVE_NAME if block is None else f"storage-migrator-runbook_{block}_active"


def blocking_runbook(
    active: ActiveRunbook | None, *, me: str, holder_state: str | None, holder_final: bool,
    variable: str = ACTIVE_NAME,
) -> str | None:  # fmt: skip
    """Why this run may not start (None: it may): another runbook run holds the claim and has not
    ended. A holder that is gone (`holder_state` None) or in a final state no longer counts."""
    if active is None or active.run_id == me or holder_state is None or holder_final:
        return None
    return (
        f"another key-rotation runbook is in progress: flow run {active.run_id} (key {active.key}), "
        f"{holder_state}. Two at once would each take the other's configuration change for its own: "
        "finish or cancel that run first. If it is dead (its process killed and its state never set), "
        f"mark it Crashed, or delete the Prefect Variable {variable}."
    )


def next_phase(phase: Phase) -> Phase:
    return PHASES[min(PHASES.index(phase) + 1, len(PHASES) - 1)]


def record_name(key: str, cluster: str | None = None) -> str:
    """The Prefect Variable that holds a runbook's record (names: letters, digits, '-', '_'); a named
    cluster's as `storage-migrator-runbook_<cluster>_<key>`, which no default cluster's name can be."""
    block = block_of(cluster)
    prefix = "storage-migrator-runbook-" if block is None else f"storage-migrator-runbook_{block}_"
    return prefix + "".join(c if c.isalnum() or c in "-_" else "_" for c in key)[:200]


class RunbookRecord(BaseModel):
    """Where a runbook stands: the phase to carry out next and the configuration each reached phase left."""

    model_config = ConfigDict(extra="ignore")

    key: str
    old_key: str
    resources: list[str]
    phase: Phase = "add-read-key"
    #: The configuration hash every server ran when the current operator phase began (None: no one hash).
    baseline: str | None = None
    reached: dict[str, str] = Field(default_factory=dict, description="Phase -> the hash every server ran after it.")


class PhaseCheck(BaseModel):
    """Whether an operator phase is reached, and if not, what a person reads."""

    model_config = ConfigDict(frozen=True)

    reached: bool
    config_hash: str | None = None
    why: str = ""


def phase_reached(configs: ServerConfigs, *, baseline: str | None) -> PhaseCheck:
    """Reached when every live server reports one hash, and it is not the one the phase began with."""
    common = configs.common_hash
    if common is None:
        unknown = [s.server_id for s in configs.servers if s.config_hash is None]
        if not configs.servers:
            why = "no live API server identity Lease in kube-system: the servers cannot be told apart"
        elif unknown:
            why = f"API server(s) {', '.join(unknown)} reported no configuration (unknown is never done)"
        else:
            why = f"the API servers do not all run one configuration yet ({configs.describe()})"
        return PhaseCheck(reached=False, why=why)
    if common == baseline:
        return PhaseCheck(
            reached=False, config_hash=common,
            why=f"every API server still runs {common}, the configuration this phase began with: nothing changed yet",
        )  # fmt: skip
    return PhaseCheck(reached=True, config_hash=common)


def _snippet(resources: Sequence[str], keys: Sequence[tuple[str, str]]) -> str:
    listed = "".join(f"            - name: {name}   # {note}\n              secret: <{name}'s secret>\n"
                     for name, note in keys)  # fmt: skip
    return (
        "```yaml\napiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n"
        f"  - resources: [{', '.join(resources)}]\n    providers:\n      - aescbc:   # or your provider\n"
        f"          keys:\n{listed}      - identity: {{}}   # if you had it, keep it last\n```"
    )


def instructions(phase: Phase, record: RunbookRecord, *, not_yet: str = "") -> str:
    """What the pause's form says (Markdown, shown in the Prefect UI): the change on each server,
    a snippet without secrets, and how the flow will know it is done."""
    key, old = record.key, record.old_key
    steps: dict[Phase, tuple[str, list[tuple[str, str]]]] = {
        "add-read-key": (
            f"Add `{key}` to the keys of your provider, **after** `{old}`, so that `{old}` still writes and `{key}` "
            f"can be read. Generate its secret yourself (`head -c 32 /dev/urandom | base64`); the migrator never "
            "sees it.",
            [(old, "still the write key (first)"), (key, "NEW: read key for now")],
        ),
        "make-write-key": (
            f"Move `{key}` **first** in the list: it becomes the write key. Keep `{old}` as a read key.",
            [(key, "now the write key (first)"), (old, "still readable")],
        ),
        "remove-old-key": (
            f"Every object is now stored under `{key}` (phase 3 proved it). Remove `{old}` from the list.",
            [(key, "the write key, alone")],
        ),
    }
    text, keys = steps.get(phase, ("", []))
    head = f"**Not yet:** {not_yet}. Finish the change, then submit again.\n\n" if not_yet else ""
    return (
        f"{head}### Key rotation to `{key}`, phase {_TITLES[phase]}\n\n{text}\n\n{_snippet(record.resources, keys)}\n\n"
        "Do it on **every** API server, one at a time, and restart or reload each one "
        "(`--encryption-provider-config-automatic-reload`). Then tick **done** and submit. The flow goes on only "
        "once every API server reports one new configuration hash on /metrics; until then it asks again."
    )
