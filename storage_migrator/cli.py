"""The `storage-migrator` command.

Design decision: the CLI reads the cluster through the same access layer as
the flows (so what it shows is what they see) and prints tables like `kubectl
get`. It grows with the flows: today it shows discovery, the input of
detection (seed 000: the storageVersionHash of every persisted resource), and
which source of agreement among API servers detection uses, with each server's
hash per resource (DESIGN 4.4).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from storage_migrator.apiservers import Agreement, observe_agreement
from storage_migrator.etcd_scan import EtcdEndpoint, EtcdScanError, PrefixScan, scan_prefix
from storage_migrator.kube.connection import ConnectionConfigError, api_client_from_settings
from storage_migrator.kube.discovery import Discovery, discover, pick_preferred
from storage_migrator.kube.errors import KubeError
from storage_migrator.settings import Settings

__all__ = ["main"]


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("   ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows)


def _per_server(agreement: Agreement) -> dict[tuple[str, str], dict[str, str]]:
    """(group, resource) -> {server: hash}."""
    out: dict[tuple[str, str], dict[str, str]] = {}
    for r in agreement.reporters:
        out.setdefault((r.group, r.resource), {})[r.reporter_id] = r.hash
    return out


def _discovery_rows(found: Discovery, agreement: Agreement, *, show_all: bool) -> list[list[str]]:
    resources = found.resources if show_all else [r for r in pick_preferred(found.resources) if r.persisted]
    servers = agreement.servers if agreement.source != "discovery" else []
    per_server = _per_server(agreement)
    rows = [["RESOURCE", "GROUP", "VERSION", "KIND", "NAMESPACED", "STORAGE VERSION HASH", *servers]]
    for r in sorted(resources, key=lambda r: (r.group, r.resource, r.version)):
        heard = per_server.get((r.group, r.resource), {})
        rows.append([r.resource, r.group or "(core)", r.version, r.kind, str(r.namespaced).lower(),
                     r.storage_version_hash or "-", *(heard.get(s, "-") for s in servers)])  # fmt: skip
    return rows


def _cmd_discover(args: argparse.Namespace, settings: Settings) -> int:
    api = api_client_from_settings(settings)
    try:
        found = discover(api, timeout=settings.request_timeout_seconds)
        agreement = observe_agreement(api, settings, found.resources)
    finally:
        api.close()  # type: ignore[no-untyped-call]
    if args.output == "json":
        print(json.dumps({**found.model_dump(mode="json"), "agreement": agreement.model_dump(mode="json")}, indent=2))
    else:
        print(f"agreement among API servers from: {agreement.source} ({', '.join(agreement.servers) or 'one server'})")
        print(_table(_discovery_rows(found, agreement, show_all=args.all)))
    for server, why in agreement.unheard.items():
        print(f"warning: API server {server} not heard: {why}", file=sys.stderr)
    for failure in found.failed:
        print(
            f"warning: could not read {failure.group_version}: {failure.code} {failure.reason}: {failure.message}",
            file=sys.stderr,
        )
    return 1 if found.failed else 0


def _verify_rows(scan: PrefixScan) -> list[list[str]]:
    t = scan.tally
    rows = [["STORED AS", "KEY / API VERSION", "VALUES"]]
    rows += [["encrypted", key, str(n)] for key, n in sorted(t.by_key.items())]
    rows += [["unencrypted", version, str(n)] for version, n in sorted(t.unencrypted.items())]
    rows += [["unknown", reason, str(n)] for reason, n in sorted(t.unknown_reasons.items())]
    return rows


def _cmd_verify_etcd(args: argparse.Namespace, settings: Settings) -> int:
    endpoint = EtcdEndpoint(url=args.endpoint, cacert=args.cacert, cert=args.cert, key=args.key)
    try:
        scan = scan_prefix(endpoint, args.prefix)
    except EtcdScanError as exc:
        print(f"storage-migrator: {exc}", file=sys.stderr)
        return 2
    t = scan.tally
    if args.output == "json":
        out = {"prefix": scan.prefix, "revision": scan.revision, "total": t.total, "by_key": dict(sorted(t.by_key.items())),
               "unencrypted": dict(sorted(t.unencrypted.items())), "unknown": t.unknown}  # fmt: skip
        print(json.dumps(out))
    else:
        print(f"{t.total} values under {scan.prefix} at etcd revision {scan.revision}")
        if t.total:
            print(_table(_verify_rows(scan)))
    if args.expect_key is None:
        return 0
    if t.total == 0:
        print(f"verify-etcd: no values under {scan.prefix}: nothing shows they use key {args.expect_key!r}; "
              "check the prefix", file=sys.stderr)  # fmt: skip
        return 1
    missing = t.not_under(args.expect_key)
    if missing:
        print(f"verify-etcd: {missing} of {t.total} values under {scan.prefix} are not encrypted with key "
              f"{args.expect_key!r}: keep the other keys and migrate again", file=sys.stderr)  # fmt: skip
        return 1
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="storage-migrator",
        description="Kubernetes storage version migration as Prefect flows.",
    )
    top.add_argument(
        "--kubeconfig", type=Path, help="kubeconfig file (default: STORAGE_MIGRATOR_KUBECONFIG, KUBECONFIG)"
    )
    top.add_argument("--context", help="kubeconfig context (default: the current one)")
    sub = top.add_subparsers(dest="command", required=True)
    p_disc = sub.add_parser(
        "discover",
        help="persisted resources and their storage version hashes, as detection sees them",
    )
    p_disc.add_argument("--all", action="store_true", help="every version and sub-resource, not just preferred")
    p_disc.add_argument("-o", "--output", choices=["table", "json"], default="table")
    p_disc.set_defaults(func=_cmd_discover)
    p_etcd = sub.add_parser(
        "verify-etcd",
        help="read-only: count the values under an etcd key prefix by encryption key or storage apiVersion",
        description=(
            "Read etcd directly (read-only, one consistent revision) and count the values under a key prefix "
            "by encryption key name (k8s:enc:<provider>:v1:<key>:) or, unencrypted, by storage apiVersion "
            "(JSON or the k8s\\x00 protobuf envelope); a value it cannot classify counts as unknown. "
            "It never prints a value or a key. Exit codes: 0 done; 1 --expect-key not met; 2 etcd not read."
        ),
    )
    p_etcd.add_argument("endpoint", metavar="ENDPOINT", help="etcd client URL, e.g. https://10.0.0.1:2379")
    p_etcd.add_argument("prefix", metavar="PREFIX", help="etcd key prefix, e.g. /registry/secrets/")
    p_etcd.add_argument("-o", "--output", choices=["table", "json"], default="table")
    p_etcd.add_argument("--cacert", type=Path, help="CA bundle that verifies etcd's server certificate (as etcdctl)")
    p_etcd.add_argument("--cert", type=Path, help="client certificate for etcd (as etcdctl)")
    p_etcd.add_argument("--key", type=Path, help="private key of --cert (as etcdctl)")
    p_etcd.add_argument(
        "--expect-key",
        metavar="NAME",
        help=(
            "exit 1 unless every value under PREFIX is encrypted with key NAME (and there is at least one): "
            "the check to script before removing an old key from the EncryptionConfiguration"
        ),
    )
    p_etcd.set_defaults(func=_cmd_verify_etcd)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    overrides = {k: v for k, v in {"kubeconfig": args.kubeconfig, "context": args.context}.items() if v is not None}
    try:
        settings = Settings(**overrides)
        return int(args.func(args, settings))
    except (KubeError, ConnectionConfigError) as exc:
        print(f"storage-migrator: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
