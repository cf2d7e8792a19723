"""Seed 001's rules for one migration run, as a table (`decide_agreement`).

Seed 001 "Consuming the StorageVersion API": the storage migrator "starts
migration if the storageVersion.status.agreedEncodingVersion differs from the
storageState.status.persistedStorageVersionHashes, aborts ongoing migration if
the storageVersion.status.agreedEncodingVersion is empty." "Version Skew
Strategy": "the migrator can determine if the storage version has changed in
the middle of migration by comparing the RV of the storageVersion object before
and after the migration." As shipped, agreedEncodingVersion is
`status.commonEncodingVersion` (reference/storageversion-core-secrets.json).
"""

from __future__ import annotations

from typing import Any

import pytest

from storage_migrator.agreement.storage_versions import (
    MAX_PASSES,
    AgreementMoment,
    StorageVersionObservation,
    decide_agreement,
)


def sv(rv: str, *encodings: str) -> StorageVersionObservation:
    """core.configmaps at resourceVersion `rv`, servers apiserver-a, -b, ... encoding as given."""
    status: dict[str, Any] = {
        "storageVersions": [
            {"apiServerID": f"apiserver-{chr(ord('a') + i)}", "encodingVersion": e, "decodableVersions": [e]}
            for i, e in enumerate(encodings)
        ]
    }
    if len(set(encodings)) == 1:
        status["commonEncodingVersion"] = encodings[0]
    return StorageVersionObservation.from_object(
        {"metadata": {"name": "core.configmaps", "resourceVersion": rv}, "status": status}
    )


AGREED = sv("35", "v1", "v1", "v1")
SPLIT = sv("41", "v1", "v2", "v1")
MOVED = sv("52", "v2", "v2", "v2")
BACK = sv("60", "v1", "v1", "v1")  # rolled back and forward again: same version, new RV

CASES: list[
    tuple[str, AgreementMoment, StorageVersionObservation | None, StorageVersionObservation | None, int, str, str]
] = [
    # id, moment, baseline, now, passes, action, reason
    ("no StorageVersion (CRD, aggregated, API off): start", "start", None, None, 1, "go", ""),
    ("no StorageVersion: between chunks", "chunk", None, None, 1, "go", ""),
    ("no StorageVersion: end", "end", None, None, 1, "go", ""),
    ("agreed: start", "start", None, AGREED, 1, "go", ""),
    ("servers disagree: not started", "start", None, SPLIT, 1, "abort", "NoCommonEncodingVersion"),
    ("still agreed between chunks", "chunk", AGREED, AGREED, 1, "go", ""),
    ("agreement lost between chunks", "chunk", AGREED, SPLIT, 1, "abort", "CommonEncodingVersionLost"),
    ("RV moved between chunks: the end decides", "chunk", AGREED, MOVED, 1, "go", ""),
    ("agreement lost at the end", "end", AGREED, SPLIT, 1, "abort", "CommonEncodingVersionLost"),
    ("same RV at the end: Succeeded", "end", AGREED, AGREED, 1, "go", ""),
    ("RV moved at the end: pass again", "end", AGREED, MOVED, 1, "rerun", "StorageVersionChanged"),
    ("same version, new RV (rollback and back): pass again", "end", AGREED, BACK, 1, "rerun", "StorageVersionChanged"),
    ("second pass, RV steady since it began", "end", MOVED, MOVED, 2, "go", ""),
    ("RV moved in pass 2 of 3: pass again", "end", AGREED, MOVED, 2, "rerun", "StorageVersionChanged"),
    ("RV moved in the last pass", "end", AGREED, MOVED, MAX_PASSES, "abort", "StorageVersionUnstable"),
    ("object appeared during the pass", "end", None, AGREED, 1, "rerun", "StorageVersionChanged"),
    ("object vanished during the pass", "end", AGREED, None, 1, "rerun", "StorageVersionChanged"),
    ("object vanished between chunks", "chunk", AGREED, None, 1, "go", ""),
]


@pytest.mark.parametrize(
    ("moment", "baseline", "now", "passes", "action", "reason"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_decide_agreement(
    moment: AgreementMoment,
    baseline: StorageVersionObservation | None,
    now: StorageVersionObservation | None,
    passes: int,
    action: str,
    reason: str,
) -> None:
    verdict = decide_agreement(resource="configmaps", moment=moment, baseline=baseline, now=now, passes=passes)
    assert (verdict.action, verdict.reason) == (action, reason)
    assert bool(verdict.message) == (action != "go")


def test_not_started_names_each_server_and_what_to_do() -> None:
    verdict = decide_agreement(resource="configmaps", moment="start", baseline=None, now=SPLIT)
    assert verdict.message.startswith(
        "API servers disagree on the encoding version of configmaps (apiserver-a: v1, apiserver-b: v2, apiserver-c: v1)"
        ": not started, nothing was written."
    )
    assert "Detection requests its migrations again once they agree" in verdict.message
    assert "re-apply" in verdict.message


def test_stopped_names_each_server_and_keeps_the_checkpoint() -> None:
    verdict = decide_agreement(resource="configmaps", moment="chunk", baseline=AGREED, now=SPLIT)
    assert verdict.message.startswith(
        "API servers disagree on the encoding version of configmaps (apiserver-a: v1, apiserver-b: v2, apiserver-c: v1)"
        ": stopped; the checkpoint is kept."
    )


def test_rerun_says_what_moved_and_which_pass_comes() -> None:
    verdict = decide_agreement(resource="configmaps", moment="end", baseline=AGREED, now=MOVED)
    assert verdict.message == (
        "the storage version of configmaps changed while the migration ran (StorageVersion core.configmaps: "
        "resourceVersion 35 -> resourceVersion 52, apiserver-a: v2, apiserver-b: v2, apiserver-c: v2): "
        "migrating again from the beginning (pass 2 of at most 3)."
    )


def test_unstable_counts_the_passes() -> None:
    verdict = decide_agreement(resource="configmaps", moment="end", baseline=MOVED, now=BACK, passes=3)
    assert "in each of 3 passes: stopped" in verdict.message
