"""``storage-migrator verify-etcd``: what etcd holds under a prefix, by key or storage version.

Seed 003: an old encryption key may be removed only once no value uses it.
Read-only, at one etcd revision; it never prints a value or a key (Secrets).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from storage_migrator.cli.output import Output, OutputFormat, emit, render_table

if TYPE_CHECKING:
    from storage_migrator.rotation.etcd_scan import PrefixScan

__all__ = ["command"]


def _table(scan: PrefixScan) -> str:
    t = scan.tally
    heading = f"{t.total} values under {scan.prefix} at etcd revision {scan.revision}"
    if not t.total:
        return heading
    rows = [["encrypted", key, str(n)] for key, n in sorted(t.by_key.items())]
    rows += [["unencrypted", version, str(n)] for version, n in sorted(t.unencrypted.items())]
    rows += [["unknown", reason, str(n)] for reason, n in sorted(t.unknown_reasons.items())]
    return heading + "\n" + render_table(["STORED AS", "KEY / API VERSION", "VALUES"], rows)


def _data(scan: PrefixScan) -> dict[str, Any]:
    t = scan.tally
    return {"prefix": scan.prefix, "revision": scan.revision, "total": t.total, "by_key": dict(sorted(t.by_key.items())),
            "unencrypted": dict(sorted(t.unencrypted.items())), "unknown": t.unknown}  # fmt: skip


def _met(scan: PrefixScan, expect_key: str) -> bool:
    """Whether every value (at least one) is under ``expect_key``; says why not on stderr."""
    t = scan.tally
    if t.total == 0:
        print(f"verify-etcd: no values under {scan.prefix}: nothing shows they use key {expect_key!r}; "
              "check the prefix", file=sys.stderr)  # fmt: skip
        return False
    missing = t.not_under(expect_key)
    if missing:
        print(f"verify-etcd: {missing} of {t.total} values under {scan.prefix} are not encrypted with key "
              f"{expect_key!r}: keep the other keys and migrate again", file=sys.stderr)  # fmt: skip
        return False
    return True


def command(
    endpoint: Annotated[str, typer.Argument(metavar="ENDPOINT", help="etcd client URL, e.g. https://10.0.0.1:2379")],
    prefix: Annotated[str, typer.Argument(metavar="PREFIX", help="etcd key prefix, e.g. /registry/secrets/")],
    output: Output = OutputFormat.table,
    cacert: Annotated[
        Path | None, typer.Option(help="CA bundle that verifies etcd's server certificate (as etcdctl)")
    ] = None,
    cert: Annotated[Path | None, typer.Option(help="client certificate for etcd (as etcdctl)")] = None,
    key: Annotated[Path | None, typer.Option(help="private key of --cert (as etcdctl)")] = None,
    expect_key: Annotated[
        str | None,
        typer.Option(
            metavar="NAME",
            help=(
                "exit 1 unless every value under PREFIX is encrypted with key NAME (and there is at least one): "
                "the check to script before removing an old key from the EncryptionConfiguration"
            ),
        ),
    ] = None,
) -> None:
    """Read-only: count the values under an etcd key prefix by encryption key or storage apiVersion.

    Read etcd directly (one consistent revision) and count the values under a key prefix by encryption
    key name (k8s:enc:<provider>:v1:<key>:) or, unencrypted, by storage apiVersion (JSON or the k8s\\x00
    protobuf envelope); a value it cannot classify counts as unknown. It never prints a value or a key.
    Exit codes: 0 done; 1 --expect-key not met; 2 etcd not read.
    """
    # etcd's gRPC client only where etcd is read: the other commands start without it (issue 29).
    from storage_migrator.rotation.etcd_scan import EtcdEndpoint, EtcdScanError, scan_prefix

    try:
        scan = scan_prefix(EtcdEndpoint(url=endpoint, cacert=cacert, cert=cert, key=key), prefix)
    except EtcdScanError as exc:
        print(f"storage-migrator: {exc}", file=sys.stderr)
        raise typer.Exit(2) from exc
    emit(output, _data(scan), lambda: _table(scan))
    if expect_key is not None and not _met(scan, expect_key):
        raise typer.Exit(1)
