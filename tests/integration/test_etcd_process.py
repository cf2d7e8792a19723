"""kubesim's etcd child process: it must not outlive the process that started it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STARTER = (
    "import time; from kubesim.etcd import EtcdProcess; EtcdProcess().start(); print('up', flush=True); time.sleep(600)"
)


def _state(pid: int) -> str:
    """The process's state letter (Z: a zombie, dead but not reaped), or "" once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return ""
    return next(line.split()[1] for line in status.splitlines() if line.startswith("State:"))


def test_etcd_dies_with_the_process_that_started_it_even_by_sigkill() -> None:
    """Tests kill kubesim and migrator processes on purpose (chaos campaigns, restarts); an etcd
    left behind would hold its port and /dev/shm data for good. Nothing of Python runs in the
    child between fork and exec (gRPC's fork handlers once killed it there), so the process is
    etcd itself, not a wrapper."""
    with subprocess.Popen([sys.executable, "-c", STARTER], cwd=REPO, stdout=subprocess.PIPE, text=True) as starter:
        try:
            assert starter.stdout is not None and starter.stdout.readline().strip() == "up"
            children = Path(f"/proc/{starter.pid}/task/{starter.pid}/children").read_text().split()
            assert len(children) == 1, children
            etcd = int(children[0])
            assert Path(f"/proc/{etcd}/exe").resolve().name == "etcd"
        finally:
            starter.kill()
    deadline = time.monotonic() + 30
    while _state(etcd) not in ("", "Z") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _state(etcd) in ("", "Z"), f"etcd (pid {etcd}) outlived its parent: state {_state(etcd)}"
