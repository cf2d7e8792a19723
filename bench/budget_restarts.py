"""Budget adherence after Prefect server restarts (issue 31, "When Prefect itself goes down").

Issue 31: "Measure the budget's adherence after 0, 1 and 2 restarts: the same 0.95-1.00
each time", and "Two workers, the server down for 60 s: no 10 s window above the budget
once it is back". Prefect 3.9 keeps concurrency leases in memory and slot counts in its
database: a restart while a run holds a writer's slot of `<budget>-writers` used to leave
a ghost slot for good, and every later migration paced itself at 1/2, then 1/3 of the budget.

The machinery is bench/budget.py's: kubesim in its own process (etcd on /dev/shm), a real
`prefect server start` (devstack, SQLite under its home, as the issue's operator ran it),
whole `migrate-resource` flows with the shared budget on, one process each, judged by
kubesim's record of the PATCHes it received per tenth of a second (`Admin.timeline`).
Each run's objects are created in v1 and the storage version then set to v2, so every
object is re-encoded (the request's progress says whether all were: `rewritten`, plus
`conflicted` for objects written since the LIST, e.g. by a chunk of the same run that
stopped midway and was done again from its checkpoint).

- restarts (`--restarts 0 1 2`): on ONE server, restarts accumulate as in the issue. For k
  restarts (in increasing order), `k - done` outages are made the issue's way: a
  migration of ConfigMaps is started (`--seconds` of writes), the server is SIGKILLed
  (`kill_server`, as when its node dies) after a third of them, kept down `--down-seconds`
  and started again on the same port and database; the run goes on and finishes. Those
  runs retry each Prefect call once (PREFECT_CLIENT_MAX_RETRIES=1, about 2 s, instead of
  5: 2 + 4 + 8 + 16 + 32 s), so 20 s down outlasts their retries as the issue's 90 s
  outlasted the default's. Then a NEW migration on fresh ConfigMaps (default retries) is
  measured as budget.py does. The writers' counter (`active_slots` of `<budget>-writers`,
  read from the server every half second) is printed before it starts and while it runs:
  a ghost shows as a count above 1. Each outage run is reported too: its writes from the
  kill to the restart, and its most in 10 s.
- outage (`--outage-workers 2 --outage-seconds 60`): two migrations (ConfigMaps and Secrets,
  a process each, `1.5 x --seconds` of writes together) on one budget, Prefect's default
  client retries; the server is killed once both have written for max(12 s, a third of
  `--seconds`), kept down `--outage-seconds` and started again. Reported:
  writes while it was down, the most in 10 s before the kill and from the restart to the
  end, and whether both runs ended Completed with every object rewritten (the flow's final
  state, the request's Succeeded condition and `status.progress`). It runs on the cluster
  the restarts case used: requests that finished there within `lease_seconds` count as
  possible writers when the writers' count is healed (`--cases outage` alone: a fresh one).

Every run gets the setting's `lease_seconds` (600) unless `--lease-seconds` says otherwise
(the e2e test's 20 s, as a diagnostic). `--logs DIR` keeps the flows' and servers' logs.

Figures:

- run ratio: writes / (budget x seconds) from the first write to the last (goal 0.95-1.00);
- max 10 s: the most writes in any 100 consecutive tenths, over the budget's 10 s worth
  (goal: never above 1.00);
- writes while down: PATCHes kubesim received from the kill to the restart, split into the
  first MAX_VIEW_AGE_SECONDS (2.5 s: a run writes on a view of the budget at most that old,
  by design: tasks/write_budget.py) and the rest (goal 0).

    uv run python -m bench.budget_restarts [--restarts 0 1 2] [--rate 50] [--seconds 30]
        [--down-seconds 20] [--outage-workers 2] [--outage-seconds 60] [--cases restarts outage]
        [--lease-seconds S] [--logs DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.budget import BUDGET_LIMIT, NAMESPACE, RESOURCES, create, machine, prepared, start_kubesim, summarize
from devstack import REPO, PrefectStack
from kubesim.admin import Admin
from storage_migrator.conditions import is_condition_true
from storage_migrator.kube.connection import api_client_from_settings
from storage_migrator.migration.requests import list_migrations
from storage_migrator.models import CONDITION_SUCCEEDED
from storage_migrator.settings import Settings

#: A run writes on a view of the budget at most this old (tasks/write_budget.MAX_VIEW_AGE_SECONDS).
VIEW_AGE = 2.5
#: One flow run in a process of its own; exit 0 if it ended Completed.
FLOW = (
    "import sys\n"
    "from flows.migrate_resource import migrate_resource\n"
    "state = migrate_resource(resource=sys.argv[1], return_state=True)\n"
    "print('final state:', state.type.value, flush=True)\n"
    "sys.exit(0 if state.is_completed() else 3)\n"
)


class WritersSampler:
    """The writers' counter (`active_slots` of `<budget>-writers`) read from the server every
    half second in a thread; None while the server does not answer."""

    def __init__(self, stack: PrefectStack, budget: str) -> None:
        self.stack, self.path = stack, f"/v2/concurrency_limits/{budget}-writers"
        self.samples: list[tuple[float, int | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="writers-sampler", daemon=True)

    def read(self) -> int | None:
        try:
            return int(self.stack.api(self.path, timeout=2)["active_slots"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self.samples.append((time.time(), self.read()))

    def __enter__(self) -> WritersSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def between(self, start: float, end: float) -> list[int]:
        """The counts read from `start` to `end` (seconds since the epoch), in order, runs of one value as one."""
        seen: list[int] = []
        for t, n in list(self.samples):
            if start <= t <= end and n is not None and (not seen or seen[-1] != n):
                seen.append(n)
        return seen


@dataclass
class Run:
    """A migrate-resource process, its resource and its request (found once it ended)."""

    resource: str
    objects: int
    proc: subprocess.Popen[bytes]
    log: Path
    request: str = ""
    succeeded: bool = False
    rewritten: int = 0
    conflicted: int = 0  # written since the LIST by another (or by this run's chunk stopped midway): re-encoded
    failed: int = 0

    @property
    def completed(self) -> bool:
        """Ended Completed, its request Succeeded, every object re-encoded."""
        return (self.proc.returncode == 0 and self.succeeded and self.failed == 0
                and self.rewritten + self.conflicted == self.objects)  # fmt: skip

    def verdict(self) -> str:
        return (f"{self.resource}: exit {self.proc.returncode}, Succeeded {self.succeeded}, rewritten {self.rewritten}"
                f"{f' + {self.conflicted} written since the LIST' if self.conflicted else ''}/{self.objects}"
                f"{f', {self.failed} failed' if self.failed else ''}")  # fmt: skip


@dataclass
class OutageReport:
    """A migration (or several) that rode out one outage of the server."""

    label: str
    down_seconds: float  # from the kill to the restart's start
    restart_seconds: float  # from the restart's start to the server answering
    writes: int
    writes_first_2_5s: int  # from the kill to VIEW_AGE after it: writes on a view taken before the kill
    writes_while_down: int  # from VIEW_AGE after the kill to the restart's start (goal 0)
    writes_while_restarting: int  # from the restart's start to the server answering
    max_10s_before: float
    max_10s_after: float  # from the restart's start to the last write
    max_10s_run: float
    completed: list[str]  # Run.verdict() of each
    writers_before_kill: list[int]
    writers_after_restart: list[int]  # from the server answering to the runs' end
    writers_after_end: int | None
    heal_lines: int  # "writers' slots had no run ... released" in the runs' logs


@dataclass
class RestartCase:
    restarts: int
    writes: int
    seconds: float
    run_ratio: float
    max_window_ratio: float
    writers_before: int | None
    writers_starting: list[int]  # from the process start to its first write (the heal runs then)
    writers_during: list[int]  # from the first write to the last
    writers_after: int | None
    load: float
    outages: list[OutageReport] = field(default_factory=list)


def tenths(admin: Admin, resources: list[str], *, since: int, until: int | None = None) -> dict[int, int]:
    """The PATCHes kubesim saw to `resources`, per tenth of a second of its clock, in [since, until)."""
    per: dict[int, int] = {}
    for key, rows in admin.timeline().items():
        verb, resource = key.split(" ", 1)
        if verb == "patch" and resource in resources:
            for tenth, n in rows:
                if tenth >= since and (until is None or tenth < until):
                    per[tenth] = per.get(tenth, 0) + n
    return per


def dense(per: dict[int, int], start: int | None = None, end: int | None = None) -> list[int]:
    """Per tenth from the first write (or `start`) to the last (or `end`, exclusive), zeros included."""
    keys = [t for t in per if (start is None or t >= start) and (end is None or t < end)]
    if not keys:
        return []
    return [per.get(t, 0) for t in range(min(keys), max(keys) + 1)]


def max_window(rate: float, series: list[int]) -> float:
    return summarize("sqlite", rate, 1, series).max_window_ratio if series else float("nan")


def fresh_objects(admin: Admin, kubeconfig: Path, resource: str, n: int, start: int) -> None:
    """`n` new objects stored in v1, then the storage version set to v2: every one is re-encoded."""
    subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), "-n", NAMESPACE, "delete", resource, "--all",
                    "--wait=false"], capture_output=True, timeout=300)  # fmt: skip
    admin.set_storage_version(resource, "v1")
    create(kubeconfig, resource, n, start)
    admin.set_storage_version(resource, "v2")


def request_names(kubeconfig: Path) -> set[str]:
    api = api_client_from_settings(Settings(kubeconfig=kubeconfig))
    try:
        return {m.metadata.name or "" for m in list_migrations(api)}
    finally:
        api.close()  # type: ignore[no-untyped-call]


def settle_requests(kubeconfig: Path, runs: list[Run], known: set[str]) -> None:
    """Each run's request (the one created since `known` for its resource): Succeeded, and rewritten."""
    api = api_client_from_settings(Settings(kubeconfig=kubeconfig))
    try:
        for m in list_migrations(api):
            if (m.metadata.name or "") in known:
                continue
            for run in runs:
                if m.spec.resource.resource == run.resource:
                    run.request = m.metadata.name or ""
                    run.succeeded = is_condition_true(m.status.conditions, CONDITION_SUCCEEDED)
                    if (progress := m.status.progress) is not None:
                        run.rewritten, run.conflicted, run.failed = (progress.rewritten, progress.conflicted,
                                                                     progress.failed)  # fmt: skip
    finally:
        api.close()  # type: ignore[no-untyped-call]


def run_env(args: argparse.Namespace) -> dict[str, str]:
    """What every run gets beyond the budget: the request's lease when --lease-seconds is given."""
    return {} if args.lease_seconds is None else {"STORAGE_MIGRATOR_LEASE_SECONDS": str(args.lease_seconds)}


def start_runs(stack: PrefectStack, kubeconfig: Path, rate: float, objects: dict[str, int], tmp: Path, tag: str,
               extra_env: dict[str, str]) -> list[Run]:  # fmt: skip
    env = {**stack.env, "STORAGE_MIGRATOR_KUBECONFIG": str(kubeconfig), "STORAGE_MIGRATOR_SHARED_WRITE_BUDGET": "true",
           "STORAGE_MIGRATOR_WRITE_RATE_PER_SECOND": str(rate), "STORAGE_MIGRATOR_RATE_LIMIT_NAME": BUDGET_LIMIT,
           **extra_env}  # fmt: skip
    runs = []
    for resource, n in objects.items():
        log = tmp / f"flow-{tag}-{resource}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-c", FLOW, resource], cwd=REPO, env=env, stdout=out,
                                    stderr=out)  # fmt: skip
        runs.append(Run(resource=resource, objects=n, proc=proc, log=log))
    return runs


def wait_runs(runs: list[Run], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for run in runs:
        try:
            run.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            run.proc.kill()
            run.proc.wait()
            print(f"  {run.resource}: killed after {timeout:.0f} s; its log ends:\n{tail(run.log)}", flush=True)


def tail(log: Path, n: int = 2500) -> str:
    return log.read_text(errors="replace")[-n:] if log.exists() else ""


def end_runs(runs: list[Run]) -> None:
    """The runs this bench started and that are still there (an error cut the case short)."""
    for run in runs:
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait()


def wait_for_writes(admin: Admin, resources: list[str], runs: list[Run], *, since: int, seconds: float) -> None:
    """Until every resource has been written for `seconds` (kubesim's clock); raises if a run ends first."""
    first: dict[str, int] = {}
    while True:
        if any(run.proc.poll() is not None for run in runs):
            ended = next(run for run in runs if run.proc.poll() is not None)
            raise SystemExit(f"{ended.resource}: the run ended before the outage (exit {ended.proc.returncode}):\n"
                             f"{tail(ended.log)}")  # fmt: skip
        for r in resources:
            if r not in first:
                per = tenths(admin, [r], since=since)
                if per:
                    first[r] = min(per)
        if len(first) == len(resources) and time.time() * 10 - max(first.values()) >= seconds * 10:
            return
        time.sleep(0.2)


def ride_out_outage(stack: PrefectStack, admin: Admin, kubeconfig: Path, sampler: WritersSampler, tmp: Path, *,
                    label: str, rate: float, objects: dict[str, int], kill_after: float, down: float,
                    extra_env: dict[str, str]) -> OutageReport:  # fmt: skip
    """Migrations started, the server killed once they have written `kill_after` s, kept down
    `down` s and started again on the same port and database; the runs left to finish."""
    resources = list(objects)
    known = request_names(kubeconfig)
    began = int(time.time() * 10)
    runs = start_runs(stack, kubeconfig, rate, objects, tmp, label.replace(" ", "-"), extra_env)
    try:
        wait_for_writes(admin, resources, runs, since=began, seconds=kill_after)
        killed = time.time()
        stack.kill_server()
        time.sleep(down)
        restarting = time.time()
        stack.start_server()
        answered = time.time()
        wait_runs(runs, timeout=sum(objects.values()) / rate * 10 + 600)
    finally:
        end_runs(runs)
    ended = time.time()
    settle_requests(kubeconfig, runs, known)
    per = tenths(admin, resources, since=began)
    k, v, r, a = (int(t * 10) for t in (killed, killed + VIEW_AGE, restarting, answered))
    completed = [run.verdict() for run in runs]
    report = OutageReport(
        label=label, down_seconds=restarting - killed, restart_seconds=answered - restarting,
        writes=sum(per.values()),
        writes_first_2_5s=sum(n for t, n in per.items() if k <= t < v),
        writes_while_down=sum(n for t, n in per.items() if v <= t < r),
        writes_while_restarting=sum(n for t, n in per.items() if r <= t < a),
        max_10s_before=max_window(rate, dense(per, end=k)),
        max_10s_after=max_window(rate, dense(per, start=r)),
        max_10s_run=max_window(rate, dense(per)),
        completed=completed,
        writers_before_kill=sampler.between(began / 10, killed),
        writers_after_restart=sampler.between(answered, ended),
        writers_after_end=sampler.read(),
        heal_lines=sum(tail(run.log, 10**9).count("writers' slots had no run") for run in runs),
    )  # fmt: skip
    print(f"  {label}: down {report.down_seconds:.1f} s (+{report.restart_seconds:.1f} s to answer again); "
          f"writes {report.writes}: {report.writes_first_2_5s} in the kill's first {VIEW_AGE} s, "
          f"{report.writes_while_down} while down, {report.writes_while_restarting} while restarting; "
          f"max 10 s before {report.max_10s_before:.3f}, after the restart {report.max_10s_after:.3f}, "
          f"run {report.max_10s_run:.3f}; writers before the kill {report.writers_before_kill}, "
          f"after the restart {report.writers_after_restart}, after the end {report.writers_after_end}; "
          f"heal lines {report.heal_lines}; {'; '.join(completed)}", flush=True)  # fmt: skip
    for run in runs:
        if not run.completed:
            print(f"  {run.resource} did not complete; its log ends:\n{tail(run.log)}", flush=True)
    return report


def measure(stack: PrefectStack, admin: Admin, kubeconfig: Path, sampler: WritersSampler, tmp: Path,
            args: argparse.Namespace, *, restarts: int, start: int) -> RestartCase:  # fmt: skip
    """A new migration of fresh ConfigMaps, measured as bench/budget.py does."""
    rate, seconds = args.rate, args.seconds
    n = max(1, round(rate * seconds))
    fresh_objects(admin, kubeconfig, "configmaps", n, start)
    known = request_names(kubeconfig)
    before = sampler.read()
    t0 = time.time()
    began = int(t0 * 10)
    runs = start_runs(stack, kubeconfig, rate, {"configmaps": n}, tmp, f"measure-{restarts}", run_env(args))
    try:
        wait_runs(runs, timeout=seconds * 10 + 300)
    finally:
        end_runs(runs)
    settle_requests(kubeconfig, runs, known)
    if not runs[0].completed:
        raise SystemExit(f"the measured migration did not complete; its log ends:\n{tail(runs[0].log)}")
    per = tenths(admin, ["configmaps"], since=began)
    case = summarize("sqlite", rate, 1, dense(per))
    first, last = min(per) / 10, (max(per) + 1) / 10
    return RestartCase(
        restarts=restarts, writes=case.writes, seconds=case.seconds, run_ratio=case.run_ratio,
        max_window_ratio=case.max_window_ratio, writers_before=before,
        writers_starting=sampler.between(t0, first), writers_during=sampler.between(first, last),
        writers_after=sampler.read(), load=os.getloadavg()[0],
    )  # fmt: skip


def keep_server_log(stack: PrefectStack, logs: Path, name: str) -> None:
    server_log = stack.home / "server.log"
    if server_log.exists():
        shutil.copy(server_log, logs / f"server-{name}.log")


def bench_restarts(args: argparse.Namespace, kubeconfig: Path, admin: Admin, tmp: Path) -> list[RestartCase]:
    stack = PrefectStack(Path(tempfile.mkdtemp(prefix="bench-budget-restarts-")))
    cases: list[RestartCase] = []
    done = 0
    start = 0  # object names never reused: fresh objects each run
    try:
        stack.start_server()
        stack.run("gcl", "create", BUDGET_LIMIT, "--limit", str(max(1, int(args.rate))),
                  "--slot-decay-per-second", str(args.rate))  # fmt: skip
        with WritersSampler(stack, BUDGET_LIMIT) as sampler:
            for k in sorted(set(args.restarts)):
                outages = []
                while done < k:
                    n = max(1, round(args.rate * args.seconds))
                    fresh_objects(admin, kubeconfig, "configmaps", n, start)
                    start += n
                    outages.append(ride_out_outage(
                        stack, admin, kubeconfig, sampler, tmp, label=f"restart {done + 1}", rate=args.rate,
                        objects={"configmaps": n}, kill_after=args.seconds / 3, down=args.down_seconds,
                        extra_env={**run_env(args), "PREFECT_CLIENT_MAX_RETRIES": "1"},
                    ))  # fmt: skip
                    done += 1
                case = measure(stack, admin, kubeconfig, sampler, tmp, args, restarts=k, start=start)
                start += case.writes
                case.outages = outages
                cases.append(case)
                print(f"{k:>8} {case.writes:>7} {case.seconds:>6.1f} {case.run_ratio:>9.3f} "
                      f"{case.max_window_ratio:>9.3f}  writers before {case.writers_before}, starting "
                      f"{case.writers_starting}, during {case.writers_during}, after {case.writers_after}; "
                      f"load {case.load:.1f}", flush=True)  # fmt: skip
    finally:
        stack.stop()
        keep_server_log(stack, tmp, "restarts")
        stack.wipe()
    return cases


def bench_outage(args: argparse.Namespace, kubeconfig: Path, admin: Admin, tmp: Path) -> OutageReport:
    stack = PrefectStack(Path(tempfile.mkdtemp(prefix="bench-budget-outage-")))
    resources = RESOURCES[: args.outage_workers]
    # Half as much again: the runs join a few seconds apart, and both must write before the kill and after it.
    each = max(1, round(args.rate * args.seconds * 1.5 / len(resources)))
    try:
        stack.start_server()
        stack.run("gcl", "create", BUDGET_LIMIT, "--limit", str(max(1, int(args.rate))),
                  "--slot-decay-per-second", str(args.rate))  # fmt: skip
        for r in resources:
            fresh_objects(admin, kubeconfig, r, each, 1_000_000)
        with WritersSampler(stack, BUDGET_LIMIT) as sampler:
            return ride_out_outage(stack, admin, kubeconfig, sampler, tmp, label=f"{len(resources)} runs",
                                   rate=args.rate, objects=dict.fromkeys(resources, each),
                                   kill_after=max(12.0, args.seconds / 3), down=args.outage_seconds,
                                   extra_env=run_env(args))  # fmt: skip
    finally:
        stack.stop()
        keep_server_log(stack, tmp, "outage")
        stack.wipe()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", nargs="+", default=["restarts", "outage"], choices=["restarts", "outage"])
    parser.add_argument("--restarts", type=int, nargs="+", default=[0, 1, 2], help="restarts before a measured run")
    parser.add_argument("--rate", type=float, default=50, help="the budget, writes/s")
    parser.add_argument("--seconds", type=float, default=30, help="seconds of writes per run")
    parser.add_argument("--down-seconds", type=float, default=20,
                        help="seconds the server stays down in a restart (its runs retry once: about 2 s)")  # fmt: skip
    parser.add_argument("--outage-workers", type=int, default=2, choices=[1, 2, 3], help="runs across the outage")
    parser.add_argument("--outage-seconds", type=float, default=60, help="seconds the server stays down")
    parser.add_argument("--lease-seconds", type=float,
                        help="STORAGE_MIGRATOR_LEASE_SECONDS for every run (default: the setting's, 600)")  # fmt: skip
    parser.add_argument("--logs", type=Path, help="keep the flows' and servers' logs in this directory")
    args = parser.parse_args()
    print(f"bench/budget_restarts.py, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {machine()}; "
          f"lease_seconds {args.lease_seconds or 'default (600)'}", flush=True)  # fmt: skip
    restart_cases: list[RestartCase] = []
    outage: OutageReport | None = None
    with tempfile.TemporaryDirectory() as tmp:
        logs = args.logs or Path(tmp)
        logs.mkdir(parents=True, exist_ok=True)
        kubesim, kubeconfig = start_kubesim(Path(tmp))
        try:
            admin = prepared(kubeconfig)
            if "restarts" in args.cases:
                print(f"budget {args.rate:.0f} writes/s, {args.seconds:.0f} s of writes per run, the server down "
                      f"{args.down_seconds:.0f} s per restart (outage runs: PREFECT_CLIENT_MAX_RETRIES=1)", flush=True)  # fmt: skip
                print(f"{'restarts':>8} {'writes':>7} {'secs':>6} {'run ratio':>9} {'max 10 s':>9}", flush=True)
                restart_cases = bench_restarts(args, kubeconfig, admin, logs)
            if "outage" in args.cases:
                print(f"{args.outage_workers} runs on one budget of {args.rate:.0f} writes/s, the server down "
                      f"{args.outage_seconds:.0f} s (default client retries)", flush=True)  # fmt: skip
                outage = bench_outage(args, kubeconfig, admin, logs)
        finally:
            kubesim.terminate()
            kubesim.wait(timeout=30)
    print(json.dumps({"restarts": [asdict(c) for c in restart_cases], "outage": asdict(outage) if outage else None}))
    print(f"end: {machine()}")


if __name__ == "__main__":
    main()
