"""The ClusterRole (and kube-system Role) a migrator needs for exactly the resources it migrates.

Design decision (issue 14 item 3): the shipped role (deployments/rbac/) grants
``list``, ``patch`` and ``update`` on every resource of every group, which is
what a migrator of everything needs; a key rotation needs Secrets (and maybe
ConfigMaps) only. This pure function builds the narrower role from discovery:

- per migrated resource, ``list`` (the chunked, metadata-only LIST) and
  ``patch`` (the no-op merge patch, DESIGN 4.5); ``update`` only where the
  migrator writes with the PUT fallback, i.e. where the resource serves no
  ``patch`` (storage_migrator/migration/targets.py ``write_mode_for``), and never with
  ``allow_put=False``. Never ``get``, ``create`` or ``delete``: a worker cannot
  read a Secret except through the LIST it must make;
- one rule per API group and verb set, resources sorted;
- then ``FIXED_RULES``, what the migrator needs whatever it migrates: its own
  API, CRDs, APIServices, StorageVersions, EndpointSlices, the in-tree
  ``storagemigration.k8s.io`` migrations others made (detection observes them,
  issue 36), discovery and ``/metrics`` (each API server's encryption
  configuration, issue 19); and a
  Role in ``kube-system`` to list the API servers' identity Leases. They
  are the shipped file's rules but for the ``*`` one; a unit test
  (tests/unit/operations/test_rbac.py) keeps the two equal, reading the file;
- ``list`` on namespaces, which the ``*`` rule covers in the shipped file: the
  cluster's identity, the uid of ``kube-system`` (issue 20);
- a Role in the install's namespace (the setting ``namespace``) for the runs' writer
  Leases (issue 37: the write budget and the one-writer lock, in the cluster): ``list``
  them, ``create`` one's own, renew it (``patch``), take over an expired one
  (``update``), ``delete`` one's own and expired ones. Never cluster-wide, and the same
  Role in the shipped file and in the narrow role.

Issue 36: on the in-tree engine (``engine="in-tree"``) kube-controller-manager writes,
so each migrated resource gets ``list`` only (our baseline and our count are
metadata-only LISTs: RBAC has no metadata-only verb, so the role can read what it
lists, as kcm's own role can) and never ``patch`` or ``update``; plus
``IN_TREE_RULES``, the lifecycle of the in-tree objects (get, list, create,
delete). A resource kcm cannot migrate (migration/engines.py ``in_tree_refusal``:
events, aggregated APIs, what its garbage collector does not watch) is refused
when named and left out otherwise. ``engine="auto"`` is both: the client engine's
verbs and the in-tree rules. Creating an in-tree object makes kcm rewrite (with
no-op patches) every object of any resource: less than ``patch`` (no content
changes, no object in the answer), more than nothing; the client engine's narrow
role leaves it out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from storage_migrator.detection.tracking import select_resources, track_storage
from storage_migrator.kube.discovery import DiscoveredResource
from storage_migrator.kube.in_tree import IN_TREE_GROUP, IN_TREE_RESOURCE
from storage_migrator.migration.chunk_terms import WriteMode
from storage_migrator.migration.engines import in_tree_refusal
from storage_migrator.migration.targets import UnknownResource, resolve_target, write_mode_for
from storage_migrator.models import GROUP, STORAGE_STATES, STORAGE_VERSION_MIGRATIONS, storage_state_name
from storage_migrator.settings.engine import EngineSetting

__all__ = [
    "DEFAULT_NAME",
    "DEFAULT_SERVICE_ACCOUNT",
    "EVERYTHING",
    "EVERY_LIST",
    "FIXED_RULES",
    "IDENTITY_LEASE_NAMESPACE",
    "IDENTITY_LEASE_RULES",
    "IN_TREE_RULES",
    "WRITER_LEASE_RULES",
    "PolicyRule",
    "RoleManifest",
    "UnknownResource",
    "build_role",
    "shipped_rules",
]

DEFAULT_NAME: Final = "storage-migrator"
#: (namespace, name) of the workers' ServiceAccount in deployments/rbac/storage-migrator.yaml.
DEFAULT_SERVICE_ACCOUNT: Final = ("storage-migrator", "storage-migrator")
RBAC_API_VERSION: Final = "rbac.authorization.k8s.io/v1"


class PolicyRule(BaseModel):
    """One ``rules[]`` entry of a ClusterRole (camelCase on the wire, as RBAC's)."""

    model_config = ConfigDict(frozen=True)

    api_groups: tuple[str, ...] | None = Field(
        default=None, validation_alias=AliasChoices("apiGroups", "api_groups"), serialization_alias="apiGroups"
    )
    resources: tuple[str, ...] | None = None
    non_resource_urls: tuple[str, ...] | None = Field(
        default=None,
        validation_alias=AliasChoices("nonResourceURLs", "non_resource_urls"),
        serialization_alias="nonResourceURLs",
    )
    verbs: tuple[str, ...]

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def _rule(groups: list[str], resources: list[str], verbs: list[str]) -> PolicyRule:
    return PolicyRule(api_groups=tuple(groups), resources=tuple(resources), verbs=tuple(verbs))


#: What re-writing any object takes (DESIGN 4.5): the chunked LIST, the no-op patch, the PUT fallback.
REWRITE_VERBS: Final = ("list", "patch", "update")
#: The shipped role's first rule: re-write every resource of every group (what the in-tree migrator has).
EVERYTHING: Final = PolicyRule(api_groups=("*",), resources=("*",), verbs=REWRITE_VERBS)
#: Issue 36: the in-tree variant's first rule: list every resource (our baseline and our count), write none.
EVERY_LIST: Final = PolicyRule(api_groups=("*",), resources=("*",), verbs=("list",))

#: What every worker needs whatever it migrates (deployments/rbac/storage-migrator.yaml says why each),
#: and no more: tests/integration/test_rbac_proven.py shows each is used.
FIXED_RULES: Final[tuple[PolicyRule, ...]] = (
    _rule([GROUP], [STORAGE_VERSION_MIGRATIONS, STORAGE_STATES],
          ["get", "list", "create", "update", "patch", "delete"]),
    _rule([GROUP], [f"{STORAGE_VERSION_MIGRATIONS}/status", f"{STORAGE_STATES}/status"], ["update", "patch"]),
    _rule(["apiextensions.k8s.io"], ["customresourcedefinitions"], ["list"]),
    _rule(["apiextensions.k8s.io"], ["customresourcedefinitions/status"], ["patch"]),
    _rule(["apiregistration.k8s.io"], ["apiservices"], ["list"]),
    _rule(["internal.apiserver.k8s.io"], ["storageversions"], ["get", "list"]),
    _rule(["discovery.k8s.io"], ["endpointslices"], ["list"]),
    _rule([IN_TREE_GROUP], [IN_TREE_RESOURCE], ["list"]),
    PolicyRule(non_resource_urls=("/api", "/api/*", "/apis", "/apis/*", "/version", "/readyz", "/metrics"),
               verbs=("get",)),
)  # fmt: skip

#: Issue 19: the API servers' identity Leases (which servers exist) are read in kube-system only,
#: so the narrow role grants them through a Role there, not cluster-wide. (The shipped role's ``*``
#: rule already lists leases everywhere.)
IDENTITY_LEASE_RULES: Final[tuple[PolicyRule, ...]] = (_rule(["coordination.k8s.io"], ["leases"], ["list"]),)
IDENTITY_LEASE_NAMESPACE: Final = "kube-system"
#: Issue 37: each run's request Lease in the install's namespace (storage_migrator/migration/writer_leases.py):
#: a Role there, not a ClusterRole, in the shipped file as in the narrow role.
WRITER_LEASE_RULES: Final[tuple[PolicyRule, ...]] = (
    _rule(["coordination.k8s.io"], ["leases"], ["list", "create", "update", "patch", "delete"]),
)
#: Issue 20: which cluster a run talks to is the uid of kube-system, read by a metadata-only LIST of
#: namespaces narrowed to it (storage_migrator/fleet/identity.py); the shipped role's ``*`` rule has it.
CLUSTER_IDENTITY_RULES: Final[tuple[PolicyRule, ...]] = (_rule([""], ["namespaces"], ["list"]),)
#: Issue 36: kube-controller-manager's migrations, created, watched and deleted by a run on the in-tree engine
#: (tasks/in_tree.py); with `auto` by a run that may use either engine.
IN_TREE_RULES: Final[tuple[PolicyRule, ...]] = (
    _rule([IN_TREE_GROUP], [IN_TREE_RESOURCE], ["get", "list", "create", "delete"]),
)


def shipped_rules(engine: EngineSetting = "client") -> list[PolicyRule]:
    """A shipped role: ``EVERYTHING`` (``EVERY_LIST`` for the in-tree variant), then the fixed rules it does not
    already grant, then the in-tree rules (the client role has them too: it rewrites anything already, and
    so may run with ``auto``).

    RBAC's ``*`` matches subresources too, so a fixed rule whose verbs are all
    granted by the first rule would be a rule nobody needs (issue 14: removing any
    one rule of the shipped role must make something fail)."""
    first = EVERY_LIST if engine == "in-tree" else EVERYTHING
    fixed = [r for r in FIXED_RULES if r.resources is None or not set(r.verbs) <= set(first.verbs)]
    return [first, *fixed, *IN_TREE_RULES]


class RoleManifest(BaseModel):
    """The role, its binding, and what it covers."""

    manifest: dict[str, Any] = Field(description="A v1 List of the ClusterRole and the ClusterRoleBinding.")
    resources: list[str] = Field(description="The resources it lets the migrator rewrite, as <resource>.<group>.")
    left_out: dict[str, str] = Field(
        default_factory=dict, description="Resources discovery serves that the role does not cover, and why."
    )


def _verbs(mode: WriteMode, engine: EngineSetting) -> tuple[str, ...]:
    if engine == "in-tree":
        return ("list",)  # issue 36: kube-controller-manager writes; we list for our baseline and our count
    return ("list", "patch", "update") if mode == "put" else ("list", "patch")


def _named(discovered: Sequence[DiscoveredResource], names: Sequence[str]) -> list[tuple[str, str, WriteMode]]:
    """Each name resolved as a migration request is (targets.py); every unknown one refused at once."""
    found: list[tuple[str, str, WriteMode]] = []
    unknown: list[str] = []
    messages: list[str] = []
    for name in names:
        try:
            target = resolve_target(discovered, resource=name)
        except UnknownResource as exc:
            unknown.append(name)
            messages.append(str(exc).split(". Served:", 1)[0])
            continue
        found.append((target.ref.group, target.ref.resource, target.write_mode))
    if unknown:
        served = sorted({r.group_resource for r in track_storage(discovered).kept})
        raise UnknownResource(
            f"cannot grant migrating {', '.join(unknown)}: {'; '.join(messages)}. Name resources as "
            f"'<resource>' (core) or '<resource>.<group>' from: {', '.join(served)}"
        )
    return found


def _discovered(
    discovered: Sequence[DiscoveredResource], include: Sequence[str], exclude: Sequence[str]
) -> list[tuple[str, str, WriteMode]]:
    """What detection tracks (tracking.py, then the include/exclude settings)."""
    kept = select_resources(track_storage(discovered).kept, include=include, exclude=exclude)
    return [(r.group, r.resource, write_mode_for(r)) for r in kept]


def _migrated_rules(targets: Sequence[tuple[str, str, WriteMode]], engine: EngineSetting) -> list[PolicyRule]:
    """One rule per (API group, verbs), sorted by group then verbs."""
    grouped: dict[tuple[str, tuple[str, ...]], set[str]] = {}
    for group, resource, mode in targets:
        grouped.setdefault((group, _verbs(mode, engine)), set()).add(resource)
    return [_rule([group], sorted(resources), list(verbs)) for (group, verbs), resources in sorted(grouped.items())]


def _in_tree_targets(
    discovered: Sequence[DiscoveredResource], targets: list[tuple[str, str, WriteMode]], *, named: bool,
    aggregated_groups: frozenset[str],
) -> tuple[list[tuple[str, str, WriteMode]], dict[str, str]]:  # fmt: skip
    """The targets kube-controller-manager's migrator can migrate; the others refused when named, else left out."""
    served = {(r.group, r.resource): r for r in discovered if not r.is_subresource}
    refused = {storage_state_name(g, r): why for g, r, _ in targets
               if (why := in_tree_refusal(served[(g, r)], aggregated_groups=aggregated_groups)) is not None}  # fmt: skip
    if named and refused:
        raise UnknownResource(
            f"the in-tree engine cannot migrate {', '.join(refused)}: {'; '.join(refused.values())}. Leave them out "
            "of --resources, or use --engine auto (the client engine migrates them, with patch on them)"
        )
    kept = [t for t in targets if storage_state_name(t[0], t[1]) not in refused]
    return kept, {n: f"{why} (the in-tree engine cannot migrate it)" for n, why in refused.items()}


def build_role(
    discovered: Sequence[DiscoveredResource],
    *,
    resources: Sequence[str] | None = None,
    allow_put: bool = True,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    name: str = DEFAULT_NAME,
    service_account: tuple[str, str] = DEFAULT_SERVICE_ACCOUNT,
    engine: EngineSetting = "client",
    aggregated_groups: frozenset[str] = frozenset(),
    namespace: str = DEFAULT_SERVICE_ACCOUNT[0],
) -> RoleManifest:
    """The ClusterRole for ``resources`` (or every resource detection tracks), bound to the workers,
    with the Role of the API servers' identity Leases in kube-system and the Role of the writer
    Leases in the install's ``namespace``.

    ``UnknownResource`` names every resource that cannot be granted: not served,
    not persisted, written only by PUT while ``allow_put`` is False, or (``engine``
    in-tree) one kube-controller-manager's migrator cannot migrate.
    """
    targets = _named(discovered, resources) if resources else _discovered(discovered, include, exclude)
    left_out: dict[str, str] = {}
    if engine == "in-tree":
        targets, left_out = _in_tree_targets(discovered, targets, named=bool(resources),
                                             aggregated_groups=aggregated_groups)  # fmt: skip
    elif not allow_put:
        needs_put = [storage_state_name(g, r) for g, r, mode in targets if mode == "put"]
        if resources and needs_put:
            raise UnknownResource(
                f"{', '.join(needs_put)} serve(s) no patch: the migrator rewrites them with update (PUT), "
                "which --no-put leaves out. Drop --no-put, or leave them out of --resources"
            )
        left_out = {n: "serves no patch: needs update (PUT), left out by --no-put" for n in needs_put}
        targets = [t for t in targets if t[2] != "put"]
    account_namespace, account = service_account
    engine_rules = IN_TREE_RULES if engine != "client" else ()
    role = {"apiVersion": RBAC_API_VERSION, "kind": "ClusterRole", "metadata": {"name": name},
            "rules": [r.to_wire() for r in (*_migrated_rules(targets, engine), *FIXED_RULES, *CLUSTER_IDENTITY_RULES,
                                            *engine_rules)]}  # fmt: skip
    binding = {"apiVersion": RBAC_API_VERSION, "kind": "ClusterRoleBinding", "metadata": {"name": name},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
               "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": account_namespace}]}  # fmt: skip
    lease_meta = {"name": f"{name}-apiserver-identity", "namespace": IDENTITY_LEASE_NAMESPACE}
    leases = {"apiVersion": RBAC_API_VERSION, "kind": "Role", "metadata": lease_meta,
              "rules": [r.to_wire() for r in IDENTITY_LEASE_RULES]}  # fmt: skip
    leases_binding = {"apiVersion": RBAC_API_VERSION, "kind": "RoleBinding", "metadata": dict(lease_meta),
                      "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": f"{name}-apiserver-identity"},
                      "subjects": binding["subjects"]}  # fmt: skip
    writers_meta = {"name": f"{name}-writers", "namespace": namespace}
    writers = {"apiVersion": RBAC_API_VERSION, "kind": "Role", "metadata": writers_meta,
               "rules": [r.to_wire() for r in WRITER_LEASE_RULES]}  # fmt: skip
    writers_binding = {"apiVersion": RBAC_API_VERSION, "kind": "RoleBinding", "metadata": dict(writers_meta),
                       "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"{name}-writers"},
                       "subjects": binding["subjects"]}  # fmt: skip
    items = [role, binding, leases, leases_binding, writers, writers_binding]
    return RoleManifest(
        manifest={"apiVersion": "v1", "kind": "List", "items": items},
        resources=sorted({storage_state_name(g, r) for g, r, _ in targets}),
        left_out=left_out,
    )
