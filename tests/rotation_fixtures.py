"""What the key-rotation tests share: the EncryptionConfiguration file of the runbook,
writers that remember what each Secret must hold, reads of etcd (DESIGN 8: a
rotation is judged by the key each stored value is encrypted with), and one
cluster of three API servers lent to one test at a time (issue 29: "one 3-server
cluster for the every-server tests"; the fixture is tests/rotation_cluster.py's).
"""

from __future__ import annotations

import base64
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conftest import install_migration_crds, wait_until
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from kubesim.admin import Admin
from kubesim.cluster import Cluster
from kubesim.etcd import prefix_end

SECRET1, SECRET2 = (base64.b64encode(bytes([n]) * 32).decode() for n in (1, 2))
KEY1, KEY2 = ("key1", SECRET1), ("key2", SECRET2)
GROUP, VERSION = "migration.k8s.io", "v1alpha1"


def config(*keys: tuple[str, str]) -> str:
    """The runbook's file: aescbc with `keys` (write key first), then identity."""
    listed = "".join(f"            - name: {name}\n              secret: {secret}\n" for name, secret in keys)
    return (
        "apiVersion: apiserver.config.k8s.io/v1\nkind: EncryptionConfiguration\nresources:\n"
        "  - resources: [secrets, configmaps]\n    providers:\n      - aescbc:\n          keys:\n"
        f"{listed}      - identity: {{}}\n"
    )


def wait(predicate: Callable[[], Any], what: str, timeout: float = 60) -> None:
    """tests/conftest.py's `wait_until`: polled 0.1 s after the first try, then less often, up to a second."""
    wait_until(predicate, what=what, timeout=timeout)


def create_secrets(api: k8s.ApiClient, namespace: str, count: int) -> None:
    """Secrets `s-0000`... holding `s0`...: the data set, not the subject, so created in parallel and
    without the client's deserialization of each answer (issue 29)."""
    core = k8s.CoreV1Api(api)

    def one(i: int) -> None:
        body = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": f"s-{i:04d}"}, "stringData": {"v": f"s{i}"}}
        answer = core.create_namespaced_secret(namespace, body, _preload_content=False)
        answer.read()
        answer.release_conn()

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(one, range(count)))


class SecretWriters(threading.Thread):
    """Creates, updates and deletes Secrets throughout; remembers what each one must hold.

    Bounded (issue 29): at most `population` Secrets of its own live at once (the oldest
    is deleted to make room), one step every `pace` seconds. A slower machine makes the
    rotation longer, so an unbounded writer at a fixed short pace wrote more objects,
    which the rotation then had to rewrite and the test to read back through every
    server: work that grew with the machine's slowness. The mix of verbs comes from the
    first steps on (a delete by the fourth), so "writers throughout" holds however short
    the run."""

    def __init__(self, api: Any, namespace: str, *, pace: float = 0.25, population: int = 12) -> None:
        super().__init__(daemon=True)
        self.core, self.namespace = k8s.CoreV1Api(api), namespace
        self.pace, self.population = pace, population
        self.expected: dict[str, str] = {}  # name -> the value of its last acknowledged write
        self.stop = threading.Event()
        self.counts = {"create": 0, "update": 0, "delete": 0}

    def _try(self, verb: str, call: Callable[..., Any], *args: Any) -> bool:
        try:
            call(*args)
        except k8s.ApiException:
            return False  # injected faults and races: not acknowledged, so not expected
        self.counts[verb] += 1
        return True

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            name, value = f"w-{n:04d}", f"v{n}"
            body = k8s.V1Secret(metadata=k8s.V1ObjectMeta(name=name), string_data={"v": value})
            if self._try("create", self.core.create_namespaced_secret, self.namespace, body):
                self.expected[name] = value
            older = sorted(self.expected)[: max(0, len(self.expected) - 2)]
            if older and n % 2 == 0:
                target, update = older[n % len(older)], f"u{n}"
                if self._try("update", self._update, target, update):
                    self.expected[target] = update
            if (
                older
                and (n % 4 == 0 or len(self.expected) > self.population)
                and self._try("delete", self.core.delete_namespaced_secret, older[0], self.namespace)
            ):
                del self.expected[older[0]]
            self.stop.wait(self.pace)

    def _update(self, name: str, value: str) -> None:
        """A read, then a replace conditional on what was read (a 409 is a lost race, retried later)."""
        current = self._read(name)
        self.core.replace_namespaced_secret(name, self.namespace, {**current, "stringData": {"v": value}})

    def _read(self, name: str) -> dict[str, Any]:
        obj = self.core.read_namespaced_secret(name, self.namespace)
        return dict(k8s.ApiClient().sanitize_for_serialization(obj))


def stored_keys(cluster: Cluster, prefix: str) -> dict[str, str]:
    """name -> the key its etcd value is encrypted with (the test's own read of etcd)."""
    etcd = cluster.etcd()
    try:
        out = {}
        for kv in etcd.range(prefix.encode(), prefix_end(prefix.encode())).kvs:
            assert kv.value.startswith(b"k8s:enc:aescbc:v1:"), kv.key
            out[kv.key.decode().rsplit("/", 1)[1]] = kv.value.split(b":")[4].decode()
        return out
    finally:
        etcd.close()


@dataclass
class ThreeServers:
    """Three API servers over one etcd, each reading its own EncryptionConfiguration file (issue 19),
    and a namespace of Secrets `s-0000`... holding `s0`..."""

    cluster: Cluster
    files: list[Path]
    kubeconfig: Path
    admins: list[Admin]
    namespace: str

    def api(self, server: int = 0) -> k8s.ApiClient:
        return k8s_config.new_client_from_config(config_file=str(self.kubeconfig), context=f"kubesim-{server}")

    def roll(self, server: int, *keys: tuple[str, str]) -> None:
        """One step of a rolling update: server `server`'s file now lists `keys` (write key first)."""
        staged = self.files[server].with_suffix(".new")  # renamed into place: a reload never reads half a file
        staged.write_text(config(*keys))
        staged.replace(self.files[server])
        names = [name for name, _ in keys]
        wait(lambda: self.admins[server].config()["encryption"]["keys"] == names,
             f"server {server} reloading its file ({names})")  # fmt: skip

    def roll_all(self, *keys: tuple[str, str]) -> None:
        for server in range(len(self.files)):
            self.roll(server, *keys)

    def migrator_writes(self) -> int:
        """Merge patches of Secrets: only the migrator sends them (writers create, replace, delete)."""
        return sum(a.counters()["requestsByResource"].get("patch secrets", 0) for a in self.admins)

    def keys_in_etcd(self) -> set[str]:
        return set(stored_keys(self.cluster, f"/registry/secrets/{self.namespace}/").values())


class SharedThreeServers:
    """One cluster of three API servers for many tests, lent to one test at a time (`borrowed`).

    What a test may rely on when it gets the cluster:
    - three API servers over one etcd, server i reading its own EncryptionConfiguration file
      `files[i]` (automatic reload every 0.2 s), each listing key1 alone (every Secret in
      etcd is under key1);
    - our CRDs installed; no StorageVersionMigration and no StorageState;
    - no fault rules, every server reporting its encryption-config metric, every server's
      request counters at zero (so `migrator_writes()` counts this test's writes only);
    - a namespace of its own (`namespace`) holding the `secrets` Secrets it asked for, and no
      other namespace of an earlier test.
    What it puts back when it ends, whether it passed or not (done here, not by the test):
    every namespace created since it began deleted (their Secrets with them, whatever their
    key: a namespace's contents go without being read), every migration request and
    StorageState deleted, fault rules cleared, metrics reported again, every file back to
    key1 alone. What a test must not do: restart, add or remove a server, or change the
    kubeconfig file (a copy of its own is fine). Prefect runs, artifacts, variables and the
    ledger's rows are the session's: a test tells its own by key, name or start time.
    If putting back fails, the cluster is stopped and the next test gets a new one."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files = [root / f"encryption-config-{i}.yaml" for i in range(3)]
        self._cluster: Cluster | None = None
        self._starts = 0

    def _start(self) -> Cluster:
        for path in self.files:
            path.write_text(config(KEY1))
        cluster = Cluster(servers=3, encryption_config=self.files, automatic_reload=True, reload_interval=0.2)
        cluster.start()
        try:
            kubeconfig = cluster.write_kubeconfig(self.root / f"kubeconfig-{self._starts}")
            self._starts += 1
            with k8s_config.new_client_from_config(config_file=str(kubeconfig)) as api:
                install_migration_crds(api)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def stop(self) -> None:
        if self._cluster is not None:
            self._cluster.stop()
            self._cluster = None

    @contextmanager
    def borrowed(self, *, secrets: int) -> Iterator[ThreeServers]:
        if self._cluster is None:
            self._cluster = self._start()
        cluster = self._cluster
        assert cluster.kubeconfig is not None
        admins = [Admin(s.url) for s in cluster.servers]
        for admin in admins:
            admin.reset_counters()
        api = k8s_config.new_client_from_config(config_file=str(cluster.kubeconfig))
        core = k8s.CoreV1Api(api)
        before = {ns.metadata.name for ns in core.list_namespace().items}
        namespace = f"t-{uuid.uuid4().hex[:8]}"
        core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=namespace)))
        create_secrets(api, namespace, secrets)
        lent = ThreeServers(cluster=cluster, files=self.files, kubeconfig=cluster.kubeconfig, admins=admins,
                            namespace=namespace)  # fmt: skip
        try:
            yield lent
        finally:
            try:
                self._put_back(lent, api, before)
            except BaseException:
                self.stop()  # the next test gets a new cluster rather than this one's leftovers
                raise
            finally:
                api.close()

    def _put_back(self, lent: ThreeServers, api: k8s.ApiClient, before: set[str]) -> None:
        for admin in lent.admins:
            admin.clear_faults()
            admin.set_metrics(encryption_config_info=True)
        core, custom = k8s.CoreV1Api(api), k8s.CustomObjectsApi(api)
        for ns in core.list_namespace().items:
            if ns.metadata.name not in before:
                core.delete_namespace(ns.metadata.name)
        for plural in ("storageversionmigrations", "storagestates"):
            for item in custom.list_cluster_custom_object(GROUP, VERSION, plural)["items"]:
                custom.delete_cluster_custom_object(GROUP, VERSION, plural, item["metadata"]["name"])
        # No Secret is left under another key (the test's namespaces are gone): key1 alone reads them all.
        assert set(stored_keys(lent.cluster, "/registry/secrets/").values()) <= {"key1"}
        lent.roll_all(KEY1)
