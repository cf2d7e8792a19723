"""Issue 29: the CPU a deployed `migrate-resource` run spends from its process's start to its
first task, against Prefect's own import measured in the same run.

Every worker-spawned run pays it: the e2e tier's, and every user's deployed run. The stack is
the real one: kubesim (and its etcd) in a process of its own, `prefect server start` and a
process worker (devstack), `prefect deploy --all`. Per repetition, interleaved:

- the baseline: `python -c "import prefect"` in a fresh process, its user+system CPU;
- one `migrate-resource` run over a few ConfigMaps, started as `prefect deployment run` does.
  A sampler reads the CPU of the run's process and of any it starts (found under the worker by
  the run's id in its environment; a process worker's run is one process that prepares the run
  and then execs the engine, so one pid carries both) every 10 ms, with the wall clock; the first task run's start
  time (from the API, once the run has ended) says where to read it.

The goal (issue 29): start-to-first-task <= Prefect's import + 1 s. `python -X importtime` of
the flow's module then lists the heaviest imports of ours beyond Prefect's.

    uv run python -m bench.flow_run_start [--repeat 5] [--objects 20]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bench.stand import REPO, create_configmaps, kubesim_process, machine, median_spread
from devstack import PrefectStack, descendants
from storage_migrator.kube.connection import api_client_from_settings
from storage_migrator.settings import Settings

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def child_cpu(argv: list[str]) -> float:
    """User+system CPU seconds of a fresh process running `argv` (getrusage of the reaped child)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, check=True, env={**os.environ, "DO_NOT_TRACK": "1"}, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _cpu_of(pid: int) -> float | None:
    """The CPU of `pid` and of every process under it, ended ones included (the children a
    `prefect flow-run execute` starts count as much as a supervisor that execs the engine)."""
    total = 0
    for each in (pid, *descendants(pid)):
        try:
            fields = Path(f"/proc/{each}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            if each == pid:
                return None
            continue
        total += sum(int(f) for f in fields[11:15])  # utime, stime, and those of reaped children
    return total / CLOCK_TICKS


def _runs_id(pid: int) -> str | None:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in environ:
        if item.startswith(b"PREFECT__FLOW_RUN_ID="):
            return item.split(b"=", 1)[1].decode()
    return None


@dataclass
class Trace:
    """The CPU of one flow run's process over time: (wall clock, CPU seconds) samples."""

    flow_run_id: str
    pid: int | None = None
    samples: list[tuple[float, float]] | None = None

    def cpu_at(self, wall: float) -> float | None:
        """The CPU at `wall`: the last sample at or before it."""
        before = [cpu for t, cpu in self.samples or [] if t <= wall]
        return before[-1] if before else None

    @property
    def total(self) -> float | None:
        return self.samples[-1][1] if self.samples else None


def follow(worker_pid: int, trace: Trace, stop: threading.Event) -> None:
    """Find the run's process under the worker, then sample its CPU every 10 ms until it ends."""
    while trace.pid is None and not stop.is_set():
        trace.pid = next((p for p in descendants(worker_pid) if _runs_id(p) == trace.flow_run_id), None)
        if trace.pid is None:
            time.sleep(0.005)
    trace.samples = []
    while trace.pid is not None and not stop.is_set():
        cpu = _cpu_of(trace.pid)
        if cpu is None:
            return
        trace.samples.append((time.time(), cpu))
        time.sleep(0.01)


def one_run(stack: PrefectStack, worker_pid: int) -> tuple[float, float]:
    """One `migrate-resource` run: (CPU from its process's start to its first task, CPU in all)."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.client.schemas.sorting import TaskRunSort

    with stack.client() as client:
        deployment = client.read_deployment_by_name("migrate-resource/migrate-resource")
        run = client.create_flow_run_from_deployment(deployment.id, parameters={"resource": "configmaps"})
        trace, stop = Trace(flow_run_id=str(run.id)), threading.Event()
        sampler = threading.Thread(target=follow, args=(worker_pid, trace, stop), daemon=True)
        sampler.start()
        deadline = time.monotonic() + 300
        while not (state := client.read_flow_run(run.id).state) or not state.is_final():
            if time.monotonic() > deadline:
                raise RuntimeError(f"run {run.id} did not end in 300 s")
            time.sleep(0.5)
        sampler.join(timeout=10)
        stop.set()
        if not state.is_completed():
            raise RuntimeError(f"run {run.id} ended {state.name}: {state.message}")
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])),
                                      sort=TaskRunSort.EXPECTED_START_TIME_ASC)  # fmt: skip
    started = [t.start_time for t in tasks if t.start_time is not None]
    if not started or trace.total is None:
        raise RuntimeError(f"run {run.id}: no task run started, or its process was not found")
    first = trace.cpu_at(min(started).timestamp())
    if first is None:
        raise RuntimeError(f"run {run.id}: its process was found only after its first task")
    return first, trace.total


def set_command(stack: PrefectStack, command: str) -> None:
    from prefect.client.schemas.actions import DeploymentUpdate

    with stack.client() as client:
        deployment = client.read_deployment_by_name("migrate-resource/migrate-resource")
        variables = {**(deployment.job_variables or {}), "command": command}
        client.update_deployment(deployment.id, DeploymentUpdate(job_variables=variables))


def heaviest_imports(module: str, *, beyond: str = "prefect", top: int = 8) -> list[tuple[str, float]]:
    """`python -X importtime -c "import prefect; import MODULE"`: MODULE's own cumulative import time,
    then the heaviest imports under it (cumulative seconds), i.e. what the flow adds to Prefect's."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {beyond}; import {module}"],
                          capture_output=True, text=True, check=True, cwd=REPO)  # fmt: skip
    rows = [line.split("|") for line in done.stderr.splitlines() if line.startswith("import time:")][1:]
    at = max(i for i, row in enumerate(rows) if row[2] == f" {module}")
    under: list[tuple[str, float]] = []
    for row in reversed(rows[:at]):  # importtime prints a module after everything it imported
        if not row[2].startswith("   "):
            break
        under.append((row[2].rstrip(), int(row[1]) / 1e6))
    return [(module, int(rows[at][1]) / 1e6), *sorted(under, key=lambda r: -r[1])[:top]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5, help="runs, each with its baseline next to it")
    parser.add_argument("--objects", type=int, default=20, help="ConfigMaps the runs migrate")
    parser.add_argument(
        "--command",
        default=None,
        help="the deployment's `command` job variable (e.g. 'python -m prefect.engine'): the "
        "process worker then starts the engine directly instead of its workspace supervisor",
    )
    args = parser.parse_args()
    print(f"bench/flow_run_start.py, {machine()}", flush=True)
    baseline_argv = [sys.executable, "-c", "import prefect"]
    with kubesim_process() as sim, tempfile.TemporaryDirectory(prefix="bench-flow-start-") as tmp:
        api = api_client_from_settings(Settings(kubeconfig=sim.kubeconfig))
        create_configmaps(api, args.objects, namespace="bench", threads=4, size=100)
        subprocess.run(["kubectl", "--kubeconfig", sim.kubeconfig, "apply", "-f", str(REPO / "deployments" / "crds"), "-f", str(REPO / "deployments" / "rbac")],
                       check=True, capture_output=True)  # fmt: skip
        stack = PrefectStack(Path(tmp) / "prefect", worker_env={"STORAGE_MIGRATOR_KUBECONFIG": sim.kubeconfig,
                                                                 "PREFECT_LOGGING_LEVEL": "WARNING"})  # fmt: skip
        try:
            stack.start_server()
            stack.deploy()
            if args.command:
                set_command(stack, args.command)
            stack.start_worker()
            one_run(stack, stack.worker_pid())  # warm: the first run also writes .pyc files
            imports, starts, totals = [], [], []
            for i in range(args.repeat):
                imports.append(child_cpu(baseline_argv))
                start, total = one_run(stack, stack.worker_pid())
                starts.append(start)
                totals.append(total)
                print(f"run {i + 1}: import prefect {imports[-1]:.2f} s; flow run: first task at {start:.2f} s, "
                      f"{total:.2f} s in all", flush=True)  # fmt: skip
        finally:
            stack.stop()
    over = [s - b for s, b in zip(starts, imports, strict=True)]
    print("\nCPU seconds, median (min-max) over", args.repeat, "runs")
    print(f"  import prefect (baseline)             {median_spread(imports, digits=2)}")
    print(f"  flow-run process, start to first task {median_spread(starts, digits=2)}")
    print(f"  ... minus the baseline                {median_spread(over, digits=2)}  (goal: <= 1.00)")
    print(f"  flow-run process, whole run           {median_spread(totals, digits=2)}")
    print(
        f"  ratio start-to-first-task / baseline  {statistics.median(s / b for s, b in zip(starts, imports, strict=True)):.2f}"
    )
    print("\nflows.migrate_resource's import beyond Prefect's, and its heaviest parts (cumulative s, one run):")
    for name, seconds in heaviest_imports("flows.migrate_resource"):
        print(f"  {seconds:6.3f}  {name}")
    print(f"end: {machine()}")


if __name__ == "__main__":
    main()
