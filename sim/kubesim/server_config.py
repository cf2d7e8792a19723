"""What an upgrade changes on one simulated API server: its storage versions, its
encryption at rest (keys from the admin API, or kube-apiserver's
`--encryption-provider-config` file) and its feature gates."""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from kubesim import codec, encryption
from kubesim.resources import STORAGE_VERSION_API_GATE


@dataclass
class EncryptionConfig:
    """Which resources are encrypted at rest, and with which keys (write key first).

    Two sources. The admin API sets `resources` and `keys` (secrets derived from
    the key names; every key reads every resource). Or, as kube-apiserver's
    `--encryption-provider-config`, a file (sim/kubesim/encryption.py): then `file`
    alone decides, per resource, and `resources`/`keys` are not used.
    """

    resources: set[str] = field(default_factory=lambda: {"secrets"})
    keys: list[str] = field(default_factory=lambda: ["key1"])
    #: The parsed `--encryption-provider-config` file, swapped whole on a reload.
    file: encryption.EncryptionConfiguration | None = None
    file_path: Path | None = None
    #: Seconds between polls of the file (`--encryption-provider-config-automatic-reload`); None: read once.
    reload_interval: float | None = None
    #: The last failed reload (the previous configuration stays), None after a good one.
    reload_error: str | None = None

    @classmethod
    def from_file(cls, path: Path | str, *, reload_interval: float | None = None) -> EncryptionConfig:
        """Read at start: an invalid file raises encryption.ConfigError (the server refuses to start)."""
        return cls(file=encryption.load(path), file_path=Path(path), reload_interval=reload_interval)

    def transformer(self, group_resource: str) -> encryption.Transformer:
        config = self.file  # one read: a reload swaps the whole configuration
        if config is not None:
            return config.transformer(group_resource)
        keys = list(self.keys)
        write = keys[0] if group_resource in self.resources and keys else None
        return encryption.Transformer(
            write_key=write,
            write_secret=None,  # derived from the name (codec.derived_secret)
            read_keys={k: codec.derived_secret(k) for k in keys},
            plaintext_readable=True,
        )

    def write_key(self, group_resource: str) -> str | None:
        return self.transformer(group_resource).write_key

    @property
    def config_hash(self) -> str:
        """`sha256:<hex>` of the configuration in force (the `hash` label of /metrics, sim/kubesim/metrics.py).

        From a file: the hash of the file's bytes as last applied (a failed
        reload keeps the old one). From the admin API: the hash of
        `admin_document()`, kubesim's stand-in for the file's bytes."""
        config = self.file
        if config is not None:
            return config.hash
        return encryption.config_hash(admin_document(self.resources, self.keys))


def admin_document(resources: set[str] | list[str], keys: list[str]) -> bytes:
    """The EncryptionConfiguration file equivalent to admin-API encryption (`resources`, `keys`).

    kubesim's stand-in for the bytes of `--encryption-provider-config` when a
    server's encryption comes from the admin API (`Admin.set_encryption`): the
    hash of this document is what /metrics reports as `hash`. Rendered
    deterministically (resources sorted, keys in order, JSON with sorted keys),
    so the same resources and keys on two servers give the same bytes, and any
    change of the write key, the read keys or the resources gives others. It is a
    valid file (encryption.parse reads it) meaning what the admin settings mean:
    the listed resources written with the first key, every key (secrets derived
    from the names, codec.derived_secret) and plaintext read for every resource.
    """
    aescbc = [{"aescbc": {"keys": [{"name": k, "secret": base64.b64encode(codec.derived_secret(k)).decode()}
                                   for k in keys]}}] if keys else []  # fmt: skip
    identity: list[dict[str, object]] = [{"identity": {}}]
    rules: list[dict[str, object]] = []
    if resources and keys:
        rules.append({"resources": sorted(resources), "providers": aescbc + identity})
    rules.append({"resources": ["*.*"], "providers": identity + aescbc})
    doc = {"apiVersion": encryption.API_VERSION, "kind": encryption.KIND, "resources": rules}
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


def host_server_id(port: int) -> str:
    """The ID of the API server on `port` of this host, the same at every start.

    kube-apiserver's is "apiserver-" + the lower-case unpadded base32 of the first
    16 bytes of sha256(hostname, "kube-apiserver") (k8s.io/apiserver/pkg/server/
    config.go, KEP-1965): a restart on the same host keeps its identity lease and
    its StorageVersion entries. kubesim's servers share a host, so the port is
    part of it: `python -m kubesim serve --port N` started again is the same server.
    """
    digest = hashlib.sha256(f"{socket.gethostname()}:{port}/kube-apiserver".encode()).digest()
    return "apiserver-" + base64.b32encode(digest[:16]).decode().rstrip("=").lower()


@dataclass
class ServerConfig:
    """What an upgrade changes on one API server."""

    server_id: str = field(default_factory=lambda: f"apiserver-{uuid.uuid4().hex[:26]}")
    # storage group-resource ("events", "deployments.apps") -> storage version
    storage_versions: dict[str, str] = field(default_factory=dict)
    encryption: EncryptionConfig = field(default_factory=EncryptionConfig)
    # Feature gates that serve optional built-in APIs (resources.FEATURE_GATES). StorageVersionMigrator
    # is off by default, as beta APIs are on a real v1.36 server; StorageVersionAPI is on (alpha, off
    # upstream, but kubesim has always published StorageVersions and our reference cluster had it on).
    feature_gates: set[str] = field(default_factory=lambda: {STORAGE_VERSION_API_GATE})
    # storage group-resource -> the verbs a built-in resource is served with instead of its own:
    # a stand-in for an API that serves no `patch` (some aggregated APIs), whose objects the
    # migrator re-writes with PUT (admin `verbs`)
    verbs: dict[str, list[str]] = field(default_factory=dict)
    # /metrics reports apiserver_encryption_config_controller_last_config_info (sim/kubesim/metrics.py);
    # False: served without it, as a server that predates the metric (admin `metrics`)
    encryption_config_metric: bool = True
