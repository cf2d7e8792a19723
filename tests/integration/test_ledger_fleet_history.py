"""One ledger, two clusters: `history` and the metrics keep them apart (issue 20).

Rows of clusters `a` and `b` written through the real writer into one SQLite
ledger; `history --cluster a` shows a's runs only, `--all-clusters` both with a
CLUSTER column, and the metrics served by `storage-migrator metrics
--all-clusters` carry `cluster="a"` and `cluster="b"` on every series, each
cluster's numbers its own. The cross-check against the clusters' requests is
left out (`--no-requests`): this is about what the ledger holds.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from storage_migrator.cli import main
from storage_migrator.ledger.recorder import RunRecorder
from storage_migrator.ledger.records import PollRecord
from storage_migrator.ledger.writer import writer_for
from storage_migrator.migration.chunk_terms import ChunkResult
from storage_migrator.models import MigrationProgress
from storage_migrator.operations.metrics import MigratorCollector

REPO = Path(__file__).resolve().parents[2]
#: cluster -> (resource, objects rewritten) of its one run.
RUNS = {"a": ("secrets", 3), "b": ("configmaps", 5)}


@pytest.fixture
def fleet_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A ledger with one finished run and one poll of each of clusters a and b."""
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    monkeypatch.setenv("STORAGE_MIGRATOR_DATABASE_URL", url)
    writer = writer_for(url)
    for cluster, (resource, rewritten) in RUNS.items():
        rec = RunRecorder.begin(writer, migration=f"{resource}-{cluster}", migration_uid=f"uid-{cluster}",
                                resource=resource, version="v1", target_hash="h2", encryption_key=None,
                                requested_by="detection", flow_run_id=None, cluster=cluster)  # fmt: skip
        rec.started(resumed=False)
        done = MigrationProgress(listed=rewritten, rewritten=rewritten, chunks=1)
        rec.chunk(ChunkResult(token_in=None, token_out=None, listed=rewritten, rewritten=rewritten),
                  duration_seconds=0.1, progress=done)  # fmt: skip
        rec.ended("succeeded", done)
        now = datetime.now(UTC)
        writer.submit(PollRecord(cluster=cluster, started_at=now, finished_at=now, duration_seconds=len(cluster),
                                 resources_seen=1, changes=0, requests_made=0))  # fmt: skip
    assert writer.flush(30)
    return url


def _history(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict[str, Any]]:
    capsys.readouterr()
    assert main(["history", "--no-requests", *args, "-o", "json"]) == 0
    rows: list[dict[str, Any]] = json.loads(capsys.readouterr().out)
    return rows


def test_history_shows_one_cluster_or_every_cluster_with_its_name(
    fleet_ledger: str, capsys: pytest.CaptureFixture[str]
) -> None:
    only_a = _history(capsys, "--cluster", "a")
    assert [(r["cluster"], r["resource"], r["rewritten"]) for r in only_a] == [("a", "secrets", 3)]
    assert _history(capsys) == []  # without an option: the default cluster, which ran nothing here
    every = _history(capsys, "--all-clusters")
    assert sorted((r["cluster"], r["resource"]) for r in every) == [("a", "secrets"), ("b", "configmaps")]

    assert main(["history", "--no-requests", "--all-clusters"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["CLUSTER", "STARTED"]
    assert sorted((line.split()[0], line.split()[2]) for line in lines[1:]) == [("a", "secrets"), ("b", "configmaps")]
    assert main(["history", "--no-requests", "--cluster", "a"]) == 0
    assert capsys.readouterr().out.splitlines()[0].split()[0] == "STARTED"  # one cluster: no CLUSTER column


def test_cluster_and_all_clusters_together_is_a_usage_error(
    fleet_ledger: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["history", "--cluster", "a", "--all-clusters"]) == 2
    assert "--all-clusters" in capsys.readouterr().err
    assert main(["history", "--cluster", "Not_A_Block"]) == 2


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int, proc: subprocess.Popen[bytes]) -> str:
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
                return str(response.read().decode())
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_every_series_served_for_the_fleet_names_its_cluster(fleet_ledger: str, tmp_path: Path) -> None:
    port = _free_port()
    log = tmp_path / "metrics.log"
    with log.open("wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "storage_migrator.cli", "metrics", "--all-clusters",
                                 "--no-requests", "--port", str(port), "--address", "127.0.0.1"], cwd=REPO,
                                env={**os.environ, "STORAGE_MIGRATOR_DATABASE_URL": fleet_ledger},
                                stdout=subprocess.DEVNULL, stderr=err)  # fmt: skip
        try:
            samples = _samples(_scrape(port, proc))
        finally:
            proc.terminate()
            assert proc.wait(timeout=30) == 0, log.read_text()

    ours = {name: labels for name, labels in samples if name.startswith("storage_migrator_")}
    assert ours and all("cluster" in dict(labels) for labels in ours.values())
    assert {dict(labels)["cluster"] for _, labels in samples} == {"a", "b"}
    for cluster, (resource, rewritten) in RUNS.items():
        here = ("cluster", cluster)
        assert samples[("storage_migrator_objects_total", (here, ("outcome", "rewritten"),
                                                           ("resource", resource)))] == rewritten  # fmt: skip
        assert samples[("storage_migrator_migration_duration_seconds_count", (here,))] == 1
        assert samples[("storage_migrator_poll_duration_seconds", (here,))] == len(cluster)
        assert samples[("storage_migrator_up", (here, ("source", "ledger")))] == 1
    assert ("storage_migrator_objects_total", (("cluster", "a"), ("outcome", "rewritten"),
                                               ("resource", "configmaps"))) not in samples  # fmt: skip


def test_one_clusters_metrics_are_that_clusters_only(fleet_ledger: str) -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MigratorCollector(fleet_ledger, clusters=["b"]))
    samples = _samples(generate_latest(registry).decode())
    assert {dict(labels)["cluster"] for name, labels in samples if name.startswith("storage_migrator_")} == {"b"}
    assert samples[("storage_migrator_migration_duration_seconds_count", (("cluster", "b"),))] == 1
