"""The demo's fleet part (`--clusters 2`, issue 20): a second cluster on the same Prefect server.

8. cluster-b, a second kubesim over its own etcd, in pull mode (issue 30):
   `storage-migrator fleet add cluster-b --pool storage-migrator-cluster-b --uid UID` (its
   kube-system uid, read from it: issue 35) gives it its own deployments (its detection schedule, its dispatcher) on a pool of its own, served by
   a worker of its own that alone holds its kubeconfig (as its in-cluster worker would hold
   its ServiceAccount): the Prefect server holds no credential of it; its first polls
   migrate it;
9. a fleet key rotation: key3 made the write key on both clusters, then one
   `rotate-encryption-key` run for `default` and `cluster-b`, a verdict per cluster;
10. what etcd holds on each, and `storage-migrator status|history --all-clusters`.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes.client import CoreV1Api

from devstack import REPO, PrefectStack
from kubesim.admin import Admin
from kubesim.cluster import Cluster
from kubesim.etcd import EtcdStore
from storage_migrator.kube.connection import api_client_from_settings
from storage_migrator.settings import Settings

NAME = "cluster-b"
POOL = f"storage-migrator-{NAME}"


def storage_migrator(stack: PrefectStack, kubeconfig: Path, *args: str) -> str:
    """The CLI as an operator runs it: against the demo's Prefect server, `kubeconfig` its default cluster."""
    env = {**stack.env, "STORAGE_MIGRATOR_KUBECONFIG": str(kubeconfig)}
    done = subprocess.run([sys.executable, "-m", "storage_migrator.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    return done.stdout + done.stderr


def watch_poll(stack: PrefectStack, deployment: str) -> None:
    """One run of a detection deployment, waited for. The deployment runs one poll at a time
    (CANCEL_NEW): when the schedule's own poll holds the slot, ours is Cancelled at once; it is
    asked again once that one is over."""
    for _ in range(20):
        try:
            stack.run("deployment", "run", deployment, "--watch")
            return
        except RuntimeError as exc:
            if "finished in state 'Cancelled'" not in str(exc):
                raise
        time.sleep(3)
    raise SystemExit(f"demo: every poll of {deployment} asked for was cancelled: another poll kept it busy")


def second_cluster(stack: PrefectStack, workdir: Path, *, objects: int, first_admin: Admin, first_etcd: EtcdStore,
                   seed: Callable[[Any, int], None], wait_for_migrations: Callable[..., Any],
                   report: Callable[[str, EtcdStore], dict[str, Any]], engine: str = "client") -> bool:  # fmt: skip
    """Steps 8-10; True when etcd holds only key3 for the Secrets of both clusters. `engine` (issue 36): the second
    cluster's install runs it (pull mode: the cluster decides), and `fleet add --engine` says the same."""
    gates = {"StorageVersionMigrator": True} if engine != "client" else None
    with Cluster(feature_gates=gates) as cluster:
        kubeconfig = cluster.write_kubeconfig(workdir / f"{NAME}.kubeconfig")
        admin, etcd = Admin(cluster.server.url), cluster.etcd()
        api = api_client_from_settings(Settings(kubeconfig=kubeconfig))
        try:
            print(f"\n8. A second cluster, {NAME}: kubesim on {cluster.server.url}, in pull mode: a worker of its own "
                  f"on pool {POOL}, which alone holds its kubeconfig")  # fmt: skip
            seed(api, objects)
            # Its identity read from the cluster itself and pinned before any run (issue 35: no trust on first use).
            uid = str(CoreV1Api(api).read_namespace("kube-system").metadata.uid)
            print(storage_migrator(stack, workdir / "kubeconfig", "fleet", "add", NAME, "--pool", POOL, "--uid", uid,
                                   "--engine", engine))  # fmt: skip
            stack.start_worker(f"worker-{NAME}", pool=POOL, env={"STORAGE_MIGRATOR_CLUSTER": NAME,
                                                                 "STORAGE_MIGRATOR_KUBECONFIG": str(kubeconfig),
                                                                 "STORAGE_MIGRATOR_ENGINE": engine})  # fmt: skip
            started = time.monotonic()
            watch_poll(stack, f"detect-storage-changes/{NAME}")
            wait_for_migrations(api, timeout=900)
            watch_poll(stack, f"detect-storage-changes/{NAME}")
            print(f"   {NAME}: first poll, migrations and refinement in {time.monotonic() - started:.0f} s")
            print("\n9. A fleet key rotation: key3 made the write key on both clusters, then one run for both")
            first_admin.set_encryption(["key2", "key3", "key1"])  # seed 003: readable first, then the write key
            first_admin.set_encryption(["key3", "key2", "key1"])
            admin.set_encryption(["key1", "key3"])
            admin.set_encryption(["key3", "key1"])
            stack.run("deployment", "run", "rotate-encryption-key/rotate-encryption-key", "--param", "key=key3",
                      "--param", f'clusters=["default", "{NAME}"]', "--param", 'resources=["secrets"]',
                      "--watch")  # fmt: skip
            print("\n10. What etcd holds, cluster by cluster")
            ok = True
            for name, store in (("default", first_etcd), (NAME, etcd)):
                secrets = report(f"   {name}:", store)["secrets"]
                ok = ok and set(secrets) == {"encrypted with key3"}
            print(f"\n   storage-migrator status (the default cluster), and with {NAME}'s kubeconfig (pull mode: the "
                  "server has no credential of it)")  # fmt: skip
            print(storage_migrator(stack, workdir / "kubeconfig", "status"))
            print(storage_migrator(stack, Path(kubeconfig), "status"))
            print("   storage-migrator history --all-clusters --limit 8")
            print(storage_migrator(stack, workdir / "kubeconfig", "history", "--all-clusters", "--limit", "8"))
            print(f"   Both clusters' Secrets are under key3 only: {'yes' if ok else 'NO'}. In the Prefect UI, "
                  f"filter the runs by tag cluster:{NAME} or cluster:default.")  # fmt: skip
            return ok
        finally:
            etcd.close()
            api.close()  # type: ignore[no-untyped-call]
