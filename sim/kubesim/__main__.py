"""kubesim's command line.

python -m kubesim serve --kubeconfig PATH [--etcd URL] [--port N] [--servers N] [--insecure-http]
    [--encryption-provider-config FILE ...] [--token-auth-file FILE --authorization-mode RBAC]
    [--no-svm-controller] [--svm-gc-delay S] [--kcm-kube-api-qps N --kcm-kube-api-burst N]
python -m kubesim admin --kubeconfig PATH <command> ...
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from kubesim.admin import Admin, AdminError
from kubesim.resources import FEATURE_GATES

# Issue 29: `admin` is a small HTTPS client that tools run once per command (a test runs a
# dozen): it imports neither the server (etcd's gRPC client, the registry, CEL) nor the PKI;
# `serve` imports them when it runs.

_SERVE_HELP = """\
Start a simulated Kubernetes API server backed by a real etcd, write a kubeconfig
for it, and serve until SIGINT or SIGTERM; then stop what was started.

It serves HTTPS with a CA and a serving certificate (127.0.0.1, localhost)
generated at start; the kubeconfig carries the CA. --insecure-http: plain HTTP.
Unless --etcd names a running etcd, kubesim starts Debian's etcd (apt-get install
etcd-server) on a free loopback port with a temporary data dir on /dev/shm.
Use the kubeconfig with kubectl or any Kubernetes client:

    kubectl --kubeconfig PATH get namespaces
"""

_ADMIN_HELP = """\
Drive the admin API of a running kubesim (outside the Kubernetes API, under
/_kubesim/ on the same port): stand-ins for an upgrade (a built-in resource's
storage version), encryption keys, feature gates, what /metrics reports, etcd
compaction, fault injection, counters.
"""


def _print(doc: Any) -> None:
    print(json.dumps(doc, indent=2, sort_keys=True))


def serve(args: argparse.Namespace) -> int:
    from kubesim.cluster import Cluster
    from kubesim.encryption import ConfigError
    from kubesim.svm_controller import ControllerSettings
    from kubesim.tls import Authority

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        cluster = Cluster(
            etcd_url=args.etcd,
            servers=args.servers,
            port=args.port,
            authz_warmup_seconds=args.authz_warmup,
            identity_lease_seconds=args.identity_lease_duration_seconds,
            feature_gates=args.feature_gates,
            encryption_config=_encryption_files(args.encryption_provider_config),
            automatic_reload=args.encryption_provider_config_automatic_reload,
            reload_interval=args.encryption_provider_config_reload_interval,
            token_auth_file=args.token_auth_file,
            authorization_mode=args.authorization_mode,
            insecure_http=args.insecure_http,
            authority=Authority.in_directory(args.cert_dir) if args.cert_dir and not args.insecure_http else None,
            svm_controller=ControllerSettings(
                enabled=args.svm_controller,
                gc_delay=args.svm_gc_delay,
                missing_resource_grace=args.svm_missing_resource_grace,
                qps=args.kcm_kube_api_qps,
                burst=args.kcm_kube_api_burst,
            ),
        ).start()
    except (RuntimeError, ConfigError, ValueError) as exc:
        print(f"kubesim: {exc}", file=sys.stderr)
        return 1
    try:
        cluster.write_kubeconfig(args.kubeconfig)
        for i, server in enumerate(cluster.servers):
            print(f"kubesim: API server {i} on {server.url} (etcd {cluster.etcd_url})", flush=True)
        print(f"kubesim: kubeconfig written to {args.kubeconfig}", flush=True)
        stop.wait()
    finally:
        cluster.stop()
        print("kubesim: stopped", flush=True)
    return 0


def _encryption_files(files: list[str] | None) -> str | list[str] | None:
    """--encryption-provider-config given once: one file for every server; more: one per server."""
    if not files:
        return None
    return files[0] if len(files) == 1 else files


def _fault_rule(args: argparse.Namespace) -> dict[str, Any]:
    rule: dict[str, Any] = {}
    for field in ("verb", "resource", "namespace", "name", "subresource", "code", "retry_after", "times"):
        value = getattr(args, field)
        if value is not None:
            rule[field] = value
    if args.plain:
        rule["shape"] = "plain"
    if args.latency:
        rule["latency"] = args.latency
    if args.drop:
        rule["drop"] = True
    rule["rate"] = args.rate
    return rule


def _gates(text: str) -> dict[str, bool]:
    """`StorageVersionMigrator=true,Other=false`, as kube-apiserver's --feature-gates."""
    gates = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        if name not in FEATURE_GATES or value.lower() not in ("true", "false"):
            raise argparse.ArgumentTypeError(
                f"{item!r}: expected GATE=true|false with GATE among {list(FEATURE_GATES)}"
            )
        gates[name] = value.lower() == "true"
    return gates


def _seconds(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text}: expected seconds, 0 or more")
    return value


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text}: expected a number above 0")
    return value


def _describe_value(value: bytes) -> str:
    from kubesim.codec import ENCRYPTED_PREFIX

    if value.startswith(ENCRYPTED_PREFIX):
        return value[: value.index(b":", len(ENCRYPTED_PREFIX) + 10) + 1].decode(errors="replace") + "<ciphertext>"
    try:
        doc = json.loads(value)
        return f"apiVersion={doc.get('apiVersion')} kind={doc.get('kind')}"
    except ValueError:
        return repr(value[:40])


def admin(args: argparse.Namespace) -> int:
    client = Admin.from_kubeconfig(args.kubeconfig, args.context)
    cmd = args.command
    if cmd == "state":
        _print(client.config())
    elif cmd == "storage-version":
        _print(client.set_storage_version(args.resource, args.version, group=args.group))
    elif cmd == "encryption":
        resources = args.resources.split(",") if args.resources is not None else None
        _print(client.set_encryption([k for k in args.keys.split(",") if k], resources=resources))
    elif cmd == "feature-gates":
        _print(client.set_feature_gates(args.gates)["featureGates"])
    elif cmd == "verbs":
        verbs = None if args.verbs == "default" else [v for v in args.verbs.split(",") if v]
        _print(client.set_verbs(args.resource, verbs, group=args.group))
    elif cmd == "metrics":
        _print(client.set_metrics(encryption_config_info=args.encryption_config_info)["metrics"])
    elif cmd == "svm-controller":
        if args.restart:
            client.restart_svm_controller()
        changes = {"enabled": args.enabled, "gc_delay": args.gc_delay, "missing_resource_grace": args.missing_grace,
                   "qps": args.qps, "burst": args.burst}  # fmt: skip
        if any(v is not None for v in changes.values()):
            _print(client.set_svm_controller(**changes))
        else:
            _print(client.svm_controller())
    elif cmd == "compact":
        _print({"compactedAtRevision": client.compact()})
    elif cmd == "faults":
        if args.action == "list":
            _print(client.faults())
        elif args.action == "clear":
            client.clear_faults()
            _print([])
        elif args.action == "set":
            rules = json.loads(Path(args.file).read_text()) if args.file else [_fault_rule(args)]
            _print(client.set_faults(rules if isinstance(rules, list) else rules["rules"]))
        else:  # add
            _print(client.set_faults([*client.faults(), _fault_rule(args)]))
    elif cmd == "counters":
        _print(client.reset_counters() if args.reset else client.counters())
    elif cmd == "stored":
        from kubesim.etcd import EtcdStore, prefix_end

        store = EtcdStore(client.config()["etcdURL"])
        try:
            prefix = args.prefix.encode()
            for kv in store.range(prefix, prefix_end(prefix)).kvs:
                print(f"{kv.key.decode()}  rv={kv.mod_revision}  {_describe_value(kv.value)}")
        finally:
            store.close()
    return 0


def parser(*, serving: bool = True) -> argparse.ArgumentParser:
    """Both commands; `serving=False`: `admin` alone (its help and errors are the same)."""
    top = argparse.ArgumentParser(prog="python -m kubesim", description="A Kubernetes API server simulator over etcd.")
    sub = top.add_subparsers(dest="mode", required=True)
    if serving:
        _add_serve(sub)
    _add_admin(sub)
    return top


def _add_serve(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from kubesim.leases import LEASE_SECONDS

    p_serve = sub.add_parser("serve", help="start kubesim", description=_SERVE_HELP,
                             formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p_serve.add_argument("--kubeconfig", required=True, help="where to write the kubeconfig for the server(s)")
    p_serve.add_argument("--etcd", help="URL of a running etcd to use instead of starting one")
    p_serve.add_argument("--port", type=int, default=0, help="port of the first API server (default: a free one)")
    p_serve.add_argument("--servers", type=int, default=1,
                         help="API servers sharing the etcd, for HA; contexts kubesim-0, kubesim-1, ...")  # fmt: skip
    p_serve.add_argument("--authz-warmup", type=float, default=0.0, metavar="SECONDS",
                         help="after starting, answer 403 to every API request (but discovery and health) and "
                         "500 to /readyz for SECONDS, as kube-apiserver does until its RBAC caches fill")  # fmt: skip
    p_serve.add_argument("--feature-gates", type=_gates, default={}, metavar="GATE=true,...",
                         help=f"optional built-in APIs, as kube-apiserver's flag: {', '.join(FEATURE_GATES)} "
                         "(StorageVersionAPI: internal.apiserver.k8s.io, on by default in kubesim; "
                         "StorageVersionMigrator: storagemigration.k8s.io v1 and v1beta1 and its controller, off)")  # fmt: skip
    p_serve.add_argument("--identity-lease-duration-seconds", type=int, default=LEASE_SECONDS, metavar="SECONDS",
                         help="each API server's identity lease in kube-system, as kube-apiserver's flag (default "
                         f"{LEASE_SECONDS}); a server gone for longer loses its StorageVersion entries")  # fmt: skip
    p_serve.add_argument("--encryption-provider-config", metavar="FILE", action="append",
                         help="an EncryptionConfiguration file (apiserver.config.k8s.io/v1; aescbc and identity "
                         "providers), as kube-apiserver's flag; an invalid file refuses to start. Once: every server "
                         "reads it; once per --servers: server i reads the i-th (a rolling update). Without it, "
                         "Secrets are encrypted with key1 and `admin encryption` changes the keys")  # fmt: skip
    p_serve.add_argument("--encryption-provider-config-automatic-reload", action="store_true",
                         help="re-read the file when its content changes; an invalid new file keeps the previous "
                         "configuration (logged, and shown by `admin state`)")  # fmt: skip
    p_serve.add_argument("--encryption-provider-config-reload-interval", type=float, default=1.0, metavar="SECONDS",
                         help="how often the file is polled (kubesim only; kube-apiserver checks about every "
                         "minute; default 1)")  # fmt: skip
    p_serve.add_argument("--token-auth-file", metavar="FILE",
                         help="authenticate bearer tokens from this CSV file (token,user,uid,\"group1,group2\"), as "
                         "kube-apiserver's flag; other requests get 401. The kubeconfig written gets a token of its "
                         "own in group system:masters")  # fmt: skip
    p_serve.add_argument("--authorization-mode", choices=["AlwaysAllow", "RBAC"], default="AlwaysAllow",
                         help="RBAC: authorize every request against the ClusterRoles, ClusterRoleBindings, Roles and "
                         "RoleBindings stored (needs --token-auth-file); default AlwaysAllow")  # fmt: skip
    p_serve.add_argument("--insecure-http", action="store_true",
                         help="serve plain HTTP instead of HTTPS (by default kubesim serves HTTPS, as kube-apiserver, "
                         "with a CA generated at start, written into the kubeconfig as certificate-authority-data)")  # fmt: skip
    p_serve.add_argument("--cert-dir", metavar="DIR",
                         help="keep the CA and serving certificate here, as kube-apiserver's flag: reused when "
                         "present, else generated and written (a restart then keeps them; default: new ones in "
                         "memory)")  # fmt: skip
    p_serve.add_argument("--svm-controller", action=argparse.BooleanOptionalAction, default=True,
                         help="run kube-controller-manager's storage version migrator for the in-tree "
                         "storagemigration.k8s.io API (it works while the first server's StorageVersionMigrator "
                         "gate is on); --no-svm-controller: the API served, nothing migrating (default: on)")  # fmt: skip
    p_serve.add_argument("--svm-gc-delay", type=_seconds, default=1.0, metavar="SECONDS",
                         help="how long the controller's garbage-collector cache takes to reach a migration's "
                         "resourceVersion (a real one took ~80 s; default 1)")  # fmt: skip
    p_serve.add_argument("--svm-missing-resource-grace", type=_seconds, default=3.0, metavar="SECONDS",
                         help="how long after its creation a migration of a resource the garbage collector does "
                         "not watch (events) waits before it fails (kcm: 60; default 3)")  # fmt: skip
    p_serve.add_argument("--kcm-kube-api-qps", type=_positive, default=50.0, metavar="QPS",
                         help="the controller's client rate, as kube-controller-manager's --kube-api-qps (default 50, "
                         "which gives the ~50 objects/s measured on a real v1.36.2; kcm's flag defaults to 20)")  # fmt: skip
    p_serve.add_argument(
        "--kcm-kube-api-burst",
        type=int,
        default=100,
        metavar="N",
        help="as kube-controller-manager's --kube-api-burst (default 100; kcm's flag: 30)",
    )
    p_serve.add_argument("-v", "--verbose", action="store_true", help="log every request")
    p_serve.set_defaults(func=serve)


def _add_admin(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p_admin = sub.add_parser("admin", help="drive a running kubesim", description=_ADMIN_HELP,
                             formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p_admin.add_argument("--kubeconfig", required=True, help="the kubeconfig `serve` wrote")
    p_admin.add_argument("--context", help="which API server (kubesim-0, kubesim-1, ...; default: the current one)")
    cmds = p_admin.add_subparsers(dest="command", required=True)
    cmds.add_parser("state", help="storage versions, encryption keys, etcd URL and revision")
    p_sv = cmds.add_parser("storage-version", help="change a built-in resource's storage version (an upgrade)")
    p_sv.add_argument("resource", help="e.g. configmaps, deployments")
    p_sv.add_argument("version", help="e.g. v2 (CRDs change theirs through the CRD, as on a real cluster)")
    p_sv.add_argument("--group", default="", help="API group, e.g. apps (default: core)")
    p_enc = cmds.add_parser("encryption", help="set the encryption keys, write key first")
    p_enc.add_argument("--keys", required=True, help="comma-separated key names, write key first; '' for none")
    p_enc.add_argument("--resources", help="comma-separated group-resources to encrypt (default: unchanged)")
    p_fg = cmds.add_parser("feature-gates", help="turn optional built-in APIs on or off on this server")
    p_fg.add_argument("gates", type=_gates, metavar="GATE=true|false[,...]", help=", ".join(FEATURE_GATES))
    p_vb = cmds.add_parser("verbs", help="serve a built-in resource with some verbs only (e.g. no patch: the PUT path)")
    p_vb.add_argument("resource", help="e.g. configmaps")
    p_vb.add_argument("verbs", help="comma-separated, e.g. get,list,update; 'default' for the resource's own")
    p_vb.add_argument("--group", default="", help="API group, e.g. apps (default: core)")
    p_m = cmds.add_parser("metrics", help="what this server's /metrics reports")
    p_m.add_argument("--encryption-config-info", action=argparse.BooleanOptionalAction, required=True,
                     help="apiserver_encryption_config_controller_last_config_info (its config hash); "
                     "--no-encryption-config-info: leave it out, as a server that predates it")  # fmt: skip
    p_svm = cmds.add_parser("svm-controller", help="kube-controller-manager's storage version migrator: show it, "
                            "switch it, restart it")  # fmt: skip
    p_svm.add_argument("--enable", dest="enabled", action="store_true", default=None, help="run it")
    p_svm.add_argument("--disable", dest="enabled", action="store_false",
                       help="stop it (the API stays served: migrations wait without status)")  # fmt: skip
    p_svm.add_argument("--gc-delay", type=_seconds, metavar="SECONDS", help="garbage-collector cache catch-up")
    p_svm.add_argument("--missing-grace", type=_seconds, metavar="SECONDS",
                       help="wait before a resource the garbage collector does not watch fails")  # fmt: skip
    p_svm.add_argument("--qps", type=_positive, help="its client's rate (kcm's --kube-api-qps)")
    p_svm.add_argument("--burst", type=int, help="its client's burst (kcm's --kube-api-burst)")
    p_svm.add_argument("--restart", action="store_true",
                       help="restart it as kcm restarts (running migrations are scanned again)")  # fmt: skip
    cmds.add_parser("compact", help="compact etcd at its current revision (old continue tokens then answer 410)")
    p_f = cmds.add_parser("faults", help="inject faults: set, add, list, clear")
    p_f.add_argument("action", choices=["set", "add", "list", "clear"])
    p_f.add_argument("--file", help="set: a JSON file holding a list of rules")
    p_f.add_argument("--verb", help="get, list, watch, create, update, patch, delete")
    p_f.add_argument("--resource", help="group-resource, e.g. secrets or widgets.example.com")
    p_f.add_argument("--namespace")
    p_f.add_argument("--name")
    p_f.add_argument("--subresource")
    p_f.add_argument("--code", type=int, help="HTTP status to answer (429, 500, 503, 422, ...)")
    p_f.add_argument("--retry-after", type=int, help="seconds, sent as Retry-After")
    p_f.add_argument("--plain", action="store_true", help="429 as priority-and-fairness' plain text")
    p_f.add_argument("--latency", type=float, default=0.0, help="seconds added before the answer")
    p_f.add_argument("--drop", action="store_true", help="drop the connection without an answer")
    p_f.add_argument("--rate", type=float, default=1.0, help="probability a matching request is hit (0..1)")
    p_f.add_argument("--times", type=int, help="fire at most this many times")
    p_c = cmds.add_parser("counters", help="requests by verb, bytes, etcd writes")
    p_c.add_argument("--reset", action="store_true")
    p_st = cmds.add_parser("stored", help="what etcd holds under a key prefix (apiVersion or encryption key)")
    p_st.add_argument("prefix", nargs="?", default="/registry/", help="e.g. /registry/secrets/")
    p_admin.set_defaults(func=admin)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parser(serving=argv[:1] != ["admin"]).parse_args(argv)
    try:
        return int(args.func(args))
    except AdminError as exc:
        print(f"kubesim admin: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
