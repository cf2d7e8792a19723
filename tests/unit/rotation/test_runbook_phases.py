"""The guided key rotation's decisions (issue 19 item 3), as tables.

Issue 19: "Then it waits until every server's hash has moved to one new common value
before it goes on. 'Done' clicked too early is never taken as done." "It says in
words, and with an EncryptionConfiguration snippet without secrets, what to change
on each server." Seed 003: data is migrated "after choosing a new write key and
before removing an old read key".
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from storage_migrator.agreement.server_configs import ConfigSample, IdentityLease, id_hash, server_configs
from storage_migrator.rotation.runbook import (
    ACTIVE_NAME,
    OPERATOR_PHASES,
    PHASES,
    ActiveRunbook,
    RunbookRecord,
    blocking_runbook,
    instructions,
    next_phase,
    phase_reached,
    record_name,
)

NOW = datetime(2026, 11, 26, 9, 0, tzinfo=UTC)
H0, H1 = "sha256:" + "0" * 64, "sha256:" + "1" * 64


def configs(*hashes: str | None) -> object:
    leases = [IdentityLease(name=f"apiserver-{i}", renew_time=NOW - timedelta(seconds=1), duration_seconds=3600)
              for i in range(len(hashes))]  # fmt: skip
    samples = [ConfigSample(id_hash=id_hash(f"apiserver-{i}"), config_hash=h, via="x", heard_at=NOW)
               for i, h in enumerate(hashes) if h]  # fmt: skip
    return server_configs(leases, samples, now=NOW)


def test_seed_003s_order_with_the_proof_between_the_write_key_and_the_removal() -> None:
    assert PHASES == ("add-read-key", "make-write-key", "reencrypt", "remove-old-key", "final-check", "done")
    assert {"add-read-key", "make-write-key", "remove-old-key"} == OPERATOR_PHASES
    assert [next_phase(p) for p in PHASES] == [*PHASES[1:], "done"]


REACHED = [
    # (hashes now, baseline, reached, why contains)
    ((H1, H1, H1), H0, True, ""),
    ((H0, H0, H0), H0, False, "nothing changed yet"),  # "done" clicked before any change
    ((H1, H0, H1), H0, False, "do not all run one configuration"),  # mid-way through the rolling change
    ((H1, None, H1), H0, False, "unknown is never done"),
    ((), H0, False, "cannot be told apart"),
    ((H1, H1), None, True, ""),  # the phase began while servers differed: any one hash is progress
]


@pytest.mark.parametrize(("hashes", "baseline", "reached", "why"), REACHED)
def test_a_phase_is_reached_only_when_every_server_shows_one_new_hash(
    hashes: tuple[str | None, ...], baseline: str | None, reached: bool, why: str
) -> None:
    check = phase_reached(configs(*hashes), baseline=baseline)  # type: ignore[arg-type]
    assert check.reached is reached and why in check.why


@pytest.mark.parametrize("phase", sorted(OPERATOR_PHASES))
def test_each_form_names_the_keys_shows_a_snippet_and_never_a_secret(phase: str) -> None:
    record = RunbookRecord(key="key2", old_key="key1", resources=["secrets", "configmaps"])
    text = instructions(phase, record)  # type: ignore[arg-type]
    assert "key2" in text and "kind: EncryptionConfiguration" in text and "resources: [secrets, configmaps]" in text
    assert "<key2's secret>" in text and "every** API server" in text
    assert "Not yet" not in text
    assert instructions(phase, record, not_yet="server b differs").startswith("**Not yet:** server b differs")  # type: ignore[arg-type]


def test_the_write_key_is_first_only_from_phase_2_and_the_old_key_goes_in_phase_4() -> None:
    record = RunbookRecord(key="key2", old_key="key1", resources=["secrets"])
    read = instructions("add-read-key", record)
    assert read.index("name: key1") < read.index("name: key2")
    write = instructions("make-write-key", record)
    assert write.index("name: key2") < write.index("name: key1")
    assert "name: key1" not in instructions("remove-old-key", record)


def test_the_record_is_a_prefect_variable_name() -> None:
    assert record_name("v1.key-2") == "storage-migrator-runbook-v1_key-2"


ME, OTHER = "11111111-1111-1111-1111-111111111111", "22222222-2222-2222-2222-222222222222"


@pytest.mark.parametrize(
    ("holder", "state", "final", "blocked"),
    [
        (None, None, False, False),  # nobody holds it
        (ME, "Running", False, False),  # this very run (resumed in place)
        (OTHER, None, False, False),  # the holder's run is gone from the server
        (OTHER, "Crashed", True, False),  # it ended: its place is free
        (OTHER, "Completed", True, False),
        (OTHER, "Paused", False, True),  # waiting for its operator: still in progress
        (OTHER, "Running", False, True),
        (OTHER, "Scheduled", False, True),
    ],
)
def test_one_runbook_at_a_time(holder: str | None, state: str | None, final: bool, blocked: bool) -> None:
    """Each runbook takes "every server moved off the phase's starting configuration" as its
    own change, so a second one in progress would take the first one's edit for its own."""
    active = None if holder is None else ActiveRunbook(run_id=holder, key="key2")
    why = blocking_runbook(active, me=ME, holder_state=state, holder_final=final)
    assert (why is not None) == blocked
    if why:
        assert OTHER in why and "key2" in why and state in why and ACTIVE_NAME in why
