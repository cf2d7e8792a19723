"""Issue 37: "Three writers join and leave at random on one cluster, for at least 2 minutes: no 10 s
window over 1.00 of the budget; the run's rate at least 0.95 of the budget while anyone writes."

Each writer is a process of its own (tests/lease_writer.py: the product's request Lease and pacer,
what a migrate-resource run's chunks use, without Prefect's start-up cost; forks of one process
that imported them once, so that a join costs no CPU the others' writes would miss), taking a request's
Lease, joining the writers, writing for a random while, then leaving. The schedule is random but
seeded (printed; STORAGE_MIGRATOR_TEST_SEED replays one), keeps one to three writers at once and
never none, so that "while anyone writes" is the whole span. Judged by kubesim's own record of the
PATCHes it received (`Admin.timeline()`). In a lane of its own (scripts/test.sh WAITING): it waits.
The suite runs three other pytest sessions on two cores beside it; starved of CPU, kubesim and the
writers ran 0.940-0.949 of the budget in two CI runs, 0.956-0.965 with the CPU to spare (the rule's
own ceiling, simulated, 0.967-0.974). So the test, kubesim and etcd run at nice -10 while it writes
(`claimed_cpu`; root only, as CI runs): the rate is the rule's to prove, the machine's load shows
in the other lanes' time instead (0.962 of the budget at load 11 with it).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest
from conftest import Kubesim
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from storage_migrator.kube.connection import api_client_from_settings
from storage_migrator.migration.writer_leases import list_writer_leases
from storage_migrator.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("migration_crds")]

REPO = Path(__file__).resolve().parents[2]
#: The budget (writes/s), the span (seconds), writers at once at most, ConfigMaps per namespace.
RATE = 30.0
SPAN = 125.0
MOST = 3
OBJECTS = 40
#: Tenths of a second in the promise's window.
WINDOW = 100


@dataclass(frozen=True)
class Writer:
    start: float
    seconds: float

    @property
    def end(self) -> float:
        return self.start + self.seconds


def schedule(rng: random.Random) -> list[Writer]:
    """Writers over [0, SPAN]: each writes 15-45 s; another joins 4-16 s after the last one joined
    (when MOST write, as soon as one leaves), and always 5 s before the last one to leave has
    left (a process takes a second to start), so that someone always writes."""
    writers = [Writer(0.0, rng.uniform(20, 45))]
    t = rng.uniform(4, 16)
    while max(w.end for w in writers) < SPAN:
        live = [w for w in writers if w.start <= t < w.end]
        if len(live) >= MOST:
            t = min(w.end for w in live)
            continue
        writers.append(Writer(t, min(rng.uniform(15, 45), max(15.0, SPAN + 5 - t))))
        t = min(t + rng.uniform(4, 16), max(w.end for w in writers) - 5)
    return writers


def at_once(writers: list[Writer], t: float) -> int:
    return sum(1 for w in writers if w.start <= t < w.end)


def _priority(kubesim: Kubesim, nice: int) -> None:
    """This process's threads (kubesim serves from them) and etcd's at `nice`; the writers forked
    after inherit it. Root only (CI runs as root); elsewhere nothing changes."""
    etcd = kubesim.cluster.etcd_pid
    pids = [int(tid) for tid in os.listdir("/proc/self/task")] + ([etcd] if etcd is not None else [])
    for pid in pids:
        with contextlib.suppress(PermissionError, ProcessLookupError):
            os.setpriority(os.PRIO_PROCESS, pid, nice)


@pytest.fixture
def claimed_cpu(kubesim: Kubesim) -> Iterator[None]:
    """The test, kubesim and etcd ahead of the other lanes for the CPU: the rate is the rule's to
    prove, not the machine's spare CPU (two cores, three other pytest sessions beside it)."""
    _priority(kubesim, -10)
    try:
        yield
    finally:
        _priority(kubesim, 0)


@pytest.mark.usefixtures("claimed_cpu")
def test_three_writers_joining_and_leaving_at_random_keep_the_budget_and_use_it(
    kubesim: Kubesim, tmp_path: Path
) -> None:
    seed = int(os.environ.get("STORAGE_MIGRATOR_TEST_SEED") or random.SystemRandom().randrange(10**6))
    print(f"seed {seed} (STORAGE_MIGRATOR_TEST_SEED={seed} replays it)")
    plan = schedule(random.Random(seed))
    ends = max(w.end for w in plan)
    assert ends >= 120 and all(1 <= at_once(plan, t / 10) <= MOST for t in range(int(ends * 10))), plan
    namespaces = [f"jl-{uuid4().hex[:8]}" for _ in range(MOST)]
    with k8s_config.new_client_from_config(config_file=kubesim.kubeconfig) as client:
        core = k8s.CoreV1Api(client)
        for ns in namespaces:
            core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=ns)))
            for i in range(OBJECTS):
                core.create_namespaced_config_map(ns, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=f"cm-{i}"),
                                                                      data={"k": "v"}))  # fmt: skip
    # The writers are forks of one process that imported them once (tests/lease_writer.py --fork).
    forker = subprocess.Popen([sys.executable, str(REPO / "tests" / "lease_writer.py"), "--fork", str(tmp_path)],
                              cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              start_new_session=True)  # fmt: skip
    assert forker.stdin is not None and forker.stdout is not None
    # The schedule starts once the forker has imported everything (seconds on a loaded machine,
    # which would otherwise come off the first writer's time and shorten the span).
    assert json.loads(forker.stdout.readline()) == {"ready": True}
    since = int(time.time() * 10)
    began = time.monotonic()
    try:
        for i, w in enumerate(plan):
            time.sleep(max(0.0, began + w.start - time.monotonic()))
            forker.stdin.write(json.dumps({"kubeconfig": kubesim.kubeconfig, "request": f"jl-{i}-{seed}",
                                           "namespace": namespaces[i % MOST], "rate": RATE,
                                           "seconds": round(w.seconds, 1)}) + "\n")  # fmt: skip
            forker.stdin.flush()
        out, _ = forker.communicate(timeout=120)
        codes = json.loads(out)
        for request, code in codes.items():
            assert code == 0, (tmp_path / f"{request}.log").read_text()[-3000:]
        assert len(codes) == len(plan)
    finally:
        if forker.poll() is None:
            os.killpg(forker.pid, signal.SIGKILL)  # the writers with it
            forker.wait()
        for stream in (forker.stdin, forker.stdout):
            if stream is not None and not stream.closed:
                stream.close()
        with k8s_config.new_client_from_config(config_file=kubesim.kubeconfig) as client:
            for ns in namespaces:
                k8s.CoreV1Api(client).delete_namespace(ns)
    per = {t: n for t, n in kubesim.admin.timeline().get("patch configmaps", []) if t >= since}
    first, last = min(per), max(per)
    span = (last + 1 - first) / 10
    ratio = sum(per.values()) / (RATE * span)
    most = max(sum(per.get(t, 0) for t in range(s, s + WINDOW)) for s in range(first, last + 1))
    figures = (
        f"{len(plan)} writers over {span:.0f} s (seed {seed}): run {ratio:.3f} of the budget, busiest 10 s "
        f"{most / (RATE * WINDOW / 10):.3f}"
    )
    print(figures)
    assert span >= 120, figures
    assert most <= RATE * WINDOW / 10, f"a 10 s window over the budget: {figures}"
    assert ratio >= 0.95, f"the writers together used less than 0.95 of the budget: {figures}"
    api: Any = api_client_from_settings(Settings(kubeconfig=kubesim.kubeconfig))
    left = [lease.name for lease in list_writer_leases(api, namespace="storage-migrator")
            if lease.request.startswith("jl-")]  # fmt: skip
    api.close()
    assert not left, f"writer Leases left behind: {left}"
