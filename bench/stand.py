"""What the benchmarks share: etcd and kubesim in processes of their own, objects to
migrate, the machine, the figures.

Issue 13: kubesim runs in ANOTHER process than the code measured, so the
client's CPU is not shared with the server's (`python -m kubesim serve`, which
starts its own etcd on /dev/shm unless given one). A scale run starts its etcd
itself when its flags matter (10^6 objects need more than etcd's 2 GB quota),
and a chaos run does so that kubesim can be killed and started again over the
same data. Each benchmark measures a baseline in the same run, interleaves
repetitions with it and prints median and spread.

Run the scripts as modules (`uv run python -m bench.<script>`); the older ones
also run as files (`uv run python bench/<script>.py`, importing `stand`).
"""

from __future__ import annotations

import logging
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from kubernetes.client import ApiClient

from kubesim.admin import Admin
from kubesim.etcd import EtcdProcess, free_port
from storage_migrator.kube.resources import ResourceRef
from storage_migrator.kube.writing import create_object

REPO = Path(__file__).resolve().parents[1]
CONFIGMAPS = ResourceRef(version="v1", resource="configmaps")
NAMESPACES = ResourceRef(version="v1", resource="namespaces")

# etcd's defaults (2 GB backend, 128 operations per transaction) are too small to
# seed and migrate 10^6 objects: every migration adds one revision per object.
BIG_ETCD_FLAGS = ("--quota-backend-bytes", str(16 * 1024**3), "--max-txn-ops", "1024",
                  "--max-request-bytes", str(8 * 1024**2))  # fmt: skip


def start_etcd(*, big: bool = True) -> EtcdProcess:
    return EtcdProcess(extra_args=BIG_ETCD_FLAGS if big else ()).start()


class KubesimProcess:
    """`python -m kubesim serve` in a child process, with its kubeconfig, URL and admin client.

    `etcd_url`: a running etcd (else kubesim starts one of its own, gone with it).
    `kill()` then `start()` is an API server crash and restart: the same port,
    the same etcd, `authz_warmup` seconds of 403s (kube-apiserver's RBAC caches
    filling), and the same `encryption_config` file (what survives a restart;
    settings made through the admin API do not).
    """

    def __init__(self, workdir: Path, etcd_url: str | None = None, *, authz_warmup: float = 0.0,
                 encryption_config: Path | None = None) -> None:  # fmt: skip
        self.kubeconfig = str(workdir / "kubeconfig")
        self.cert_dir = workdir / "pki"  # kept across a restart, as a real API server's certificates are
        self.log = workdir / "kubesim.log"
        self.etcd_url = etcd_url
        self.authz_warmup = authz_warmup
        self.encryption_config = encryption_config
        self.url = ""
        self.port = free_port()  # chosen once: a restart is the same server (same port, same apiServerID)
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def admin(self) -> Admin:
        return Admin.from_kubeconfig(self.kubeconfig)

    @property
    def ca_pem(self) -> bytes:
        """The CA its serving certificate chains to (the same after a restart: `--cert-dir`)."""
        return (self.cert_dir / "ca.crt").read_bytes()

    def start(self, *, timeout: float = 60) -> KubesimProcess:
        argv = [sys.executable, "-m", "kubesim", "serve", "--kubeconfig", self.kubeconfig, "--port", str(self.port),
                "--authz-warmup", str(self.authz_warmup), "--cert-dir", str(self.cert_dir)]  # fmt: skip
        if self.etcd_url:
            argv += ["--etcd", self.etcd_url]
        if self.encryption_config:
            argv += ["--encryption-provider-config", str(self.encryption_config)]
        offset = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as log:
            self._proc = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:
            text = self.log.read_bytes()[offset:].decode(errors="replace")
            found = re.search(r"API server 0 on (\S+)", text)
            if found and "kubeconfig written" in text:
                self.url = found.group(1)
                self.port = int(self.url.rsplit(":", 1)[1])
                return self
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"kubesim did not start: {text[-2000:]}")
            time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL: a crash, no goodbye to the clients."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGKILL)
            self._proc.wait()

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


@contextmanager
def kubesim_process(*, timeout: float = 60.0) -> Iterator[KubesimProcess]:
    """kubesim and its own etcd in a child process, in a temporary directory; both stopped on exit."""
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        sim = KubesimProcess(Path(tmp)).start(timeout=timeout)
        try:
            yield sim
        finally:
            sim.stop()


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


def quiet_unbudgeted_flows() -> None:
    """The environment of a process that runs the flow to measure it: no telemetry, no cache,
    warnings only, and no shared write budget (each pass paces itself, or not at all)."""
    os.environ.update({"DO_NOT_TRACK": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                       "PREFECT_TASKS_DEFAULT_NO_CACHE": "true", "PREFECT_LOGGING_LEVEL": "WARNING",
                       "STORAGE_MIGRATOR_SHARED_WRITE_BUDGET": "false"})  # fmt: skip
    logging.getLogger("prefect").setLevel(logging.WARNING)


def machine() -> str:
    """What the figures were measured on (issue 13: name the machine, and the load)."""
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    mem_kb = next(int(line.split()[1]) for line in meminfo if line.startswith("MemTotal:"))
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {os.cpu_count()} cores, "
            f"{mem_kb / 1024**2:.0f} GiB RAM, Python {platform.python_version()}; load average {load}")  # fmt: skip


def median_spread(values: Sequence[float], *, digits: int = 0) -> str:
    """`median (min-max)` of repeated measurements: the machine is shared, one run is an anecdote."""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def ratios(values: Sequence[float], baseline: Sequence[float]) -> list[float]:
    """Each repetition against the baseline measured next to it (interleaved)."""
    return [v / b for v, b in zip(values, baseline, strict=True)]


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started
