"""The processes a scale benchmark starts, each apart from the code it measures.

Issue 13: kubesim runs in another process than the migrator (so the client's
CPU is not the server's), over an etcd we start ourselves when its flags matter
(a 10^6-object run needs a larger `--quota-backend-bytes` than etcd's 2 GB).
Also the figures every benchmark prints: the machine, medians and spread.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from kubesim.etcd import EtcdProcess

REPO = Path(__file__).resolve().parents[1]

# etcd's defaults (2 GB backend, 128 operations per transaction) are too small to
# seed and migrate 10^6 objects: every migration adds one revision per object.
BIG_ETCD_FLAGS = ("--quota-backend-bytes", str(16 * 1024**3), "--max-txn-ops", "1024",
                  "--max-request-bytes", str(8 * 1024**2))  # fmt: skip


def start_etcd(*, big: bool = True) -> EtcdProcess:
    return EtcdProcess(extra_args=BIG_ETCD_FLAGS if big else ()).start()


class KubesimProcess:
    """`python -m kubesim serve --etcd URL` in a child process, with its kubeconfig."""

    def __init__(self, workdir: Path, etcd_url: str) -> None:
        self.kubeconfig = workdir / "kubeconfig"
        self.log = workdir / "kubesim.log"
        self.etcd_url = etcd_url
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, *, timeout: float = 60) -> KubesimProcess:
        with open(self.log, "wb") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "kubesim", "serve", "--kubeconfig", str(self.kubeconfig),
                 "--etcd", self.etcd_url],
                cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while b"kubeconfig written" not in self.log.read_bytes():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"kubesim did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.2)
        return self

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


def machine() -> str:
    """nproc, memory, python and the load when the run started (issue 13: name the machine)."""
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    mem_kb = next(int(line.split()[1]) for line in meminfo if line.startswith("MemTotal:"))
    load = os.getloadavg()
    return (f"{os.cpu_count()} CPUs, {mem_kb / 1024**2:.0f} GiB RAM, Python {platform.python_version()}, "
            f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")  # fmt: skip


def median_spread(values: list[float]) -> str:
    """`median (min-max)` of a few runs: the machine is shared, one run is an anecdote."""
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"
