"""The shipped role proven (issue 14, item 4): every flow runs as a ServiceAccount bound
only to deployments/rbac/storage-migrator.yaml, and no rule of it can be removed.

A cluster of this module's own with kubesim's authentication (a token file) and RBAC
on, as kube-apiserver's --token-auth-file and --authorization-mode=RBAC. The
manifests are applied with the admin token; the migrator runs with the token of
`system:serviceaccount:storage-migrator:storage-migrator`. The default bindings
`system:discovery` and `system:public-info-viewer` are removed, as on a hardened
cluster, so that the role alone must grant discovery and `/readyz` too.
"""

from __future__ import annotations

import copy
import json
import re
import secrets
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import install_migration_crds
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import utils as k8s_utils

from kubesim import codec, tls
from kubesim.admin import Admin
from kubesim.authn import UserInfo
from kubesim.cluster import Cluster
from kubesim.etcd import EtcdStore, prefix_end
from kubesim.rbac_authorizer import Attributes, rule_allows
from storage_migrator.agreement.identity_leases import list_identity_leases
from storage_migrator.agreement.server_metrics import read_config_samples
from storage_migrator.agreement.storageversion_api import list_storage_versions, read_storage_version
from storage_migrator.detection.states import list_states
from storage_migrator.kube.connection import api_client_from_settings
from storage_migrator.kube.crds import CRDS
from storage_migrator.kube.discovery import discover
from storage_migrator.kube.endpoints import api_server_urls
from storage_migrator.kube.errors import RBAC_FIX, Forbidden, KubeError
from storage_migrator.kube.listing import iterate_items, list_page
from storage_migrator.kube.reading import read_object
from storage_migrator.kube.resources import ResourceRef
from storage_migrator.kube.transport import request
from storage_migrator.kube.writing import (
    create_object,
    delete_object,
    patch_object,
    rewrite_with_patch,
    rewrite_with_put,
)
from storage_migrator.migration.requests import MIGRATIONS, create_migration, list_migrations, read_migration
from storage_migrator.migration.writer_leases import (
    LEASES,
    create_lease,
    delete_lease,
    lease_body,
    list_writer_leases,
    renew_lease,
    replace_lease,
)
from storage_migrator.models import new_storage_version_migration
from storage_migrator.settings import Settings
from tasks.dispatching import APISERVICES

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
RBAC_FILE = ROOT / "deployments" / "rbac" / "storage-migrator.yaml"
#: Issue 36: the in-tree engine's role (kube-controller-manager writes: no patch or update on anything migrated).
IN_TREE_FILE = ROOT / "deployments" / "rbac" / "in-tree" / "storage-migrator.yaml"
SA_USER = "system:serviceaccount:storage-migrator:storage-migrator"
SA_GROUPS = "system:serviceaccounts,system:serviceaccounts:storage-migrator"
CONFIGMAPS = ResourceRef(version="v1", resource="configmaps")
NAMESPACE = "rbac-proven"
#: The install's namespace (the RBAC file makes it): the runs' writer Leases (issue 37).
INSTALL = "storage-migrator"
FAST: dict[str, Any] = {"write_rate_per_second": 2000.0}


def shipped_role(path: Path = RBAC_FILE, kind: str = "ClusterRole") -> dict[str, Any]:
    """The shipped ClusterRole, or its Role (issue 37: the writer Leases in the install's namespace)."""
    (role,) = [d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == kind]
    return role


def describe(rule: dict[str, Any]) -> str:
    if "nonResourceURLs" in rule:
        return "urls:" + ",".join(rule["nonResourceURLs"])
    return f"{','.join(rule['apiGroups']) or 'core'}:{','.join(rule['resources'])}:{','.join(rule['verbs'])}"


@dataclass
class RbacCluster:
    cluster: Cluster
    admin_kubeconfig: str
    sa_kubeconfig: str
    admin: Admin
    etcd: EtcdStore
    api: k8s.ApiClient  # the admin's

    def sa_api(self) -> k8s.ApiClient:
        """The migrator's own client, as it builds it (DESIGN 4.1)."""
        return api_client_from_settings(Settings(kubeconfig=self.sa_kubeconfig))

    def set_role_rules(self, rules: list[dict[str, Any]], kind: str = "ClusterRole") -> None:
        rbac = k8s.RbacAuthorizationV1Api(self.api)
        if kind == "Role":
            role = rbac.read_namespaced_role("storage-migrator-writers", "storage-migrator")
            role.rules = rules
            rbac.replace_namespaced_role("storage-migrator-writers", "storage-migrator", role)
            return
        role = rbac.read_cluster_role("storage-migrator")
        role.rules = rules
        rbac.replace_cluster_role("storage-migrator", role)


@pytest.fixture(scope="module")
def rbac_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RbacCluster]:
    home = tmp_path_factory.mktemp("rbac")
    token = secrets.token_hex(16)
    tokens = home / "tokens.csv"
    tokens.write_text(f'{token},{SA_USER},uid-storage-migrator,"{SA_GROUPS}"\n')
    cluster = Cluster(token_auth_file=tokens, authorization_mode="RBAC").start()
    try:
        admin_kubeconfig = cluster.write_kubeconfig(home / "admin.yaml")
        sa_config = yaml.safe_load(admin_kubeconfig.read_text())
        sa_config["users"] = [{"name": "kubesim-admin", "user": {"token": token}}]
        sa_kubeconfig = home / "storage-migrator.yaml"
        sa_kubeconfig.write_text(yaml.safe_dump(sa_config))
        api = k8s_config.new_client_from_config(config_file=str(admin_kubeconfig))
        k8s_utils.create_from_yaml(api, str(RBAC_FILE))  # its namespace first: the CRDs' install makes it too
        install_migration_crds(api)
        rbac = k8s.RbacAuthorizationV1Api(api)
        for binding in ("system:discovery", "system:public-info-viewer"):
            rbac.delete_cluster_role_binding(binding)
        core = k8s.CoreV1Api(api)
        core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=NAMESPACE)))
        for i in range(5):
            core.create_namespaced_config_map(NAMESPACE, k8s.V1ConfigMap(
                metadata=k8s.V1ObjectMeta(name=f"cm-{i}"), data={"i": str(i)}))  # fmt: skip
            core.create_namespaced_secret(NAMESPACE, k8s.V1Secret(
                metadata=k8s.V1ObjectMeta(name=f"s-{i}"), string_data={"i": str(i)}))  # fmt: skip
        # Issue 36: the in-tree API served and kube-controller-manager's migrator running (as system:masters).
        Admin(cluster.server.url).set_feature_gates({"StorageVersionMigrator": True})
        Admin(cluster.server.url).set_svm_controller(gc_delay=0.2, missing_resource_grace=0.5)
        etcd = cluster.etcd()
        yield RbacCluster(cluster=cluster, admin_kubeconfig=str(admin_kubeconfig), sa_kubeconfig=str(sa_kubeconfig),
                          admin=Admin(cluster.server.url), etcd=etcd, api=api)  # fmt: skip
        etcd.close()
        api.close()
    finally:
        cluster.stop()


def stored(rc: RbacCluster, resource: str) -> dict[str, codec.Stored]:
    prefix = f"/registry/{resource}/{NAMESPACE}/".encode()
    kvs = rc.etcd.range(prefix, prefix_end(prefix)).kvs
    return {kv.key.decode(): codec.decode(kv.value, read_keys=["key1", "key2", "key3"]) for kv in kvs}


def test_authentication_and_authorization_answer_as_kube_apiserver(rbac_cluster: RbacCluster) -> None:
    """No or an unknown token: 401 Unauthorized; the ServiceAccount: what its role grants, 403 beyond."""
    url = f"{rbac_cluster.cluster.server.url}/api/v1/namespaces/{NAMESPACE}/secrets/s-0"
    for headers in ({}, {"Authorization": "Bearer not-a-token"}):
        with pytest.raises(urllib.error.HTTPError) as denied:
            urllib.request.urlopen(urllib.request.Request(url, headers=headers), context=tls.client_context())
        assert denied.value.code == 401
        assert json.loads(denied.value.read()) == {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                                   "status": "Failure", "message": "Unauthorized",
                                                   "reason": "Unauthorized", "code": 401}  # fmt: skip
    api = rbac_cluster.sa_api()
    try:
        with pytest.raises(k8s.ApiException) as forbidden:
            k8s.CoreV1Api(api).read_namespaced_secret("s-0", NAMESPACE)
    finally:
        api.close()
    assert forbidden.value.status == 403
    assert json.loads(forbidden.value.body)["message"] == (
        f'secrets "s-0" is forbidden: User "{SA_USER}" cannot get resource "secrets" in API group "" in the '
        f'namespace "{NAMESPACE}"'
    )


def test_every_flow_runs_with_only_the_shipped_role(
    rbac_cluster: RbacCluster, prefect_api: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 14: "A test runs detection, migrate-resource (patch and PUT modes),
    run-migrations, initialize and the rotation flow with a token bound only to the
    shipped ClusterRole" -- judged by what etcd holds."""
    from flows.detect_storage_changes import detect_storage_changes
    from flows.initialize import initialize
    from flows.migrate_resource import migrate_resource
    from flows.rotate_encryption_key import rotate_encryption_key
    from flows.run_migrations import run_migrations

    rc, sa = rbac_cluster, rbac_cluster.sa_kubeconfig
    monkeypatch.setenv("STORAGE_MIGRATOR_INCLUDE_RESOURCES", "configmaps")
    detected = detect_storage_changes(settle_seconds=0, poll_seconds=600, start_migrations=False, kubeconfig=sa,
                                      return_state=True)  # fmt: skip
    assert detected.is_completed(), detected.message
    assert [s.metadata.name for s in list_states(api_client_from_settings(Settings(kubeconfig=sa)))] == ["configmaps"]

    # migrate-resource, patch mode (every built-in serves patch): configmaps to v2.
    rc.admin.set_storage_version("configmaps", "v2")
    state = migrate_resource(resource="configmaps", kubeconfig=sa, return_state=True, **FAST)
    assert state.is_completed(), state.message
    assert {s.api_version for s in stored(rc, "configmaps").values()} == {"v2"}

    # PUT mode (the fallback for resources that serve no patch): configmaps served without
    # patch, so discovery tells the flow to re-write each object with PUT; back to v1.
    rc.admin.set_storage_version("configmaps", "v1")
    rc.admin.set_verbs("configmaps", ["create", "delete", "get", "list", "update", "watch"])
    rc.admin.reset_counters()
    try:
        state = migrate_resource(resource="configmaps", kubeconfig=sa, return_state=True, **FAST)
        assert state.is_completed(), state.message
        assert state.result().progress.rewritten == 5
    finally:
        rc.admin.set_verbs("configmaps", None)
    requests = rc.admin.counters()["requestsByResource"]
    assert (requests.get("update configmaps"), requests.get("patch configmaps")) == (5, None)
    assert {s.api_version for s in stored(rc, "configmaps").values()} == {"v1"}

    # initialize (kept small by the include list), then run-migrations runs what it requested.
    summary = initialize(include=["secrets"], start_migrations=False, kubeconfig=sa)
    assert len(summary.created) == 1, summary
    ran = run_migrations(max_parallel=1, kubeconfig=sa, **FAST)
    assert set(ran.outcomes.values()) == {"Completed"}, ran.outcomes

    # rotate-encryption-key: key2 becomes the write key (seed 003's order), the flow proves it.
    assert {s.key_name for s in stored(rc, "secrets").values()} == {"key1"}
    rc.admin.set_encryption(["key1", "key2"], resources=["secrets", "configmaps"])
    rc.admin.set_encryption(["key2", "key1"], resources=["secrets", "configmaps"])
    rotated = rotate_encryption_key(key="key2", kubeconfig=sa, return_state=True, **FAST)
    assert rotated.is_completed(), rotated.message
    for resource in ("secrets", "configmaps"):
        assert {s.key_name for s in stored(rc, resource).values()} == {"key2"}, resource


def test_every_flow_on_the_in_tree_engine_runs_with_only_the_in_tree_role(
    rbac_cluster: RbacCluster, prefect_api: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 36: "`storage-migrator rbac --engine in-tree [--resources ...]` prints a role with no patch or
    update on any migrated resource ... a test proves every flow on the in-tree engine runs under it, refused
    nothing", judged by what etcd holds; and the cluster decides: a run asking for the client engine is
    refused its first patch. (deployments/rbac/in-tree/'s role, for every resource, is proven rule by rule
    by the probes below.)"""
    from flows.detect_storage_changes import detect_storage_changes
    from flows.initialize import initialize
    from flows.migrate_resource import migrate_resource
    from flows.rotate_encryption_key import rotate_encryption_key
    from flows.run_migrations import run_migrations
    from storage_migrator.cli import main

    rc, sa = rbac_cluster, rbac_cluster.sa_kubeconfig
    printed = ["--kubeconfig", rc.admin_kubeconfig, "rbac", "--engine", "in-tree", "--resources", "secrets,configmaps"]
    assert main([*printed, "-o", "json"]) == 0
    items = json.loads(capsys.readouterr().out)["items"]
    role = next(i for i in items if i["kind"] == "ClusterRole")
    for rule in role["rules"]:
        if set(rule.get("resources", [])) & {"secrets", "configmaps"}:
            assert rule["verbs"] == ["list"], rule  # no patch or update on any migrated resource
    rbac = k8s.RbacAuthorizationV1Api(rc.api)
    lease_role, lease_binding = (next(i for i in items if i["kind"] == k) for k in ("Role", "RoleBinding"))
    rbac.create_namespaced_role("kube-system", lease_role)
    rbac.create_namespaced_role_binding("kube-system", lease_binding)
    custom = k8s.CustomObjectsApi(rc.api)
    for plural in ("storageversionmigrations", "storagestates"):  # a first install, whatever ran before here
        custom.delete_collection_cluster_custom_object("migration.k8s.io", "v1alpha1", plural)
    monkeypatch.setenv("STORAGE_MIGRATOR_ENGINE", "in-tree")
    monkeypatch.setenv("STORAGE_MIGRATOR_IN_TREE_POLL_SECONDS", "0.2")
    monkeypatch.setenv("STORAGE_MIGRATOR_INCLUDE_RESOURCES", "configmaps,secrets")
    rc.set_role_rules(role["rules"])
    try:
        summary = initialize(include=["configmaps"], start_migrations=False, kubeconfig=sa)
        assert len(summary.created) == 1, summary
        ran = run_migrations(max_parallel=1, kubeconfig=sa)
        assert set(ran.outcomes.values()) == {"Completed"}, ran.outcomes
        detected = detect_storage_changes(settle_seconds=0, poll_seconds=600, start_migrations=False,
                                          kubeconfig=sa, return_state=True)  # fmt: skip
        assert detected.is_completed(), detected.message
        ran = run_migrations(max_parallel=1, kubeconfig=sa)  # the secrets' request detection made
        assert set(ran.outcomes.values()) == {"Completed"}, ran.outcomes

        target = "v2" if {s.api_version for s in stored(rc, "configmaps").values()} == {"v1"} else "v1"
        rc.admin.set_storage_version("configmaps", target)
        state = migrate_resource(resource="configmaps", kubeconfig=sa, return_state=True)
        assert state.is_completed(), state.message
        assert {s.api_version for s in stored(rc, "configmaps").values()} == {target}

        # key1 the write key, every key of this module readable (the other tests here may run before or after).
        rc.admin.set_encryption(["key1", "key2", "key3"], resources=["secrets", "configmaps"])
        rotated = rotate_encryption_key(key="key1", resources=["secrets"], kubeconfig=sa, return_state=True)
        assert rotated.is_completed(), rotated.message
        assert {s.key_name for s in stored(rc, "secrets").values()} == {"key1"}

        refused = migrate_resource(resource="configmaps", engine="client", kubeconfig=sa, return_state=True,
                                   **FAST)  # fmt: skip
    finally:
        rc.set_role_rules(copy.deepcopy(RULES))
        rbac.delete_namespaced_role_binding(lease_binding["metadata"]["name"], "kube-system")
        rbac.delete_namespaced_role(lease_role["metadata"]["name"], "kube-system")
    assert refused.is_failed()
    denied = f'cannot patch resource "configmaps" in API group "" in the namespace "{NAMESPACE}"'
    assert denied in str(refused.message), refused.message
    made = custom.list_cluster_custom_object("storagemigration.k8s.io", "v1", "storageversionmigrations")["items"]
    assert {"secrets-key1", "secrets-key1-verify"} <= {
        m["metadata"]["name"] for m in made}  # fmt: skip


# ----- every rule is needed -------------------------------------------------------------
@dataclass
class Probe:
    """One kind of request the migrator makes, made the way it makes it."""

    name: str
    call: Callable[[k8s.ApiClient], object]


def probes(rc: RbacCluster) -> list[Probe]:
    """The smallest call of each kind of request the flows make (discovery, the chunk loop's
    LIST and writes, our requests, states and CRDs, APIServices, agreement, readiness)."""
    admin = rc.api
    if not any(m.metadata.name == "rbac-probe" for m in list_migrations(admin)):
        create_migration(admin, new_storage_version_migration(group="", version="v1", resource="configmaps",
                                                              name="rbac-probe"))  # fmt: skip

    def as_read() -> dict[str, Any]:
        """cm-0 as a full LIST item (the migrator's PUT body), read by the admin."""
        cm = k8s.CoreV1Api(admin).read_namespaced_config_map("cm-0", NAMESPACE)
        return dict(k8s.ApiClient().sanitize_for_serialization(cm), apiVersion="v1", kind="ConfigMap")

    def patch(api: k8s.ApiClient) -> object:
        rv = as_read()["metadata"]["resourceVersion"]
        return rewrite_with_patch(api, CONFIGMAPS, name="cm-0", namespace=NAMESPACE, resource_version=rv)

    def put(api: k8s.ApiClient) -> object:
        return rewrite_with_put(api, CONFIGMAPS, body=json.dumps(as_read()).encode())

    def writer_lease(api: k8s.ApiClient) -> None:
        """Issue 37: a run's request Lease, each verb as the run uses it: list, create, renew (patch),
        take over once expired (update), give back (delete)."""
        now = datetime.now(UTC)
        body = lease_body(namespace=INSTALL, request="rbac-probe", holder="probe/1", acquired=now, renewed=now,
                          transitions=0, writes_per_second=None)  # fmt: skip
        list_writer_leases(api, namespace=INSTALL)
        lease = create_lease(api, body)
        try:
            lease = renew_lease(api, namespace=INSTALL, name=lease.name, resource_version=lease.resource_version,
                                renewed=now, writes_per_second=10.0)  # fmt: skip
            taken = lease_body(namespace=INSTALL, request="rbac-probe", holder="probe/2", acquired=now, renewed=now,
                               transitions=1, writes_per_second=None, resource_version=lease.resource_version)  # fmt: skip
            lease = replace_lease(api, taken)
            delete_lease(api, lease, namespace=INSTALL)
        finally:
            leftover = [le for le in list_writer_leases(admin, namespace=INSTALL) if le.request == "rbac-probe"]
            for left in leftover:
                delete_object(admin, LEASES, name=left.name, namespace=INSTALL)

    def create_and_delete_request(api: k8s.ApiClient) -> None:
        created = create_migration(api, new_storage_version_migration(group="", version="v1", resource="secrets"))
        name = str(created.metadata.name)
        try:
            delete_object(api, MIGRATIONS, name=name, uid=created.metadata.uid)
        finally:
            if any(m.metadata.name == name for m in list_migrations(admin)):
                delete_object(admin, MIGRATIONS, name=name)

    def create_and_delete_in_tree(api: k8s.ApiClient) -> None:
        """Issue 36: a run on the in-tree engine creates kube-controller-manager's migration and deletes it
        when a gate is lost (for a resource no one serves: the controller only fails it)."""
        ref = ResourceRef(group="storagemigration.k8s.io", version="v1", resource="storageversionmigrations")
        body = {"apiVersion": "storagemigration.k8s.io/v1", "kind": "StorageVersionMigration",
                "metadata": {"generateName": "rbac-probe-"},
                "spec": {"resource": {"group": "nothing.example.com", "resource": "nothings"}}}  # fmt: skip
        made = create_object(api, ref, body)
        try:
            read_object(api, ref, name=made["metadata"]["name"])
        finally:
            delete_object(api, ref, name=made["metadata"]["name"], uid=made["metadata"]["uid"])

    return [
        Probe("discovery", lambda api: discover(api)),
        Probe("/readyz", lambda api: request(api, method="GET", path="/readyz", what="GET /readyz", accept="*/*")),
        Probe("LIST objects", lambda api: list_page(api, CONFIGMAPS, limit=2)),
        Probe("no-op patch", patch),
        Probe("PUT as read", put),
        Probe("list requests", list_migrations),
        Probe("read a request", lambda api: read_migration(api, "rbac-probe")),
        Probe("create and delete a request", create_and_delete_request),
        Probe(
            "write a request's status",
            lambda api: patch_object(api, MIGRATIONS, name="rbac-probe", subresource="status", patch={"status": {}}),
        ),
        Probe("list states", list_states),
        Probe("list CRDs", lambda api: list(iterate_items(api, CRDS, limit=50))),
        Probe(
            "trim a CRD's storedVersions",
            lambda api: patch_object(
                api,
                CRDS,
                name="storagestates.migration.k8s.io",
                subresource="status",
                patch={"status": {"storedVersions": ["v1alpha1"]}},
            ),
        ),
        Probe("list APIServices", lambda api: list(iterate_items(api, APISERVICES, limit=50))),
        Probe("list StorageVersions", lambda api: list_storage_versions(api)),
        Probe("read a StorageVersion", lambda api: read_storage_version(api, group="", resource="configmaps")),
        Probe("API servers' EndpointSlices", lambda api: api_server_urls(api)),
        # Issue 19: which API servers exist, and the encryption configuration each one runs.
        Probe("API servers' identity Leases", lambda api: list_identity_leases(api)),
        Probe("/metrics", lambda api: read_config_samples(api, via="probe")),
        Probe("create, read and delete an in-tree migration", create_and_delete_in_tree),
        Probe("a run's writer Lease", writer_lease),
    ]


#: What a worker on the in-tree engine never does (kube-controller-manager writes): its role refuses them.
WRITES = ("no-op patch", "PUT as read")


def run_probes(rc: RbacCluster, *, in_tree: bool = False) -> list[tuple[str, KubeError]]:
    failures: list[tuple[str, KubeError]] = []
    api = rc.sa_api()
    try:
        for probe in probes(rc):
            if in_tree and probe.name in WRITES:
                continue
            try:
                probe.call(api)
            except KubeError as exc:
                failures.append((probe.name, exc))
    finally:
        api.close()
    return failures


def denied_attributes(error: Forbidden) -> Attributes:
    """The request a denial names, read back from its message."""
    permission = error.permission
    assert permission is not None, str(error)
    path = re.fullmatch(r'User "(?P<user>[^"]*)" cannot (?P<verb>\S+) path "(?P<path>[^"]*)"', permission)
    user = UserInfo(name=SA_USER)
    if path:
        return Attributes(user=user, verb=path["verb"], path=path["path"], resource_request=False)
    found = re.fullmatch(r'User "[^"]*" cannot (?P<verb>\S+) resource "(?P<resource>[^"]*)" in API group '
                         r'"(?P<group>[^"]*)" .*', permission)  # fmt: skip
    assert found, permission
    resource, _, sub = found["resource"].partition("/")
    return Attributes(user=user, verb=found["verb"], path="", resource_request=True, api_group=found["group"],
                      resource=resource, subresource=sub)  # fmt: skip


def test_with_the_whole_role_nothing_is_forbidden(rbac_cluster: RbacCluster) -> None:
    assert run_probes(rbac_cluster) == []


RULES = shipped_role()["rules"]
#: Every rule of the shipped file: the ClusterRole's, and the Role's in the install's namespace (issue 37).
EVERY_RULE = [("ClusterRole", i) for i in range(len(RULES))] + [
    ("Role", i) for i in range(len(shipped_role(kind="Role")["rules"]))
]


@pytest.mark.parametrize(("kind", "index"), EVERY_RULE,
                         ids=[f"{k}:{describe(shipped_role(kind=k)['rules'][i])}" for k, i in EVERY_RULE])  # fmt: skip
def test_without_any_one_rule_something_fails_naming_the_permission(
    rbac_cluster: RbacCluster, kind: str, index: int
) -> None:
    """Issue 14: "removing any one rule makes something fail with a clear message naming
    the missing permission" (the rules are read from the YAML: a new one is covered)."""
    rules = shipped_role(kind=kind)["rules"]
    removed = rules[index]
    rbac_cluster.set_role_rules([copy.deepcopy(r) for i, r in enumerate(rules) if i != index], kind)
    try:
        failures = run_probes(rbac_cluster)
    finally:
        rbac_cluster.set_role_rules(copy.deepcopy(rules), kind)
    assert failures, (
        f"nothing the migrator does needs rule {describe(removed)}: drop it from {RBAC_FILE.name}, "
        "or add to probes() the request that needs it"
    )
    for name, error in failures:
        assert isinstance(error, Forbidden), f"{name}: {error}"
        assert rule_allows(denied_attributes(error), removed), f"{name} failed for another reason: {error}"
        assert f'User "{SA_USER}" cannot ' in str(error) and RBAC_FIX in str(error)


IN_TREE_RULES = shipped_role(IN_TREE_FILE)["rules"]


def test_with_the_whole_in_tree_role_nothing_but_writes_is_forbidden(rbac_cluster: RbacCluster) -> None:
    rbac_cluster.set_role_rules(copy.deepcopy(IN_TREE_RULES))
    try:
        assert run_probes(rbac_cluster, in_tree=True) == []
        writes = [p for p in probes(rbac_cluster) if p.name in WRITES]
        api = rbac_cluster.sa_api()
        try:
            for probe in writes:  # issue 36: "a role with no patch or update on any migrated resource"
                with pytest.raises(Forbidden):
                    probe.call(api)
        finally:
            api.close()
    finally:
        rbac_cluster.set_role_rules(copy.deepcopy(RULES))


@pytest.mark.parametrize("index", range(len(IN_TREE_RULES)), ids=[describe(r) for r in IN_TREE_RULES])
def test_without_any_one_rule_of_the_in_tree_role_something_fails(rbac_cluster: RbacCluster, index: int) -> None:
    """deployments/rbac/in-tree/: every rule is needed, as the shipped role's (issue 14)."""
    removed = IN_TREE_RULES[index]
    rbac_cluster.set_role_rules([copy.deepcopy(r) for i, r in enumerate(IN_TREE_RULES) if i != index])
    try:
        failures = run_probes(rbac_cluster, in_tree=True)
    finally:
        rbac_cluster.set_role_rules(copy.deepcopy(RULES))
    assert failures, f"nothing on the in-tree engine needs rule {describe(removed)}: drop it from {IN_TREE_FILE}"
    for name, error in failures:
        assert isinstance(error, Forbidden), f"{name}: {error}"
        assert rule_allows(denied_attributes(error), removed), f"{name} failed for another reason: {error}"


# ----- what a migration run says about a missing permission -----------------------------
ALL_BUT_REWRITES = [
    {"apiGroups": ["migration.k8s.io"], "resources": ["*"], "verbs": ["*"]},
    {"apiGroups": ["internal.apiserver.k8s.io"], "resources": ["storageversions"], "verbs": ["get", "list"]},
    {"nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/version", "/readyz", "/metrics"], "verbs": ["get"]},
]


@pytest.mark.parametrize(
    ("verbs", "denied"),
    [
        (["list"], 'cannot patch resource "configmaps" in API group "" in the namespace "rbac-proven"'),
        (["patch", "update"], 'cannot list resource "configmaps" in API group "" at the cluster scope'),
    ],
    ids=["no-patch", "no-list"],
)
def test_a_denied_permission_fails_the_migration_naming_it_and_the_fix(
    rbac_cluster: RbacCluster, prefect_api: str, verbs: list[str], denied: str
) -> None:
    """Issue 14: a 403 surfaces with the API's message (verb, resource, group, scope) and
    the fix, in the flow run's state and in the StorageVersionMigration's Failed condition."""
    from flows.migrate_resource import migrate_resource

    rc = rbac_cluster
    rc.set_role_rules([{"apiGroups": ["*"], "resources": ["*"], "verbs": verbs}, *ALL_BUT_REWRITES])
    try:
        state = migrate_resource(resource="configmaps", kubeconfig=rc.sa_kubeconfig, return_state=True, **FAST)
    finally:
        rc.set_role_rules(copy.deepcopy(RULES))
    assert state.is_failed()
    assert denied in str(state.message) and RBAC_FIX in str(state.message), state.message
    (migration,) = [m for m in list_migrations(rc.api) if m.metadata.name == str(state.message).split(":")[0]]
    (failed,) = [c for c in migration.status.conditions if c.type == "Failed"]
    assert failed.status == "True" and denied in failed.message and RBAC_FIX in failed.message, failed
    delete_object(rc.api, MIGRATIONS, name=str(migration.metadata.name))


def test_a_denied_detection_action_fails_the_poll_naming_it_and_the_fix(
    rbac_cluster: RbacCluster, prefect_api: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A poll whose StorageState cannot be created fails (no later poll would heal it),
    with the denial and the fix in its state and log."""
    from flows.detect_storage_changes import detect_storage_changes

    rc = rbac_cluster
    monkeypatch.setenv("STORAGE_MIGRATOR_INCLUDE_RESOURCES", "serviceaccounts")  # no state for it yet
    ours = next(i for i, r in enumerate(RULES) if r.get("apiGroups") == ["migration.k8s.io"])
    rules = copy.deepcopy(RULES)
    rules[ours]["verbs"] = [v for v in rules[ours]["verbs"] if v != "create"]
    rc.set_role_rules(rules)
    try:
        state = detect_storage_changes(settle_seconds=0, poll_seconds=600, start_migrations=False,
                                       kubeconfig=rc.sa_kubeconfig, return_state=True)  # fmt: skip
    finally:
        rc.set_role_rules(copy.deepcopy(RULES))
    assert state.is_failed()
    denied = 'cannot create resource "storagestates" in API group "migration.k8s.io" at the cluster scope'
    assert denied in str(state.message) and RBAC_FIX in str(state.message), state.message
    assert "serviceaccounts" not in [s.metadata.name for s in list_states(rc.api)]


def test_the_narrow_role_of_the_rbac_command_is_enough_for_a_key_rotation_and_no_more(
    rbac_cluster: RbacCluster, prefect_api: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 14 item 3: "A key rotation needs Secrets and ConfigMaps only. `storage-migrator
    rbac --resources secrets,configmaps` prints a ClusterRole for exactly the resources it
    will migrate". Bound in place of the shipped role: the rotation completes, judged by
    etcd, and a migration of any other resource is refused naming the permission."""
    from flows.migrate_resource import migrate_resource
    from flows.rotate_encryption_key import rotate_encryption_key
    from storage_migrator.cli import main

    rc = rbac_cluster
    assert main(["--kubeconfig", rc.admin_kubeconfig, "rbac", "--resources", "secrets,configmaps", "-o", "json"]) == 0
    items = json.loads(capsys.readouterr().out)["items"]
    role = next(i for i in items if i["kind"] == "ClusterRole")
    assert not any("*" in r.get("resources", []) for r in role["rules"]), role["rules"]
    assert not any("leases" in r.get("resources", []) for r in role["rules"]), "leases: kube-system only"
    # Issue 19: the identity Leases through a Role in kube-system, applied as printed.
    rbac = k8s.RbacAuthorizationV1Api(rc.api)
    lease_role = next(i for i in items if i["kind"] == "Role" and i["metadata"]["namespace"] == "kube-system")
    lease_binding = next(i for i in items if i["kind"] == "RoleBinding" and i["metadata"]["namespace"] == "kube-system")
    # Issue 37: the writer Leases' Role in the install's namespace is the shipped one (applied already).
    writers = next(i for i in items if i["kind"] == "Role" and i["metadata"]["namespace"] == INSTALL)
    assert (writers["metadata"], writers["rules"]) == (
        shipped_role(kind="Role")["metadata"],
        shipped_role(kind="Role")["rules"],
    )
    rbac.create_namespaced_role("kube-system", lease_role)
    rbac.create_namespaced_role_binding("kube-system", lease_binding)
    rc.set_role_rules(role["rules"])
    try:
        # seed 003's order: key3 readable everywhere, then the write key; then the migration.
        # (The older keys stay readable: this test may run alone, before the rotation to key2.)
        rc.admin.set_encryption(["key1", "key2", "key3"], resources=["secrets", "configmaps"])
        rc.admin.set_encryption(["key3", "key1", "key2"], resources=["secrets", "configmaps"])
        rotated = rotate_encryption_key(key="key3", kubeconfig=rc.sa_kubeconfig, return_state=True, **FAST)
        assert rotated.is_completed(), rotated.message
        for resource in ("secrets", "configmaps"):
            assert {s.key_name for s in stored(rc, resource).values()} == {"key3"}, resource
        refused = migrate_resource(resource="serviceaccounts", kubeconfig=rc.sa_kubeconfig, return_state=True,
                                   **FAST)  # fmt: skip
        # Issue 19: without `get` on /metrics the rotation writes nothing and names the permission;
        # it never falls back to trusting the operator.
        rc.set_role_rules([{**r, "nonResourceURLs": [u for u in r["nonResourceURLs"] if u != "/metrics"]}
                           if "nonResourceURLs" in r else r for r in role["rules"]])  # fmt: skip
        rc.admin.reset_counters()
        blind = rotate_encryption_key(key="key3", resources=["configmaps"], kubeconfig=rc.sa_kubeconfig,
                                      server_config_timeout=0, return_state=True, **FAST)  # fmt: skip
        writes = rc.admin.counters()["requestsByResource"]
    finally:
        rc.set_role_rules(copy.deepcopy(RULES))
        rbac.delete_namespaced_role_binding(lease_binding["metadata"]["name"], "kube-system")
        rbac.delete_namespaced_role(lease_role["metadata"]["name"], "kube-system")
    assert blind.is_failed(), blind.message
    # (A rerun, configmaps-key3 having run: no verdict, and no key to be removed until there is one; issue 39.)
    assert 'cannot get path "/metrics"' in str(blind.message) and "remove no read key" in str(blind.message)
    assert not any(k.startswith(("patch ", "update ", "create ")) for k in writes), writes
    assert refused.is_failed()
    denied = 'cannot list resource "serviceaccounts" in API group "" at the cluster scope'
    assert denied in str(refused.message) and RBAC_FIX in str(refused.message), refused.message


def test_after_a_restart_only_system_masters_is_served_until_rbac_settles(rbac_cluster: RbacCluster) -> None:
    """kube-apiserver before its RBAC caches fill: 403 naming the request's user, `/readyz`
    500; `system:masters` is served (its authorizer needs no cache). Runs last: it restarts."""
    from kubesim.health import Warmup

    rc = rbac_cluster
    server = rc.cluster.restart_server(0, authz_warmup_seconds=60)
    try:
        assert k8s.CoreV1Api(rc.api).list_namespaced_config_map(NAMESPACE).items
        api = rc.sa_api()
        try:
            with pytest.raises(Forbidden, match=f'User "{SA_USER}" cannot list resource "configmaps"'):
                list_page(api, CONFIGMAPS, limit=1)
            with pytest.raises(KubeError) as readyz:
                request(api, method="GET", path="/readyz", what="GET /readyz", accept="*/*")
            assert readyz.value.code == 500
        finally:
            api.close()
    finally:
        server.warmup = Warmup(0)
