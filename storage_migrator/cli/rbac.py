"""``storage-migrator rbac``: a ClusterRole for exactly the resources to migrate.

Issue 14 item 3: printed ready for ``kubectl apply -f -``; storage_migrator/operations/rbac.py
builds it (the rules, and why each).
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from storage_migrator.cli.options import kube_api, settings_of
from storage_migrator.cli.output import Output, OutputFormat, emit, render_table
from storage_migrator.kube.discovery import discover
from storage_migrator.operations.rbac import DEFAULT_NAME, UnknownResource, build_role

__all__ = ["command"]


def _names(text: str | None) -> list[str]:
    return [n.strip().lower() for n in (text or "").split(",") if n.strip()]


def _service_account(text: str) -> tuple[str, str]:
    namespace, sep, name = text.partition(":")
    if not sep or not namespace or not name:
        raise typer.BadParameter(f"{text!r} is not NAMESPACE:NAME (e.g. storage-migrator:storage-migrator)")
    return namespace, name


def _table(items: list[dict[str, Any]]) -> str:
    """Every rule of the ClusterRole and of the Roles, with where it applies."""
    rows = [[item["kind"] if item["kind"] == "ClusterRole" else f"Role in {item['metadata']['namespace']}",
             ",".join(g or '""' for g in r.get("apiGroups", [])) or "-",
             ",".join(r.get("resources", [])) or "-", ",".join(r.get("nonResourceURLs", [])) or "-",
             ",".join(r["verbs"])] for item in items if item["kind"] in ("ClusterRole", "Role") for r in item["rules"]]  # fmt: skip
    return render_table(["GRANTED BY", "API GROUPS", "RESOURCES", "NON-RESOURCE URLS", "VERBS"], rows)


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
    output: Output = OutputFormat.yaml,
) -> None:
    """Print a ClusterRole (and its binding) for exactly the resources to migrate, for kubectl apply -f -.

    Also a Role (and binding) in kube-system: list the API servers' identity Leases, which a key rotation needs to know every server (issue 19); and a Role (and binding) in the install's namespace (STORAGE_MIGRATOR_NAMESPACE, default storage-migrator): the runs' writer Leases, the write budget and the one-writer lock of each request (issue 37).

    list and patch on each resource (update only where it serves no patch, never with --no-put), plus the fixed rules of deployments/rbac/storage-migrator.yaml for the migrator's own API, CRDs, APIServices, StorageVersions, EndpointSlices, discovery and /metrics. Reads discovery; writes nothing. Exit codes: 0 done; 1 a resource cannot be granted (named on stderr) or the cluster could not be read; 2 a usage error.
    """
    settings = settings_of(ctx)
    account = _service_account(service_account)
    with kube_api(settings) as api:
        found = discover(api, timeout=settings.request_timeout_seconds)
    try:
        built = build_role(found.resources, resources=_names(resources), allow_put=not no_put,
                           include=settings.include_resources, exclude=settings.exclude_resources,
                           name=name, service_account=account, namespace=settings.namespace)  # fmt: skip
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
    emit(output, built.manifest, lambda: _table(built.manifest["items"]))
