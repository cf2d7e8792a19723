"""Issue 13's chaos campaigns at full size, each judged by what etcd holds; prints a markdown report.

Issue 13, "Chaos campaigns (tests where they fit in CI, the long form in
`bench/chaos.py` with a report)"; done when "the chaos report shows zero
objects lost or missed". Seed 002: "make progress in flaky environment, e.g.,
flaky apiservers, or the migration process get preempted"; "chaos testing the
migrator with injected network errors, and injected crashes of both the
migrator and the apiserver".

Each campaign gets a cluster of its own (etcd with big flags and
`python -m kubesim serve` in child processes), N ConfigMaps written straight
into etcd (bench/scale.py's `seed`), one StorageVersionMigration request, and
`migrate-resource` runs of that request in child processes against one
`prefect server start` (devstack.PrefectStack, SQLite), product defaults but
no shared budget (bench/budget.py measures that) and an unlimited rate:

(a) faults on 20% of the migrator's LISTs and PATCHes (500, 503, 429 with
    Retry-After: 1 in both shapes, dropped connections, 0.2 s latency), etcd
    compacted every 2 s, three writers creating, updating and deleting
    ConfigMaps of the namespace throughout (storage version v1 -> v2);
(b) the flow process SIGKILLed at random points (--kills points drawn uniformly
    over the objects; at each, once the run has checkpointed past it, a random
    moment within two chunk durations), a new run of the same request each
    time (v1 -> v2); rework per kill =
    (PATCH requests - objects) / kills, from kubesim's counters;
(c) kubesim SIGKILLed and started again on the same port and etcd twice (at 20%
    and 50% of the objects), each time with a 403 window of --warmup seconds
    (RBAC caches filling, as upstream's chaos e2e restarts the API server), and
    the Prefect server stopped for --prefect-down seconds and started again on
    the same port and database at 35%; the storage change is an encryption
    config file (kept across restarts, as kube-apiserver's flag is): plaintext
    -> aescbc key1. A flow run that dies is followed by a new run of the request
    (what run-migrations or an operator does), and the report says so.

Printed per campaign: objects seeded, surviving, re-encoded, missed, lost writer
updates, changed contents, the request's condition and the verdict.

    uv run python -m bench.chaos --objects 10000 --kills 10 --chunk 100
    uv run python -m bench.chaos --objects 100000 --kills 10
"""

from __future__ import annotations

import argparse
import base64
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.scale import NAMESPACE, seed, seeded
from bench.stand import REPO, KubesimProcess, machine, start_etcd
from devstack import PrefectStack
from devstack.chaos import Compactor, Verdict, Writers, fault_mix, judge, markdown, stored_objects
from kubesim import tls
from kubesim.codec import derived_secret
from kubesim.etcd import EtcdProcess, EtcdStore, prefix_end
from storage_migrator.conditions import is_condition_true
from storage_migrator.kube.connection import api_client_from_settings
from storage_migrator.kube.writing import create_object
from storage_migrator.migration.requests import MIGRATIONS, read_migration
from storage_migrator.models import CONDITION_SUCCEEDED
from storage_migrator.settings import Settings

FLOW_CHILD = """
from flows.migrate_resource import migrate_resource
state = migrate_resource(migration={migration!r}, chunk_size={chunk}, write_rate_per_second=1e6, return_state=True)
summary = state.result() if state.is_completed() else None
print("FLOW-STATE", state.type.value, repr(summary.message if summary else state.message), flush=True)
"""

ENCRYPTION_CONFIG = """apiVersion: apiserver.config.k8s.io/v1
kind: EncryptionConfiguration
resources:
  - resources: [configmaps]
    providers:
      - aescbc:
          keys:
            - name: key1
              secret: {secret}
      - identity: {{}}
"""


@dataclass
class Stand:
    """One campaign's cluster: etcd, kubesim over it, an etcd client and an API client."""

    etcd: EtcdProcess
    kubesim: KubesimProcess
    store: EtcdStore
    api: Any
    seeded: dict[str, dict[str, str]] = field(default_factory=dict)

    def configmaps(self) -> int:
        prefix = b"/registry/configmaps/"
        # etcd's count is every key of the range, whatever the limit
        return int(self.store.range(prefix, prefix_end(prefix), limit=1, keys_only=True).count)


def wait_ready(url: str, ca_pem: bytes, timeout: float = 60) -> None:
    """Until /readyz answers 200 (kubesim's 403 window is over)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=2, context=tls.client_context(ca_pem)) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"kubesim at {url} not ready after {timeout:.0f} s")
        time.sleep(0.2)


@contextmanager
def stand(work: Path, objects: int, size: int, **kubesim_options: Any) -> Iterator[Stand]:
    """etcd, kubesim, our CRDs, the namespace, and `objects` ConfigMaps seeded into etcd (v1, plaintext)."""
    work.mkdir(parents=True, exist_ok=True)
    etcd = start_etcd()
    kubesim = KubesimProcess(work, etcd.url, **kubesim_options)
    store = EtcdStore(etcd.url, timeout=120)
    api = None
    try:
        kubesim.start()
        wait_ready(kubesim.url, kubesim.ca_pem)
        k = ["kubectl", "--kubeconfig", kubesim.kubeconfig]
        subprocess.run(
            [*k, "apply", "-f", str(REPO / "deployments" / "crds"), "-f", str(REPO / "deployments" / "rbac")],
            check=True,
            capture_output=True,
        )
        subprocess.run([*k, "create", "namespace", NAMESPACE], check=True, capture_output=True)
        api = api_client_from_settings(Settings(kubeconfig=Path(kubesim.kubeconfig), request_timeout_seconds=30))
        rate = seed(store, objects, size)
        print(f"  seeded {objects} ConfigMaps into etcd at {rate:.0f}/s", flush=True)
        yield Stand(etcd=etcd, kubesim=kubesim, store=store, api=api,
                    seeded=dict(seeded(i, size) for i in range(objects)))  # fmt: skip
    finally:
        if api is not None:
            api.close()
        store.close()
        kubesim.stop()
        etcd.stop()


def create_request(api: Any) -> str:
    """A StorageVersionMigration for configmaps; every run of the campaign is a run of it."""
    body = {"apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageVersionMigration",
            "metadata": {"generateName": "chaos-"}, "spec": {"resource": {"version": "v1", "resource": "configmaps"}}}  # fmt: skip
    return str(create_object(api, MIGRATIONS, body)["metadata"]["name"])


def request_state(api: Any, name: str) -> tuple[bool, int, str | None]:
    """(Succeeded, objects listed so far, continue token) of the request."""
    request = read_migration(api, name)
    progress = request.status.progress if request.status else None
    succeeded = is_condition_true(request.status.conditions if request.status else [], CONDITION_SUCCEEDED)
    return succeeded, progress.listed if progress else 0, request.spec.continue_token


class FlowRuns:
    """`migrate-resource` runs of one request, each in a child process of its own, logged to `work`."""

    def __init__(self, stack: PrefectStack, sim: Stand, work: Path, name: str, chunk: int) -> None:
        self.stack, self.sim, self.work, self.name, self.chunk = stack, sim, work, name, chunk
        self.started = 0
        self.endings: list[str] = []
        self.proc: subprocess.Popen[bytes] | None = None

    def spawn(self) -> subprocess.Popen[bytes]:
        env = {**self.stack.env, "STORAGE_MIGRATOR_KUBECONFIG": self.sim.kubesim.kubeconfig, "PYTHONPATH": str(REPO),
               "STORAGE_MIGRATOR_SHARED_WRITE_BUDGET": "false",
               "STORAGE_MIGRATOR_DATABASE_URL": f"sqlite:///{self.work / 'ledger.db'}"}  # fmt: skip
        self.started += 1
        with open(self.log(self.started), "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", FLOW_CHILD.format(migration=self.name, chunk=self.chunk)],
                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        return self.proc

    def log(self, n: int) -> Path:
        return self.work / f"flow-{n}.log"

    def ended(self) -> str:
        """How the last run ended, from its exit code and log."""
        assert self.proc is not None
        code = self.proc.wait()
        text = self.log(self.started).read_text(errors="replace")
        state = next((line for line in reversed(text.splitlines()) if line.startswith("FLOW-STATE")), None)
        last_error = next((line for line in reversed(text.splitlines()) if "Error" in line or "error" in line), "")
        ending = f"run {self.started}: exit {code}, {state or 'no final state; last error line: ' + last_error[:300]}"
        self.endings.append(ending)
        return ending

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def until_succeeded(self, *, max_runs: int = 5, during: Callable[[], None] = lambda: None) -> bool:
        """Runs of the request until it is Succeeded (a run that dies is followed by a new one), or `max_runs`."""
        for _ in range(max_runs):
            proc = self.spawn()
            while proc.poll() is None:
                during()
                time.sleep(0.2)
            print(f"  {self.ended()}", flush=True)
            done = retry(lambda: request_state(self.sim.api, self.name))[0]
            if done:
                return True
        return False


def ledger_note(work: Path) -> str:
    """What the migrator met, from its own ledger (chunk rows): context for the verdict, never the verdict."""
    try:
        with sqlite3.connect(work / "ledger.db") as db:
            chunks, retries, relisted, longest = db.execute(
                "SELECT count(*), sum(retries), sum(relisted), max(duration_seconds) FROM migration_chunks"
            ).fetchone()
    except sqlite3.Error as exc:
        return f"ledger: not read ({exc})"
    return (f"ledger: {chunks} chunks recorded, {retries or 0} retried requests, {relisted or 0} LISTs re-issued "
            f"after 410 Expired, longest chunk {longest or 0:.1f} s")  # fmt: skip


def retry(fn: Callable[[], Any], timeout: float = 120) -> Any:
    """`fn()` until it does not raise (the API server may be restarting)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def campaign_faults(args: argparse.Namespace, stack: PrefectStack, work: Path) -> Verdict:
    """(a) 20% faults + compaction every 2 s + three writers, storage version v1 -> v2."""
    print("(a) faults + compaction + writers", flush=True)
    with stand(work, args.objects, args.size) as sim:
        admin = sim.kubesim.admin
        admin.set_storage_version("configmaps", "v2")
        name = create_request(sim.api)
        admin.set_faults(fault_mix("configmaps", rate=0.2, retry_after=1))
        runs = FlowRuns(stack, sim, work, name, args.chunk)
        started = time.monotonic()
        with Compactor(admin, period=2.0) as compactor, Writers(
            sim.api, resource="configmaps", namespace=NAMESPACE, names=sorted(sim.seeded), count=3, pause=args.writer_pause
        ) as writers:  # fmt: skip
            succeeded = runs.until_succeeded(max_runs=1)
        seconds = time.monotonic() - started
        counters = admin.counters()
        admin.clear_faults()
        verdict = judge("(a) faults + compaction + writers",
                        stored_objects(sim.store, f"/registry/configmaps/{NAMESPACE}/"), seeded=sim.seeded,
                        written=writers.expected, current=lambda v: v.api_version == "v2",
                        writer_errors=len(writers.errors))  # fmt: skip
        requests = sum(v for k, v in counters["requestsByResource"].items()
                       if k in ("list configmaps", "patch configmaps"))  # fmt: skip
        verdict.succeeded = succeeded
        verdict.notes += [
            f"{seconds:.0f} s; faults fired: {counters['faultsFired']} of {requests} LISTs and PATCHes of configmaps",
            f"compactions: {compactor.compactions}; writer operations: {dict(writers.ops)}",
            f"writer errors: {writers.errors[:3]}" if writers.errors else "writer errors: none",
            ledger_note(work),
            *runs.endings,
        ]
        return verdict


def campaign_kills(args: argparse.Namespace, stack: PrefectStack, work: Path) -> Verdict:
    """(b) the flow process SIGKILLed at random points, resumed by a new run each time."""
    print(f"(b) {args.kills} SIGKILLs of the flow process", flush=True)
    rng = random.Random(args.seed)
    with stand(work, args.objects, args.size) as sim:
        admin = sim.kubesim.admin
        admin.set_storage_version("configmaps", "v2")
        name = create_request(sim.api)
        objects = sim.configmaps()
        patches_before = admin.counters()["requestsByResource"].get("patch configmaps", 0)
        runs = FlowRuns(stack, sim, work, name, args.chunk)
        started = time.monotonic()
        kills: list[str] = []
        # Random points over the whole run: a checkpoint count to reach, then a moment within two chunks.
        targets = sorted(rng.uniform(0, objects) for _ in range(args.kills))
        for k, target in enumerate(targets):
            proc = runs.spawn()
            _, listed, token = request_state(sim.api, name)
            target = max(target, listed + 1)  # at least one checkpoint of this run
            stamps: list[float] = []
            while proc.poll() is None:
                _, listed, now = request_state(sim.api, name)
                if now != token:
                    stamps.append(time.monotonic())
                    token = now
                    if listed >= target and len(stamps) >= 2:  # the last two give a chunk's time
                        break
                time.sleep(0.02)
            if proc.poll() is not None:
                print(f"  {runs.ended()} before kill {k + 1}", flush=True)
                break
            delay = rng.uniform(0, 2 * (stamps[-1] - stamps[-2]))
            time.sleep(delay)
            runs.kill()
            _, listed, _ = request_state(sim.api, name)
            kills.append(f"kill {k + 1}: {delay:.2f} s after the checkpoint at {target:.0f}+ objects; "
                         f"{listed} objects checkpointed")  # fmt: skip
            print(f"  {kills[-1]}", flush=True)
        succeeded = runs.until_succeeded(max_runs=3)
        seconds = time.monotonic() - started
        patches = admin.counters()["requestsByResource"].get("patch configmaps", 0) - patches_before
        verdict = judge("(b) SIGKILLs of the flow", stored_objects(sim.store, f"/registry/configmaps/{NAMESPACE}/"),
                        seeded=sim.seeded, written={}, current=lambda v: v.api_version == "v2")  # fmt: skip
        verdict.succeeded = succeeded
        rework = (patches - objects) / max(1, len(kills))
        verdict.notes += [
            f"{seconds:.0f} s over {runs.started} runs; {len(kills)} kills; PATCHes {patches} for {objects} objects: "
            f"rework per kill {rework:.0f} objects (chunk {args.chunk}: {'within' if rework <= args.chunk else 'OVER'})",
            *kills,
            ledger_note(work),
            *runs.endings[-1:],
        ]
        return verdict


def campaign_restarts(args: argparse.Namespace, stack: PrefectStack, work: Path) -> Verdict:
    """(c) kubesim killed and restarted twice (403 window), the Prefect server restarted once."""
    print("(c) kubesim restarted twice, the Prefect server once", flush=True)
    work.mkdir(parents=True, exist_ok=True)
    config = work / "encryption.yaml"
    config.write_text(ENCRYPTION_CONFIG.format(secret=base64.b64encode(derived_secret("key1")).decode()))
    with stand(work, args.objects, args.size, authz_warmup=args.warmup, encryption_config=config) as sim:
        name = create_request(sim.api)
        runs = FlowRuns(stack, sim, work, name, args.chunk)
        events: list[tuple[float, str]] = [(0.20, "kubesim"), (0.35, "prefect"), (0.50, "kubesim")]
        done: list[str] = []
        started = time.monotonic()

        def during() -> None:
            if not events:
                return
            try:
                listed = request_state(sim.api, name)[1]
            except Exception:  # noqa: BLE001 - kubesim is restarting
                return
            if listed < events[0][0] * args.objects:
                return
            at, what = events.pop(0)
            began = time.monotonic()
            if what == "kubesim":
                sim.kubesim.kill()
                time.sleep(1.0)
                sim.kubesim.start()
            else:
                stack.stop()
                time.sleep(args.prefect_down)
                stack.start_server()
            done.append(f"{what} restarted at {listed} objects ({at:.0%}), back after {time.monotonic() - began:.1f} s")
            print(f"  {done[-1]}", flush=True)

        succeeded = runs.until_succeeded(max_runs=5, during=during)
        seconds = time.monotonic() - started
        verdict = judge("(c) kubesim x2 + Prefect server restarts",
                        stored_objects(sim.store, f"/registry/configmaps/{NAMESPACE}/", read_keys=["key1"]),
                        seeded=sim.seeded, written={}, current=lambda v: v.key_name == "key1")  # fmt: skip
        verdict.succeeded = succeeded
        verdict.notes += [f"{seconds:.0f} s over {runs.started} run(s)", *done, ledger_note(work), *runs.endings]
        return verdict


CAMPAIGNS = {"a": campaign_faults, "b": campaign_kills, "c": campaign_restarts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=100_000, help="ConfigMaps per campaign")
    parser.add_argument("--kills", type=int, default=10, help="SIGKILLs of the flow process in (b)")
    parser.add_argument("--chunk", type=int, default=500, help="the flow's chunk (LIST page) size")
    parser.add_argument("--size", type=int, default=256, help="bytes of data per ConfigMap")
    parser.add_argument("--writer-pause", type=float, default=0.05, help="seconds between a writer's operations in (a)")
    parser.add_argument("--warmup", type=float, default=2.5, help="seconds of 403s after each kubesim start in (c)")
    parser.add_argument("--prefect-down", type=float, default=15.0, help="seconds the Prefect server is down in (c)")
    parser.add_argument("--campaigns", default="abc", help="which of a, b, c to run")
    parser.add_argument("--seed", type=int, default=13, help="random seed of the kill points")
    parser.add_argument("--workdir", help="keep logs here (default: a temporary directory, removed)")
    args = parser.parse_args()
    command = "uv run python -m bench.chaos " + " ".join(sys.argv[1:])
    where = machine()
    print(f"machine: {where}", flush=True)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-chaos-"))
    stack = PrefectStack(work / "prefect-home")
    verdicts: list[Verdict] = []
    started = time.monotonic()
    try:
        stack.start_server()
        for key in args.campaigns:
            verdicts.append(CAMPAIGNS[key](args, stack, work / key))
            print(markdown(verdicts[-1:]), flush=True)
    finally:
        stack.stop()
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    print(f"\n### Chaos report\n\n`{command}` ({time.monotonic() - started:.0f} s in all)\n\nMachine: {where}\n")
    print(markdown(verdicts) + "\n")
    for v in verdicts:
        print(f"{v.campaign}:")
        for note in v.notes + [f"example: {e}" for e in v.examples]:
            print(f"- {note}")
        print()
    lost = sum(v.lost_updates + v.changed for v in verdicts)
    missed = sum(v.missed for v in verdicts)
    print(f"Objects lost or changed: {lost}; missed: {missed}; verdict: "
          f"{'PASS' if all(v.ok for v in verdicts) else 'FAIL'}")  # fmt: skip


if __name__ == "__main__":
    main()
