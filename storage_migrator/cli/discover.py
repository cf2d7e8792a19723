"""``storage-migrator discover``: detection's input, as detection sees it.

Seed 000: detection polls the storageVersionHash of every persisted resource;
DESIGN 4.4: which source says what each API server encodes (the StorageVersion
API, one discovery poll per server, or one document), with each server's hash.
Issue 19: the encryption configuration each live API server reports on
/metrics, the table a key rotation waits on.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from storage_migrator.agreement.apiservers import Agreement, observe_agreement, observe_server_configs
from storage_migrator.agreement.server_configs import ServerConfigs
from storage_migrator.cli.options import kube_api, settings_of
from storage_migrator.cli.output import Output, OutputFormat, emit, render_table
from storage_migrator.kube.discovery import Discovery, discover, pick_preferred
from storage_migrator.kube.errors import KubeError

__all__ = ["command"]

HEADERS = ["RESOURCE", "GROUP", "VERSION", "KIND", "NAMESPACED", "STORAGE VERSION HASH"]


def _per_server(agreement: Agreement) -> dict[tuple[str, str], dict[str, str]]:
    """(group, resource) -> {server: hash}."""
    out: dict[tuple[str, str], dict[str, str]] = {}
    for r in agreement.reporters:
        out.setdefault((r.group, r.resource), {})[r.reporter_id] = r.hash
    return out


def _table(found: Discovery, agreement: Agreement, *, show_all: bool) -> str:
    resources = found.resources if show_all else [r for r in pick_preferred(found.resources) if r.persisted]
    servers = agreement.servers if agreement.source != "discovery" else []
    per_server = _per_server(agreement)
    rows = []
    for r in sorted(resources, key=lambda r: (r.group, r.resource, r.version)):
        heard = per_server.get((r.group, r.resource), {})
        rows.append([r.resource, r.group or "(core)", r.version, r.kind, str(r.namespaced).lower(),
                     r.storage_version_hash or "-", *(heard.get(s, "-") for s in servers)])  # fmt: skip
    heading = f"agreement among API servers from: {agreement.source} ({', '.join(agreement.servers) or 'one server'})"
    return heading + "\n" + render_table([*HEADERS, *servers], rows)


def _configs_table(configs: ServerConfigs | None, error: str | None) -> str:
    if configs is None:
        return f"encryption configuration per API server: not known ({error})"
    common = configs.common_hash
    verdict = f"every API server runs {common}" if common else "NOT one configuration: a key rotation would wait"
    rows = [[r["server"], r["config hash"], r["heard"], r["via"]] for r in configs.rows()]
    return (f"encryption configuration per API server (/metrics): {verdict}\n"
            + render_table(["API SERVER", "CONFIG HASH", "HEARD", "VIA"], rows))  # fmt: skip


def command(
    ctx: typer.Context,
    show_all: Annotated[bool, typer.Option("--all", help="every version and sub-resource, not just preferred")] = False,
    output: Output = OutputFormat.table,
) -> None:
    """Persisted resources and their storage version hashes, as detection sees them.

    Exit codes: 0 done; 1 a group version did not answer (listed on stderr) or the cluster could not be read.
    """
    settings = settings_of(ctx)
    with kube_api(settings) as api:
        found = discover(api, timeout=settings.request_timeout_seconds)
        agreement = observe_agreement(api, settings, found.resources)
        configs, error = None, None
        try:
            configs = observe_server_configs(api, settings)
        except KubeError as exc:  # e.g. no `list` on leases in kube-system: said, not hidden
            error = str(exc)
    data = {**found.model_dump(mode="json"), "agreement": agreement.model_dump(mode="json"),
            "encryptionConfigs": configs.model_dump(mode="json") if configs else {"error": error}}  # fmt: skip
    emit(output, data,
         lambda: _table(found, agreement, show_all=show_all) + "\n\n" + _configs_table(configs, error))  # fmt: skip
    if configs is not None:
        for address, why in configs.unheard.items():
            print(f"warning: /metrics of {address} not read: {why}", file=sys.stderr)
    for server, why in agreement.unheard.items():
        print(f"warning: API server {server} not heard: {why}", file=sys.stderr)
    for failure in found.failed:
        print(
            f"warning: could not read {failure.group_version}: {failure.code} {failure.reason}: {failure.message}",
            file=sys.stderr,
        )
    if found.failed:
        raise typer.Exit(1)
