"""The write budget through Prefect restarts, a killed writer and a take-over (issue 37).

Issue 37: "`bench/budget.py` and `bench/budget_restarts.py` give the adherence table again:
0, 1 and 2 Prefect restarts; a kill, and a takeover"; "Put the time from a takeover to the old
run's last write in the docs, and measure it"; "what bounds the overshoot while writers join
and leave, and measure it". The machinery is bench/budget.py's: kubesim in its own process
(etcd on /dev/shm), a real `prefect server start` (devstack, SQLite), whole `migrate-resource`
flows forked from one process that loaded them, each on a CRD of its own (every object
re-encoded), judged by kubesim's record of the PATCHes it received (`Admin.timeline`).

- restarts (`--restarts 0 1 2`): one migration of `rate x --seconds` objects; k times, after
  8 s of writes (and 8 s after the last restart), the Prefect server is SIGKILLed (as when its
  node dies), kept down `--down-seconds`, and started again on the same port and database.
  Reported: the run ratio and the most in 10 s, the writes per second while the server was
  down and while it started again (`prefect server start` takes 10-40 s of CPU on 2 cores,
  which the run and kubesim share), against the same run's before the first kill, and the
  flow run's final state as the server records it at the end (the run reports its end once
  the server answers).
- kill: two migrations on the one budget; once both have written 8 s, one's process is
  SIGKILLed mid-chunk. Its Lease says it writes until it expires (15 s), so the other keeps
  its half share until then. Reported: the seconds from the kill until the other writes at
  0.9 of the whole budget or more (in one second of kubesim's clock), and the most in 10 s.
- takeover: kubesim with two API servers over one etcd, so that each run's writes are told
  apart (each server keeps its own timeline): the old run writes through server 1, is
  stopped (SIGSTOP) for longer than its Lease, a new run of the same request (through
  server 0) takes it over; once the new run has written 3 s, the old one is let go
  (SIGCONT). Reported: the old run's writes after it was let go and its last one, from the
  take-over and from SIGCONT, and its final state (Cancelled, TakenOver).

    uv run python -m bench.budget_restarts [--rate 50] [--seconds 45] [--restarts 0 1 2]
        [--down-seconds 20] [--cases restarts kill takeover]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.budget import (
    WINDOW,
    Forked,
    fill,
    group,
    judge,
    max_window,
    per_tenth,
    prepared,
    resource,
    start_kubesim,
)
from bench.stand import machine
from devstack import PrefectStack
from kubesim.admin import Admin
from storage_migrator.kube.connection import api_client_from_settings
from storage_migrator.migration.requests import list_migrations
from storage_migrator.migration.write_budget import LEASE_SECONDS, is_live
from storage_migrator.migration.writer_leases import list_writer_leases
from storage_migrator.models import owner_of
from storage_migrator.settings import Settings


def run_spec(kubeconfig: Path, i: int, rate: float, work: Path, **params: Any) -> dict[str, Any]:
    return {"params": {"resource": "things", "group": group(i), "write_rate_per_second": rate, **params},
            "env": {"STORAGE_MIGRATOR_KUBECONFIG": str(kubeconfig), "PREFECT_LOGGING_LEVEL": "WARNING"},
            "log": str(work / f"flow-{i}.log")}  # fmt: skip


def wait_writes(admin: Admin, resources: list[str], since: int, seconds: float, timeout: float = 300) -> None:
    """Until `resources` have been written during `seconds` (of kubesim's tenths) since `since`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        per = per_tenth(admin, resources, since=since)
        if per and (max(per) - min(per)) / 10 >= seconds:
            return
        time.sleep(0.5)
    raise SystemExit(f"{resources} were not written for {seconds} s")


def flow_run_of(kubeconfig: Path, i: int, context: str | None = None) -> str | None:
    """The flow run that claimed the request of writer i (its owner annotation)."""
    api = api_client_from_settings(Settings(kubeconfig=kubeconfig, context=context))
    try:
        mine = [m for m in list_migrations(api) if m.spec.resource.group == group(i)]
        return owner_of(mine[-1]) if mine else None
    finally:
        api.close()  # type: ignore[no-untyped-call]


def restarts_case(stack: PrefectStack, kubeconfig: Path, admin: Admin, k: int, args: argparse.Namespace,
                  work: Path) -> dict[str, Any]:  # fmt: skip
    # Long enough to write through every outage: 8 s of writes before each kill, the outage, the restart.
    fill(kubeconfig, 0, round(args.rate * max(args.seconds, 10 + k * (args.down_seconds + 45))))
    forked = Forked(stack, [run_spec(kubeconfig, 0, args.rate, work)], work)
    time.sleep(3)
    since = int(forked.go() * 10)
    outages: list[tuple[float, float, float]] = []  # killed, started again, answering
    for _ in range(k):
        wait_writes(admin, [resource(0)], max(since, int(outages[-1][2] * 10)) if outages else since, 8)
        stack.kill_server()
        down = time.time()
        time.sleep(args.down_seconds)
        restarting = time.time()
        stack.start_server()
        outages.append((down, restarting, time.time()))
    codes = forked.wait(timeout=args.seconds * 10 + 600)
    per = per_tenth(admin, [resource(0)], since=since)
    case = judge(args.rate, 1, per)
    first = min(per) / 10
    before_end = outages[0][0] if outages else max(per) / 10
    before = sum(n for t, n in per.items() if t < before_end * 10) / max(0.1, before_end - first)
    # Down: from a second after the kill until the server is started again. Restarting: while `prefect
    # server start` boots (10-40 s of CPU on these 2 cores, which the run and kubesim share).
    while_down = [sum(n for t, n in per.items() if (d + 1) * 10 <= t < r * 10) / max(0.1, r - d - 1)
                  for d, r, _ in outages]  # fmt: skip
    restarting = [sum(n for t, n in per.items() if r * 10 <= t < u * 10) / max(0.1, u - r) for _, r, u in outages]
    run_id = flow_run_of(kubeconfig, 0)
    state = stack.api(f"/flow_runs/{run_id}")["state"]["type"] if run_id else None
    return {"restarts": k, "run_ratio": round(case.run_ratio, 3), "max_10s": round(case.max_window_ratio, 3),
            "writes_per_s_before": round(before, 1), "writes_per_s_while_down": [round(w, 1) for w in while_down],
            "writes_per_s_while_restarting": [round(w, 1) for w in restarting],
            "down_then_restarting_s": [(round(r - d, 1), round(u - r, 1)) for d, r, u in outages], "exit": codes[0],
            "flow_run_state": state}  # fmt: skip


def kill_case(stack: PrefectStack, kubeconfig: Path, admin: Admin, args: argparse.Namespace,
              work: Path) -> dict[str, Any]:  # fmt: skip
    for i in (0, 1):
        fill(kubeconfig, i, round(args.rate * args.seconds / 2))
    forked = Forked(stack, [run_spec(kubeconfig, i, args.rate, work) for i in (0, 1)], work)
    time.sleep(3)
    since = int(forked.go() * 10)
    wait_writes(admin, [resource(1)], since, 8)
    os.kill(forked.pids[1], signal.SIGKILL)
    kill = time.time()
    forked.wait(timeout=args.seconds * 10 + 600)
    kept = per_tenth(admin, [resource(0)], since=int(kill * 10))
    by_second: dict[int, int] = {}
    for tenth, n in kept.items():
        by_second[tenth // 10] = by_second.get(tenth // 10, 0) + n
    back = next((second + 1 - kill for second in sorted(by_second)
                 if second > kill and by_second[second] >= 0.9 * args.rate), None)  # fmt: skip
    per = per_tenth(admin, [resource(0), resource(1)], since=since)
    return {"whole_budget_back_after_s": None if back is None else round(back, 1), "lease_seconds": LEASE_SECONDS,
            "max_10s": round(max_window(per) / (args.rate * WINDOW / 10), 3)}  # fmt: skip


def takeover_case(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """On a kubesim of two API servers: the old run through kubesim-1, the new one through kubesim-0."""
    (tmp / "two").mkdir()
    kubesim, kubeconfig = start_kubesim(tmp / "two", servers=2)
    stack = PrefectStack(tmp / "prefect-takeover")
    try:
        prepared(kubeconfig)
        admins = {c: Admin.from_kubeconfig(kubeconfig, context=c) for c in ("kubesim-0", "kubesim-1")}
        stack.start_server()
        fill(kubeconfig, 0, round(args.rate * args.seconds))
        old_spec = run_spec(kubeconfig, 0, args.rate, tmp / "old")
        old_spec["env"]["STORAGE_MIGRATOR_CONTEXT"] = "kubesim-1"
        old = Forked(stack, [old_spec], tmp / "old")
        time.sleep(3)
        since = int(old.go() * 10)
        wait_writes(admins["kubesim-1"], [resource(0)], since, 8)
        os.kill(old.pids[0], signal.SIGSTOP)
        stopped = time.time()
        api = api_client_from_settings(Settings(kubeconfig=kubeconfig, context="kubesim-0"))
        while any(
            is_live(lease, now=datetime.now(UTC)) for lease in list_writer_leases(api, namespace="storage-migrator")
        ):
            time.sleep(0.2)
        expired = time.time()
        request = next(m.metadata.name for m in list_migrations(api) if m.spec.resource.group == group(0))
        api.close()  # type: ignore[no-untyped-call]
        new_spec = run_spec(kubeconfig, 0, args.rate, tmp / "new", migration=request)
        new_spec["params"].pop("resource")
        new_spec["params"].pop("group")
        new_spec["env"]["STORAGE_MIGRATOR_CONTEXT"] = "kubesim-0"
        new = Forked(stack, [new_spec], tmp / "new")
        time.sleep(3)
        began = int(new.go() * 10)
        wait_writes(admins["kubesim-0"], [resource(0)], began, 3)
        taken = min(per_tenth(admins["kubesim-0"], [resource(0)], since=began)) / 10
        os.kill(old.pids[0], signal.SIGCONT)
        resumed = time.time()
        old_codes, new_codes = old.wait(timeout=600), new.wait(timeout=args.seconds * 10 + 600)
        late = per_tenth(admins["kubesim-1"], [resource(0)], since=int(resumed * 10))
        last_old = max(per_tenth(admins["kubesim-1"], [resource(0)], since=since)) / 10
        old_log = (tmp / "old" / "flow-0.log").read_text()
        final = next((line for line in old_log.splitlines() if line.startswith("final state:")), "")
        learned = next((line[:12] for line in old_log.splitlines() if "was taken over" in line and line[:2].isdigit()),
                       None)  # fmt: skip
        day = datetime.fromtimestamp(resumed).strftime("%Y-%m-%d ")
        knew = datetime.strptime(day + learned, "%Y-%m-%d %H:%M:%S.%f").timestamp() - resumed if learned else None
        return {"stopped_s": round(resumed - stopped, 1), "lease_expired_after_s": round(expired - stopped, 1),
                "new_run_first_write_after_takeover_s": round(taken - expired, 1),
                "old_learned_after_sigcont_s": None if knew is None else round(knew, 2),
                "old_writes_after_sigcont": sum(late.values()),
                "old_last_write_from_takeover_s": round(last_old - taken, 1),
                "old_last_write_from_sigcont_s": round(last_old - resumed, 1) if late else None,
                "old_final": final[:120], "exits": [old_codes[0], new_codes[0]]}  # fmt: skip
    finally:
        stack.stop()
        kubesim.terminate()
        kubesim.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=50, help="the budget, writes/s")
    parser.add_argument("--seconds", type=float, default=45, help="seconds of writes of a migration at the budget")
    parser.add_argument("--restarts", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--down-seconds", type=float, default=20)
    parser.add_argument("--cases", nargs="+", default=["restarts", "kill", "takeover"],
                        choices=["restarts", "kill", "takeover"])  # fmt: skip
    args = parser.parse_args()
    print(f"bench/budget_restarts.py: {machine()}", flush=True)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-restarts-") as tmp_name:
        tmp = Path(tmp_name)
        if "restarts" in args.cases or "kill" in args.cases:
            kubesim, kubeconfig = start_kubesim(tmp)
            stack = PrefectStack(tmp / "prefect")
            try:
                admin = prepared(kubeconfig)
                stack.start_server()
                if "restarts" in args.cases:
                    results["restarts"] = []
                    for k in args.restarts:
                        row = restarts_case(stack, kubeconfig, admin, k, args, tmp / f"restarts-{k}")
                        results["restarts"].append(row)
                        print("restarts", json.dumps(row), flush=True)
                if "kill" in args.cases:
                    results["kill"] = kill_case(stack, kubeconfig, admin, args, tmp / "kill")
                    print("kill", json.dumps(results["kill"]), flush=True)
            finally:
                stack.stop()
                kubesim.terminate()
                kubesim.wait(timeout=30)
        if "takeover" in args.cases:
            results["takeover"] = takeover_case(args, tmp)
            print("takeover", json.dumps(results["takeover"]), flush=True)
    print(json.dumps(results))
    print(f"end: {machine()}")


if __name__ == "__main__":
    main()
