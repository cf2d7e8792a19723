"""What the benchmarks share: kubesim in its own process, objects to migrate, the machine, the figures.

Issue 13: kubesim runs in ANOTHER process than the code measured, so the
client's CPU is not shared with the server's (`python -m kubesim serve`, which
starts its own etcd on /dev/shm). Each benchmark measures a baseline in the
same run, interleaves repetitions with it and prints median and spread.
"""

from __future__ import annotations

import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kubernetes.client import ApiClient

from kubesim.admin import Admin
from storage_migrator.kube.resources import ResourceRef
from storage_migrator.kube.writing import create_object

REPO = Path(__file__).resolve().parents[1]
CONFIGMAPS = ResourceRef(version="v1", resource="configmaps")
NAMESPACES = ResourceRef(version="v1", resource="namespaces")


@dataclass(frozen=True)
class KubesimProcess:
    """A running `python -m kubesim serve`: its kubeconfig, API URL and admin client."""

    kubeconfig: str
    url: str
    admin: Admin


@contextmanager
def kubesim_process(*, timeout: float = 60.0) -> Iterator[KubesimProcess]:
    """Start kubesim (and its etcd) in a child process; stop both on exit."""
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        kubeconfig = str(Path(tmp) / "kubeconfig")
        log = Path(tmp) / "kubesim.log"
        with log.open("w") as out:
            proc = subprocess.Popen([sys.executable, "-m", "kubesim", "serve", "--kubeconfig", kubeconfig],
                                    cwd=REPO, stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
        try:
            deadline = time.monotonic() + timeout
            url = None
            while url is None:
                found = re.search(r"API server 0 on (\S+)", log.read_text())
                if found and Path(kubeconfig).exists():
                    url = found.group(1)
                elif proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"kubesim did not start:\n{log.read_text()}")
                else:
                    time.sleep(0.1)
            yield KubesimProcess(kubeconfig=kubeconfig, url=url, admin=Admin(url))
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def create_configmaps(api: ApiClient, n: int, *, namespace: str, threads: int, size: int) -> float:
    """`n` ConfigMaps of about `size` bytes in a new namespace; the creations per second."""
    create_object(api, NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})

    def create(i: int) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"cm-{i:06d}", "labels": {"bench": "migrate"}},
            "data": {"payload": f"{i:06d}".ljust(size, "x")},
        }
        create_object(api, CONFIGMAPS, body, namespace=namespace)

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        list(pool.map(create, range(n)))
    return n / (time.perf_counter() - started)


def machine() -> str:
    """What the figures were measured on (issue 13: name the machine, and the load)."""
    free = subprocess.run(["free", "-h"], capture_output=True, text=True, check=False).stdout.splitlines()
    memory = free[1].split()[1] if len(free) > 1 else "?"
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} cores, {memory} RAM, "
            f"Python {platform.python_version()}; load average {load}")  # fmt: skip


def median_spread(values: Sequence[float]) -> str:
    """`median (min-max)` of repeated measurements."""
    return f"{statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f})"


def ratios(values: Sequence[float], baseline: Sequence[float]) -> list[float]:
    """Each repetition against the baseline measured next to it (interleaved)."""
    return [v / b for v, b in zip(values, baseline, strict=True)]


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started
