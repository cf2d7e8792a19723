"""``storage-migrator rbac``: a ClusterRole for exactly the resources to migrate.

Issue 14 item 3: printed ready for ``kubectl apply -f -``; storage_migrator/operations/rbac.py
builds it (the rules, and why each). Issue 36: ``--engine in-tree`` prints the role of the
in-tree engine, with no patch or update on any migrated resource.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from storage_migrator.cli.options import EngineOption, kube_api, settings_of
from storage_migrator.cli.output import Output, OutputFormat, emit, render_table
from storage_migrator.kube.discovery import discover
from storage_migrator.kube.errors import KubeError
from storage_migrator.kube.listing import iterate_items
from storage_migrator.kube.resources import ResourceRef
from storage_migrator.operations.flow_run_jobs import ADMISSION_POLICY, REFUSALS, WORKER_ACCOUNT, admission_policy
from storage_migrator.operations.rbac import DEFAULT_NAME, UnknownResource, build_role
from storage_migrator.settings.engine import EngineSetting

__all__ = ["command"]


def _names(text: str | None) -> list[str]:
    return [n.strip().lower() for n in (text or "").split(",") if n.strip()]


def _service_account(text: str) -> tuple[str, str]:
    namespace, sep, name = text.partition(":")
    if not sep or not namespace or not name:
        raise typer.BadParameter(f"{text!r} is not NAMESPACE:NAME (e.g. storage-migrator:storage-migrator)")
    return namespace, name


APISERVICES = ResourceRef(group="apiregistration.k8s.io", version="v1", resource="apiservices")


def _aggregated_groups(api: Any) -> frozenset[str]:
    """The groups an aggregated API server serves (an APIService with a service): kcm cannot migrate them."""
    try:
        services = list(iterate_items(api, APISERVICES, limit=500))
    except KubeError as exc:
        print(f"warning: could not list APIServices ({exc}): aggregated APIs are not told apart", file=sys.stderr)
        return frozenset()
    return frozenset(str((s.get("spec") or {}).get("group") or "") for s in services
                     if (s.get("spec") or {}).get("service") is not None)  # fmt: skip


def _table(items: list[dict[str, Any]]) -> str:
    """Every rule of the ClusterRole and of the Roles, with where it applies."""
    rows = [[item["kind"] if item["kind"] == "ClusterRole" else f"Role in {item['metadata']['namespace']}",
             ",".join(g or '""' for g in r.get("apiGroups", [])) or "-",
             ",".join(r.get("resources", [])) or "-", ",".join(r.get("nonResourceURLs", [])) or "-",
             ",".join(r["verbs"])] for item in items if item["kind"] in ("ClusterRole", "Role") for r in item["rules"]]  # fmt: skip
    table = render_table(["GRANTED BY", "API GROUPS", "RESOURCES", "NON-RESOURCE URLS", "VERBS"], rows)
    policies = [item for item in items if item["kind"] == "ValidatingAdmissionPolicy"]
    if not policies:
        return table
    refusals = [[ADMISSION_POLICY, str(i + 1), refusal] for i, refusal in enumerate(REFUSALS)]
    return table + "\n\n" + render_table(
        [f"POLICY (Jobs and Pods of {WORKER_ACCOUNT})", "#", "REFUSES UNLESS"], refusals)  # fmt: skip


def command(
    ctx: typer.Context,
    resources: Annotated[
        str | None,
        typer.Option(
            metavar="RESOURCE[,RESOURCE...]",
            help="the resources to migrate, as '<resource>' (core) or '<resource>.<group>', e.g. "
            "secrets,configmaps; default: every resource detection tracks (STORAGE_MIGRATOR_INCLUDE/EXCLUDE_RESOURCES)",
        ),
    ] = None,
    no_put: Annotated[
        bool, typer.Option("--no-put", help="never grant update: resources that serve no patch cannot be migrated")
    ] = False,
    name: Annotated[str, typer.Option(help="name of the ClusterRole and of its ClusterRoleBinding")] = DEFAULT_NAME,
    service_account: Annotated[
        str, typer.Option(metavar="NAMESPACE:NAME", help="the workers' ServiceAccount the role is bound to")
    ] = "storage-migrator:storage-migrator",
    with_policy: Annotated[
        bool,
        typer.Option(
            "--admission-policy",
            help="also the ValidatingAdmissionPolicy and binding that refuse any "
            "flow-run Job but the install's (deployments/admission/; needs --image)",
        ),
    ] = False,
    image: Annotated[
        str | None,
        typer.Option(
            metavar="IMAGE",
            help="with --admission-policy: the install's image, the one "
            "the Jobs may run (by digest: REGISTRY/storage-migrator@sha256:...)",
        ),
    ] = None,
    engine: Annotated[
        EngineOption | None,
        typer.Option(
            help="the engine the workers run (default: STORAGE_MIGRATOR_ENGINE, else client): in-tree "
            "grants list but no patch or update on any migrated resource, and get, create and delete "
            "on kube-controller-manager's migrations (storagemigration.k8s.io); auto grants both"
        ),
    ] = None,
    output: Output = OutputFormat.yaml,
) -> None:
    """Print a ClusterRole (and its binding) for exactly the resources to migrate, for kubectl apply -f -.

    Also a Role (and binding) in kube-system: list the API servers' identity Leases, which a key rotation needs to know every server (issue 19); and a Role (and binding) in the install's namespace (STORAGE_MIGRATOR_NAMESPACE, default storage-migrator): the runs' writer Leases, the write budget and the one-writer lock of each request (issue 37). With --admission-policy --image IMAGE, also the ValidatingAdmissionPolicy and binding of deployments/admission/ (issue 35): they refuse any Job or Pod of the worker's ServiceAccount but the install's (one container; IMAGE; the command storage-migrator-run; no hook or probe; the ServiceAccount storage-migrator; only the runner's environment, the credentials by reference; no volume beyond /tmp); the table lists each refusal.

    list and patch on each resource (update only where it serves no patch, never with --no-put), plus the fixed rules of deployments/rbac/storage-migrator.yaml for the migrator's own API, CRDs, APIServices, StorageVersions, EndpointSlices, discovery and /metrics. With --engine in-tree: list only on each resource (kube-controller-manager writes), a resource its migrator cannot migrate (events, aggregated APIs) refused when named and left out otherwise. Reads discovery (and APIServices for the in-tree engine); writes nothing. Exit codes: 0 done; 1 a resource cannot be granted (named on stderr) or the cluster could not be read; 2 a usage error.
    """
    if with_policy and not image:
        raise typer.BadParameter("the policy pins the flow-run Jobs' image: give --image (the one the kustomize "
                                 "install's images: names)", param_hint="--image")  # fmt: skip
    settings = settings_of(ctx)
    account = _service_account(service_account)
    chosen: EngineSetting = engine.value if engine is not None else settings.engine
    with kube_api(settings) as api:
        found = discover(api, timeout=settings.request_timeout_seconds)
        aggregated = _aggregated_groups(api) if chosen == "in-tree" else frozenset()
    try:
        built = build_role(found.resources, resources=_names(resources), allow_put=not no_put,
                           include=settings.include_resources, exclude=settings.exclude_resources,
                           name=name, service_account=account, engine=chosen,
                           aggregated_groups=aggregated, namespace=settings.namespace)  # fmt: skip
    except UnknownResource as exc:
        print(f"storage-migrator: {exc}", file=sys.stderr)
        raise typer.Exit(1) from exc
    for resource, why in built.left_out.items():
        print(f"warning: {resource} not covered: {why}", file=sys.stderr)
    for failure in found.failed:
        print(f"warning: could not read {failure.group_version}: its resources are not covered", file=sys.stderr)
    if resources:
        print(f"note: the workers must migrate only these: set STORAGE_MIGRATOR_INCLUDE_RESOURCES="
              f"{','.join(built.resources)} (docs/cli.md)", file=sys.stderr)  # fmt: skip
    elif chosen == "in-tree" and built.left_out:
        print(f"note: detection must leave out what the in-tree engine cannot migrate: set "
              f"STORAGE_MIGRATOR_EXCLUDE_RESOURCES={','.join(built.left_out)} (docs/cli.md)", file=sys.stderr)  # fmt: skip
    if chosen == "in-tree":
        print("note: the workers must run the in-tree engine: STORAGE_MIGRATOR_ENGINE=in-tree (in the kustomize "
              "install, the ConfigMap storage-migrator-cluster: deployments/rbac/in-tree/)", file=sys.stderr)  # fmt: skip
    manifest = dict(built.manifest)
    if with_policy and image:
        manifest["items"] = [*manifest["items"], *admission_policy(image)]
    emit(output, manifest, lambda: _table(manifest["items"]))
