"""The resource types kubesim serves: built-ins, CRD-defined ones, and their storage.

A resource type knows where its objects live in etcd, which versions it serves
and which version (and kind) it stores. The storage version of a built-in is a
per-server setting (an "upgrade" changes it); a custom resource's comes from its
CRD, as on a real cluster. The `storageVersionHash` is computed as
kube-apiserver computes it: base64 of the first 8 bytes of the SHA-256 of
`<group>/<version>/<kind>` of the storage version (reference/README.md).
"""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass, field
from typing import Any

ALL_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
CLUSTER_VERBS_NO_COLLECTION = ["create", "delete", "get", "list", "patch", "update", "watch"]
SUB_VERBS = ["get", "patch", "update"]
STORAGE_VERSION_MIGRATOR_GATE = "StorageVersionMigrator"
#: Serves internal.apiserver.k8s.io and makes each server publish its StorageVersion entries
#: (alpha, off by default upstream; kubesim's default ServerConfig has it on, as had our reference cluster).
STORAGE_VERSION_API_GATE = "StorageVersionAPI"
#: The feature gates kubesim knows; a gate not listed here is refused by the admin API.
FEATURE_GATES = (STORAGE_VERSION_API_GATE, STORAGE_VERSION_MIGRATOR_GATE)


def storage_version_hash(group: str, version: str, kind: str) -> str:
    digest = hashlib.sha256(f"{group}/{version}/{kind}".encode()).digest()
    return base64.b64encode(digest[:8]).decode()


_VERSION_RE = re.compile(r"^v(\d+)(?:(alpha|beta)(\d+))?$")


def version_priority(version: str) -> tuple[int, int, int, str]:
    """Kubernetes version ordering: GA > beta > alpha, higher numbers first."""
    m = _VERSION_RE.match(version)
    if not m:
        return (0, 0, 0, version)
    major = int(m.group(1))
    level = {"alpha": 1, "beta": 2, None: 3}[m.group(2)]
    minor = int(m.group(3) or 0)
    return (level, major, minor, version)


def sort_versions(versions: list[str]) -> list[str]:
    return sorted(versions, key=version_priority, reverse=True)


@dataclass
class ResourceType:
    group: str
    resource: str
    kind: str
    singular: str
    namespaced: bool
    served_versions: list[str]
    storage_version: str
    verbs: list[str] = field(default_factory=lambda: list(ALL_VERBS))
    short_names: list[str] = field(default_factory=list)
    categories: list[str] = field(default_factory=list)
    subresources: list[str] = field(default_factory=list)
    has_generation: bool = False
    # Virtual resources (tokenreviews, bindings) are never stored: no hash.
    virtual: bool = False
    # Resources that share storage with another (events.events.k8s.io keeps its
    # objects as core v1 Events under /registry/events): (group, resource, kind).
    storage_group: str | None = None
    storage_resource: str | None = None
    storage_kind: str | None = None
    # Built-ins outside the legacy layout keep their group in the etcd key.
    group_in_key: bool = False
    # For custom resources: the CRD's name and its per-version details.
    crd_name: str | None = None
    crd_schemas: dict[str, dict[str, Any]] = field(default_factory=dict)
    crd_printer_columns: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    default_namespaces: list[str] = field(default_factory=list)
    # A built-in API served only while this feature gate is on (kube-apiserver's
    # --feature-gates plus --runtime-config for beta APIs); None: always served.
    feature_gate: str | None = None

    @property
    def is_custom(self) -> bool:
        return self.crd_name is not None

    @property
    def group_resource(self) -> str:
        return f"{self.resource}.{self.group}" if self.group else self.resource

    def group_version(self, version: str) -> str:
        return f"{self.group}/{version}" if self.group else version

    @property
    def stored_group(self) -> str:
        return self.group if self.storage_group is None else self.storage_group

    @property
    def stored_kind(self) -> str:
        return self.storage_kind or self.kind

    def stored_api_version(self, storage_version: str) -> str:
        g = self.stored_group
        return f"{g}/{storage_version}" if g else storage_version

    def hash_for(self, storage_version: str) -> str:
        if self.virtual:
            return ""
        return storage_version_hash(self.stored_group, storage_version, self.stored_kind)

    @property
    def key_prefix(self) -> str:
        """`/registry/<resource>/` as kube-apiserver lays keys out (etcd-values.md)."""
        res = self.storage_resource or self.resource
        if self.is_custom or self.group_in_key:
            return f"/registry/{self.stored_group}/{res}/"
        return f"/registry/{res}/"

    def key(self, namespace: str | None, name: str) -> bytes:
        if self.namespaced:
            return f"{self.key_prefix}{namespace}/{name}".encode()
        return f"{self.key_prefix}{name}".encode()

    def list_prefix(self, namespace: str | None) -> bytes:
        if self.namespaced and namespace:
            return f"{self.key_prefix}{namespace}/".encode()
        return self.key_prefix.encode()


def _builtin(
    group: str, resource: str, kind: str, *, namespaced: bool = True, version: str = "v1", **kw: Any
) -> ResourceType:
    return ResourceType(
        group=group,
        resource=resource,
        kind=kind,
        singular=kw.pop("singular", kind.lower()),
        namespaced=namespaced,
        served_versions=kw.pop("served_versions", [version]),
        storage_version=kw.pop("storage_version", version),
        **kw,
    )


def builtin_resources() -> list[ResourceType]:
    """A small but realistic set of built-ins (DESIGN 6, issue 2)."""
    return [
        _builtin(
            "",
            "namespaces",
            "Namespace",
            namespaced=False,
            verbs=list(CLUSTER_VERBS_NO_COLLECTION),
            short_names=["ns"],
            subresources=["status", "finalize"],
        ),
        _builtin("", "configmaps", "ConfigMap", short_names=["cm"]),
        _builtin("", "secrets", "Secret"),
        _builtin("", "events", "Event", short_names=["ev"]),
        _builtin("", "serviceaccounts", "ServiceAccount", short_names=["sa"]),
        _builtin("", "bindings", "Binding", verbs=["create"], virtual=True),
        _builtin(
            "", "componentstatuses", "ComponentStatus", namespaced=False, verbs=["get", "list"], virtual=True,
            short_names=["cs"],
        ),
        _builtin(
            "apps", "deployments", "Deployment", short_names=["deploy"], categories=["all"],
            subresources=["status", "scale"], has_generation=True,
        ),
        _builtin("batch", "cronjobs", "CronJob", short_names=["cj"], categories=["all"], subresources=["status"],
                 has_generation=True),
        # Flow-run Jobs and their Pods (issue 35: the admission policy of deployments/admission/ checks them).
        _builtin("batch", "jobs", "Job", categories=["all"], subresources=["status"], has_generation=True),
        _builtin("", "pods", "Pod", short_names=["po"], categories=["all"], subresources=["status"]),
        # Evaluated on every create and update (sim/kubesim/admission_policies.py).
        _builtin("admissionregistration.k8s.io", "validatingadmissionpolicies", "ValidatingAdmissionPolicy",
                 namespaced=False, categories=["api-extensions"], subresources=["status"], has_generation=True),
        _builtin("admissionregistration.k8s.io", "validatingadmissionpolicybindings", "ValidatingAdmissionPolicyBinding",
                 namespaced=False, categories=["api-extensions"], has_generation=True),
        _builtin(
            "events.k8s.io", "events", "Event", short_names=["ev"],
            storage_group="", storage_resource="events", storage_kind="Event",
        ),
        _builtin(
            "authentication.k8s.io", "tokenreviews", "TokenReview", namespaced=False, verbs=["create"], virtual=True,
        ),
        _builtin(
            "apiextensions.k8s.io", "customresourcedefinitions", "CustomResourceDefinition", namespaced=False,
            short_names=["crd", "crds"], categories=["api-extensions"], subresources=["status"], has_generation=True,
            group_in_key=True,
        ),
        _builtin(
            "apiregistration.k8s.io", "apiservices", "APIService", namespaced=False, categories=["api-extensions"],
            subresources=["status"], group_in_key=True,
        ),
        # Identity leases of the API servers live in kube-system (sim/kubesim/leases.py).
        _builtin("coordination.k8s.io", "leases", "Lease"),
        # The `kubernetes` Service's slices: one per live API server (sim/kubesim/cluster.py).
        _builtin("discovery.k8s.io", "endpointslices", "EndpointSlice"),
        # RBAC objects are stored and served (`kubectl apply -k deployments/`); with
        # `--authorization-mode RBAC` they authorize every request (sim/kubesim/rbac_authorizer.py).
        _builtin("rbac.authorization.k8s.io", "clusterroles", "ClusterRole", namespaced=False),
        _builtin("rbac.authorization.k8s.io", "clusterrolebindings", "ClusterRoleBinding", namespaced=False),
        _builtin("rbac.authorization.k8s.io", "roles", "Role"),
        _builtin("rbac.authorization.k8s.io", "rolebindings", "RoleBinding"),
        # The StorageVersion API (seed 001 as shipped: reference/storageversion-core-secrets.json),
        # behind its gate as on a real server (off: the group is not served).
        _builtin(
            "internal.apiserver.k8s.io", "storageversions", "StorageVersion", namespaced=False, version="v1alpha1",
            subresources=["status"], feature_gate=STORAGE_VERSION_API_GATE,
        ),
        # The in-tree migrator's API (KEP-4192; reference/README.md): v1beta1 in v1.36 behind the
        # StorageVersionMigrator gate, v1 GA in v1.37 with v1beta1 still served and still the
        # storage version (a new version is stored one release later, so that a downgrade to a
        # v1.36 server can read it: default_storage_factory_builder.go). Validation and strategy:
        # sim/kubesim/storagemigration.py; its controller: sim/kubesim/svm_controller.py. Same
        # plural and kind as our migration.k8s.io CRD, so a bare `kubectl get
        # storageversionmigrations` resolves to it (issue 9).
        _builtin(
            "storagemigration.k8s.io", "storageversionmigrations", "StorageVersionMigration", namespaced=False,
            served_versions=["v1", "v1beta1"], storage_version="v1beta1", subresources=["status"],
            feature_gate=STORAGE_VERSION_MIGRATOR_GATE,
        ),
    ]  # fmt: skip


def resource_from_crd(crd: dict[str, Any]) -> ResourceType | None:
    """The resource a CRD defines, or None when it serves nothing."""
    spec = crd.get("spec", {})
    names = spec.get("names", {})
    versions = spec.get("versions", [])
    served = sort_versions([v["name"] for v in versions if v.get("served")])
    storage = [v["name"] for v in versions if v.get("storage")]
    if not served or not storage or not names.get("plural") or not names.get("kind"):
        return None
    subresources: set[str] = set()
    for v in versions:
        subresources.update((v.get("subresources") or {}).keys())
    return ResourceType(
        group=spec["group"],
        resource=names["plural"],
        kind=names["kind"],
        singular=names.get("singular") or names["kind"].lower(),
        namespaced=spec.get("scope", "Namespaced") == "Namespaced",
        served_versions=served,
        storage_version=storage[0],
        short_names=list(names.get("shortNames") or []),
        categories=list(names.get("categories") or []),
        subresources=sorted(subresources),
        has_generation=True,
        crd_name=crd["metadata"]["name"],
        crd_schemas={v["name"]: (v.get("schema") or {}).get("openAPIV3Schema") or {} for v in versions},
        crd_printer_columns={v["name"]: list(v.get("additionalPrinterColumns") or []) for v in versions},
    )
