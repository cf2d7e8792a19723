"""`python -m kubesim serve|admin`, as other tools drive it: a subprocess that
starts its own etcd, writes a kubeconfig, serves until SIGTERM and then stops
what it started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def kubesim_cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kubesim", *args], cwd=REPO, capture_output=True, text=True, timeout=60, check=check
    )


def test_help_documents_both_commands() -> None:
    serve = kubesim_cli("serve", "--help").stdout
    admin = kubesim_cli("admin", "--help").stdout
    assert "--kubeconfig" in serve and "--etcd" in serve and "SIGTERM" in serve
    for command in ("storage-version", "encryption", "compact", "faults", "counters", "stored"):
        assert command in admin


def _wait_for_kubeconfig(proc: subprocess.Popen[str], path: Path) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        if proc.poll() is not None:
            pytest.fail(f"kubesim serve exited early: {proc.stdout.read() if proc.stdout else ''}")
        if time.monotonic() > deadline:
            pytest.fail("kubesim serve wrote no kubeconfig in 60 s")
        time.sleep(0.1)


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


IN_TREE_API = ("--feature-gates", "StorageVersionMigrator=true")
SVM_OFF = ("--no-svm-controller", "--svm-gc-delay", "0.5", "--kcm-kube-api-qps", "20", "--kcm-kube-api-burst", "30")


def test_serve_then_admin_then_sigterm_stops_everything(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    proc = subprocess.Popen(
        [sys.executable, "-m", "kubesim", "serve", "--kubeconfig", str(kubeconfig), *IN_TREE_API, *SVM_OFF],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _wait_for_kubeconfig(proc, kubeconfig)
        doc = yaml.safe_load(kubeconfig.read_text())
        assert doc["current-context"] == "kubesim"
        etcd_pids = _children(proc.pid)
        assert etcd_pids, "serve started no etcd child"

        out = subprocess.run(
            ["kubectl", "--kubeconfig", str(kubeconfig), "get", "namespaces", "-o", "name"],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout  # fmt: skip
        assert "namespace/default" in out.split()

        state = json.loads(kubesim_cli("admin", "--kubeconfig", str(kubeconfig), "state").stdout)
        assert state["storageVersions"]["configmaps"] == "v1"
        assert state["featureGates"] == {"StorageVersionAPI": True, "StorageVersionMigrator": True}
        # kcm's storage version migrator: off as served, switched on and restarted by the admin CLI.
        svm = state["svmController"]
        assert (svm["enabled"], svm["running"], svm["gcDelaySeconds"], svm["kubeAPIQPS"], svm["kubeAPIBurst"]) == (
            False, False, 0.5, 20.0, 30,
        )  # fmt: skip
        svm = json.loads(kubesim_cli("admin", "--kubeconfig", str(kubeconfig), "svm-controller", "--enable",
                                     "--restart").stdout)  # fmt: skip
        assert (svm["enabled"], svm["running"], svm["restarts"]) == (True, True, 1)
        zero = kubesim_cli("admin", "--kubeconfig", str(kubeconfig), "svm-controller", "--qps", "0", check=False)
        assert zero.returncode == 2 and "expected a number above 0" in zero.stderr
        gates = kubesim_cli("admin", "--kubeconfig", str(kubeconfig), "feature-gates", "StorageVersionMigrator=false")
        assert json.loads(gates.stdout) == {"StorageVersionAPI": True, "StorageVersionMigrator": False}
        unknown = kubesim_cli("admin", "--kubeconfig", str(kubeconfig), "feature-gates", "Nope=true", check=False)
        assert unknown.returncode == 2 and "GATE=true|false" in unknown.stderr
        changed = kubesim_cli("admin", "--kubeconfig", str(kubeconfig), "storage-version", "configmaps", "v2")
        assert json.loads(changed.stdout)["storageVersions"]["configmaps"] == "v2"

        bad = kubesim_cli("admin", "--kubeconfig", str(kubeconfig), "storage-version", "configmaps", "two", check=False)
        assert bad.returncode == 2
        assert "not a Kubernetes API version" in bad.stderr

        kubesim_cli("admin", "--kubeconfig", str(kubeconfig), "faults", "add", "--verb", "list", "--code", "503")
        assert (
            json.loads(kubesim_cli("admin", "--kubeconfig", str(kubeconfig), "faults", "list").stdout)[0]["code"] == 503
        )
        failed = subprocess.run(
            ["kubectl", "--kubeconfig", str(kubeconfig), "get", "configmaps", "--request-timeout=5s"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert failed.returncode != 0
        kubesim_cli("admin", "--kubeconfig", str(kubeconfig), "faults", "clear")
        counters = json.loads(kubesim_cli("admin", "--kubeconfig", str(kubeconfig), "counters").stdout)
        assert counters["faultsFired"] >= 1

        stored = kubesim_cli("admin", "--kubeconfig", str(kubeconfig), "stored", "/registry/namespaces/").stdout
        assert "/registry/namespaces/default" in stored and "apiVersion=v1 kind=Namespace" in stored

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert proc.stdout is not None and "kubesim: stopped" in proc.stdout.read()
        for pid in etcd_pids:  # the etcd it started is gone too
            deadline = time.monotonic() + 10
            while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not os.path.exists(f"/proc/{pid}") or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_serve_without_etcd_binary_says_how_to_install(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path)}  # no etcd on PATH
    code = (
        "import sys; import kubesim.etcd as e; e.ETCD_BINARY='etcd-missing';"
        "p = e.EtcdProcess(binary='/nonexistent/etcd');"
        "\ntry:\n    p.start()\nexcept RuntimeError as exc:\n    print(exc); sys.exit(3)\nfinally:\n    p.stop()"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 3
    assert "apt-get install -y etcd-server" in result.stdout
