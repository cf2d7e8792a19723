"""kube-apiserver's `--encryption-provider-config` file, read as it reads it.

Format (apiserver.config.k8s.io/v1, `EncryptionConfiguration`), the subset
kubesim honours: `aescbc` and `identity` providers. Validation follows
k8s.io/apiserver's validation_encryption.go (its messages, field paths such as
`resources[0].providers[1].aescbc.keys[0].secret`), plus one rule of kubesim's
own: key names are unique within one `resources[]` entry (the real validation
does not check it; the second key of a name can never be reached, since reading
picks the first whose `k8s:enc:aescbc:v1:<name>:` prefix matches).

Semantics, as encryptionconfig/config.go builds its prefix transformers:
- a group-resource is matched by its exact name, then `*.<group>` (`*.` is the
  core group), then `*.*`; a resource named after a wildcard that already
  covers it is refused ("masked by earlier rule"), as the real server refuses it;
- the FIRST provider writes: `aescbc` with its first key, `identity` in plaintext;
- reading tries the providers: an `aescbc` value needs a key of its name in an
  aescbc provider of the resource, a plaintext value needs `identity` among the
  providers (else "no matching prefix found", a 500);
- a resource the file does not list is written in plaintext and cannot read an
  encrypted value (kube-apiserver's default identity "encrypt check" transformer).

Automatic reload (`--encryption-provider-config-automatic-reload`): the file is
polled; a change of its content (sha256) is re-read; an invalid new file keeps
the previous configuration and the error is logged and kept for the admin state,
as kube-apiserver's DynamicEncryptionConfigContent controller does.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

log = logging.getLogger(__name__)

API_VERSION = "apiserver.config.k8s.io/v1"
KIND = "EncryptionConfiguration"
AES_KEY_SIZES = (16, 24, 32)  # validation_encryption.go: aesKeySizes
_KNOWN_PROVIDERS = ("aescbc", "aesgcm", "secretbox", "kms", "identity")
_SUPPORTED_PROVIDERS = ("aescbc", "identity")
_NON_REST_RESOURCES = ("apiserveripinfo", "serviceipallocations", "servicenodeportallocations")


class ConfigError(ValueError):
    """The file cannot be used; the message names the field and what to do."""


@dataclass(frozen=True)
class AesKey:
    name: str
    secret: bytes


@dataclass(frozen=True)
class Provider:
    kind: str  # "aescbc" or "identity"
    keys: tuple[AesKey, ...] = ()


@dataclass(frozen=True)
class Transformer:
    """How one group-resource's values are written and read."""

    write_key: str | None  # None: plaintext
    write_secret: bytes | None
    read_keys: Mapping[str, bytes]  # key name -> AES secret
    plaintext_readable: bool
    providers: tuple[str, ...] = ()


@dataclass(frozen=True)
class EncryptionConfiguration:
    """A parsed, valid file: group-resource patterns to their providers, in file order."""

    rules: tuple[tuple[str, tuple[Provider, ...]], ...]
    hash: str

    def providers(self, group_resource: str) -> tuple[Provider, ...] | None:
        resource, _, group = group_resource.partition(".")
        table = dict(self.rules)
        for pattern in (f"{resource}.{group}" if group else resource, f"*.{group}", "*.*"):
            if pattern in table:
                return table[pattern]
        return None

    def transformer(self, group_resource: str) -> Transformer:
        providers = self.providers(group_resource)
        if providers is None:  # not listed: plaintext, and encrypted values are unreadable
            return Transformer(write_key=None, write_secret=None, read_keys={}, plaintext_readable=True)
        read: dict[str, bytes] = {}
        for provider in providers:
            for key in provider.keys:
                read.setdefault(key.name, key.secret)
        first = providers[0]
        return Transformer(
            write_key=first.keys[0].name if first.kind == "aescbc" else None,
            write_secret=first.keys[0].secret if first.kind == "aescbc" else None,
            read_keys=read,
            plaintext_readable=any(p.kind == "identity" for p in providers),
            providers=tuple(p.kind for p in providers),
        )

    def summary(self) -> list[dict[str, Any]]:
        """What the admin state shows: per pattern, the write key and the read keys (no secrets)."""
        out = []
        for pattern, providers in self.rules:
            first = providers[0]
            out.append(
                {
                    "resource": pattern,
                    "providers": [p.kind for p in providers],
                    "writeKey": first.keys[0].name if first.kind == "aescbc" else None,
                    "readKeys": [k.name for p in providers for k in p.keys],
                    "plaintextReadable": any(p.kind == "identity" for p in providers),
                }
            )
        return out


def config_hash(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _require_list(value: Any, path: str, what: str) -> list[Any]:
    if value is None or value == []:
        raise ConfigError(f"{path}: Required value: at least one {what} is required")
    if not isinstance(value, list):
        raise ConfigError(f"{path}: Invalid value: must be a list of {what}")
    return value


def _group_resource(res: Any, path: str) -> tuple[str, str]:
    if not isinstance(res, str) or not res:
        raise ConfigError(f"{path}: Invalid value: {res!r}: a resource name such as 'secrets' or 'deployments.apps'")
    if res.lower() != res:
        raise ConfigError(f"{path}: Invalid value: {res!r}: resource name should not contain capital letters")
    if res == "*":
        raise ConfigError(
            f"{path}: Invalid value: '*': use '*.' to encrypt all the resources from core API group "
            "or *.* to encrypt all resources"
        )
    if res in _NON_REST_RESOURCES:
        raise ConfigError(f"{path}: Invalid value: {res!r}: resources which do not have REST API/s cannot be encrypted")
    resource, _, group = res.partition(".")
    if group == "events.k8s.io":
        raise ConfigError(
            f"{path}: Invalid value: {res!r}: '*.events.k8s.io' objects are stored using the 'events' API group "
            "in etcd. Use 'events' instead in the config file"
        )
    if group == "extensions":
        raise ConfigError(
            f"{path}: Invalid value: {res!r}: 'extensions' group has been removed and cannot be used for encryption"
        )
    if group == "*" and resource != "*":
        raise ConfigError(
            f"{path}: Invalid value: {res!r}: encrypting the same resource across groups is not supported"
        )
    return resource, group


def _keys(value: Any, path: str) -> tuple[AesKey, ...]:
    keys = _require_list(value, path, "keys")
    out: list[AesKey] = []
    for i, key in enumerate(keys):
        kp = f"{path}[{i}]"
        if not isinstance(key, dict):
            raise ConfigError(f"{kp}: Invalid value: expected {{name: ..., secret: <base64>}}")
        name, secret = key.get("name"), key.get("secret")
        if not name or not isinstance(name, str):
            raise ConfigError(f"{kp}.name: Required value: name is a mandatory field for a key")
        if ":" in name:
            raise ConfigError(f"{kp}.name: Invalid value: {name!r}: a key name must not contain ':'")
        if not secret or not isinstance(secret, str):
            raise ConfigError(f"{kp}.secret: Required value: secret is a mandatory field for a key")
        try:
            raw = base64.b64decode(secret, validate=True)
        except (binascii.Error, ValueError):
            raise ConfigError(
                f'{kp}.secret: Invalid value: "REDACTED": secrets must be base64 encoded '
                "(e.g. the output of `head -c 32 /dev/urandom | base64`)"
            ) from None
        if len(raw) not in AES_KEY_SIZES:
            raise ConfigError(
                f'{kp}.secret: Invalid value: "REDACTED": secret is not of the expected length, got {len(raw)}, '
                f"expected one of {list(AES_KEY_SIZES)} (bytes after base64 decoding; "
                "`head -c 32 /dev/urandom | base64` makes one)"
            )
        out.append(AesKey(name=name, secret=raw))
    return tuple(out)


def _provider(value: Any, path: str) -> Provider:
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: Invalid value: expected one of {{aescbc: ...}}, {{identity: {{}}}}")
    found = [k for k in value if k in _KNOWN_PROVIDERS]
    unknown = [k for k in value if k not in _KNOWN_PROVIDERS]
    if unknown:
        raise ConfigError(
            f"{path}: Invalid value: unknown field(s) {unknown}: a provider is one of "
            f"{', '.join(_KNOWN_PROVIDERS)} (kubesim supports {' and '.join(_SUPPORTED_PROVIDERS)})"
        )
    if not found:
        raise ConfigError(
            f"{path}: Invalid value: provider does not contain any of the expected providers: "
            "KMS, AESGCM, AESCBC, Secretbox, Identity"
        )
    if len(found) > 1:
        raise ConfigError(
            f"{path}: Invalid value: more than one provider specified in a single element, "
            "should split into different list elements"
        )
    kind = found[0]
    if kind not in _SUPPORTED_PROVIDERS:
        raise ConfigError(
            f"{path}.{kind}: Unsupported value: kubesim implements only the aescbc and identity providers; "
            f"use aescbc instead of {kind}"
        )
    if kind == "identity":
        return Provider(kind="identity")
    body = value[kind]
    if not isinstance(body, dict):
        raise ConfigError(f"{path}.aescbc: Invalid value: expected {{keys: [{{name: ..., secret: ...}}]}}")
    return Provider(kind="aescbc", keys=_keys(body.get("keys"), f"{path}.aescbc.keys"))


def parse(data: bytes | str) -> EncryptionConfiguration:
    """Parse and validate one file's content; ConfigError names the first problem."""
    raw = data.encode() if isinstance(data, str) else data
    if not raw.strip():
        raise ConfigError("the encryption provider configuration file is empty")
    try:
        doc = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise ConfigError(f"error decoding encryption provider configuration: not YAML/JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise ConfigError("error decoding encryption provider configuration: expected a mapping with apiVersion/kind")
    if doc.get("kind") != KIND:
        raise ConfigError(f"kind: Invalid value: {doc.get('kind')!r}: expected kind: {KIND}")
    if doc.get("apiVersion") != API_VERSION:
        raise ConfigError(f"apiVersion: Invalid value: {doc.get('apiVersion')!r}: expected apiVersion: {API_VERSION}")
    entries = _require_list(doc.get("resources"), "resources", "resources")
    rules: dict[str, tuple[Provider, ...]] = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ConfigError(f"resources[{i}]: Invalid value: expected {{resources: [...], providers: [...]}}")
        rpath, ppath = f"resources[{i}].resources", f"resources[{i}].providers"
        names = _require_list(entry.get("resources"), rpath, rpath)
        parsed = [_group_resource(res, f"{rpath}[{j}]") for j, res in enumerate(names)]
        if len(set(parsed)) != len(parsed):
            raise ConfigError(f"{rpath}: Invalid value: {names}: the same resource cannot be specified multiple times")
        if len(parsed) > 1 and any(
            r == ("*", "*") or (r[0] == "*" and any(o != r and o[1] == r[1] for o in parsed)) for r in parsed
        ):
            raise ConfigError(
                f"{rpath}: Invalid value: {names}: using overlapping resources such as 'secrets' and '*.' "
                "in the same resource list is not allowed as they will be masked"
            )
        providers = tuple(
            _provider(p, f"{ppath}[{j}]") for j, p in enumerate(_require_list(entry.get("providers"), ppath, ppath))
        )
        seen: set[str] = set()
        for j, provider in enumerate(providers):
            for k, key in enumerate(provider.keys):
                if key.name in seen:
                    raise ConfigError(
                        f"{ppath}[{j}].aescbc.keys[{k}].name: Duplicate value: {key.name!r}: key names must be "
                        f"unique within resources[{i}] (rename one; values name their key in their prefix)"
                    )
                seen.add(key.name)
        for (_, group), name in zip(parsed, names, strict=True):
            for wildcard in (f"*.{group}", "*.*"):
                if wildcard in rules and wildcard != name:
                    raise ConfigError(f"{rpath}: resource {name!r} is masked by earlier rule {wildcard!r}")
            # kube-apiserver appends a resource's providers when it is listed again; the first entry writes.
            rules[name] = rules.get(name, ()) + providers
    return EncryptionConfiguration(rules=tuple(rules.items()), hash=config_hash(raw))


def load(path: Path | str) -> EncryptionConfiguration:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"error reading encryption provider configuration file {str(path)!r}: {exc}") from exc
    try:
        return parse(data)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


@dataclass
class Reloader:
    """Polls the file; applies a changed, valid configuration; keeps the old one on error."""

    path: Path
    interval: float
    current_hash: str
    apply: Callable[[EncryptionConfiguration], None]
    report_error: Callable[[str | None], None]
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _last_error: str | None = None

    def start(self) -> Reloader:
        self._thread = threading.Thread(
            target=self._run, name=f"kubesim-encryption-reload-{self.path.name}", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def check(self) -> None:
        """One poll: re-read when the content's hash changed."""
        try:
            data = self.path.read_bytes()
        except OSError as exc:
            self._fail(f"error reading encryption provider configuration file {str(self.path)!r}: {exc}", None)
            return
        digest = config_hash(data)
        if digest == self.current_hash:
            return
        try:
            config = parse(data)
        except ConfigError as exc:
            self._fail(f"{self.path}: {exc}", digest)
            return
        self.current_hash = digest
        self.apply(config)
        self._last_error = None
        self.report_error(None)
        log.info("encryption provider configuration %s reloaded (%s)", self.path, digest)

    def _fail(self, message: str, digest: str | None) -> None:
        if message != self._last_error:  # a missing file fails every poll: log it once
            log.error("failed to reload encryption provider configuration, keeping the previous one: %s", message)
        self._last_error = message
        self.report_error(message)
        if digest is not None:
            # Try again only when the content changes again (the real controller re-queues with backoff).
            self.current_hash = digest

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.check()
            except Exception:  # the poller must outlive a bug in one poll
                log.exception("encryption provider configuration reload failed")
