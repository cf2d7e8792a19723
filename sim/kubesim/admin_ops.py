"""What the admin API (`/_kubesim/`, `python -m kubesim admin`) does to one API server.

Outside the Kubernetes API: the stand-ins for an upgrade (a built-in resource's
storage version), encryption keys, feature gates, what /metrics reports, etcd
compaction, fault injection and counters. Mixed into `kubesim.server.ApiServer`,
which routes the HTTP requests here.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError

from kubesim import storageversions
from kubesim.errors import StatusError, bad_request
from kubesim.faults import FaultRule, Faults
from kubesim.registry import Registry, storage_group_resource
from kubesim.resources import ALL_VERBS, FEATURE_GATES
from kubesim.routing import VERSION_RE
from kubesim.svm_controller import SvmController


class AdminOperations:
    """The admin API's operations on the server they are mixed into."""

    registry: Registry
    faults: Faults
    svm_controller: SvmController | None

    def admin_state(self) -> dict[str, Any]:
        cfg = self.registry.config
        return {
            "serverID": cfg.server_id,
            "storageVersions": {
                storage_group_resource(rt): rt.storage_version for rt in self.registry.builtin_types() if not rt.virtual
            },
            "encryption": self._encryption_state(),
            "featureGates": {gate: gate in cfg.feature_gates for gate in FEATURE_GATES},
            "metrics": {"encryptionConfigInfo": cfg.encryption_config_metric},
            "etcdURL": self.registry.etcd.url,
            "etcdRevision": self.registry.etcd.revision(),
            **({"svmController": self.svm_controller.state()} if self.svm_controller is not None else {}),
        }

    def _encryption_state(self) -> dict[str, Any]:
        enc = self.registry.config.encryption
        file = enc.file
        if file is None:
            # configHash: what /metrics reports, the hash of server_config.admin_document.
            return {"resources": sorted(enc.resources), "keys": list(enc.keys), "configHash": enc.config_hash}
        summary = file.summary()
        keys = list(dict.fromkeys(k for rule in summary for k in rule["readKeys"]))
        return {
            # The admin-API shape, filled from the file: encrypted patterns, every key name.
            "resources": sorted(rule["resource"] for rule in summary if rule["writeKey"] is not None),
            "keys": keys,
            "configHash": file.hash,
            "providerConfig": {
                "path": str(enc.file_path),
                "hash": file.hash,
                "automaticReload": enc.reload_interval is not None,
                "reloadIntervalSeconds": enc.reload_interval,
                "lastReloadError": enc.reload_error,
                "resources": summary,
            },
        }

    def set_storage_version(self, body: dict[str, Any]) -> dict[str, Any]:
        resource = str(body.get("resource", ""))
        group = str(body.get("group", ""))
        version = str(body.get("version", ""))
        if not VERSION_RE.match(version):
            raise bad_request(f"version {version!r} is not a Kubernetes API version (v1, v2beta1, ...)")
        matches = [rt for rt in self.registry.builtin_types() if rt.resource == resource and rt.group == group]
        if not matches:
            crds = [rt for rt in self.registry.resource_types() if rt.resource == resource and rt.group == group]
            if crds:
                raise bad_request(
                    f"{resource}.{group} is a custom resource: change its storage version through its CRD "
                    "(spec.versions[].storage), as on a real cluster"
                )
            raise bad_request(f"no built-in resource {resource!r} in group {group!r}")
        if matches[0].virtual:
            raise bad_request(f"{matches[0].group_resource} is not stored: it has no storage version")
        with self.registry.lock:
            self.registry.config.storage_versions[storage_group_resource(matches[0])] = version
        storageversions.publish(self.registry, only={storageversions.object_name(matches[0])})
        return self.admin_state()

    def set_verbs(self, body: dict[str, Any]) -> dict[str, Any]:
        """Serve a built-in resource with these verbs only (discovery lists them; others answer
        405 as kube-apiserver does), or, with `verbs: null`, with its own again."""
        resource, group, verbs = str(body.get("resource", "")), str(body.get("group", "")), body.get("verbs")
        matches = [rt for rt in self.registry.builtin_types() if rt.resource == resource and rt.group == group]
        if not matches or matches[0].virtual:
            raise bad_request(f"no stored built-in resource {resource!r} in group {group!r}")
        if verbs is not None and (not isinstance(verbs, list) or not set(verbs) <= set(ALL_VERBS)):
            raise bad_request(f"verbs must be a list among {ALL_VERBS}, or null for the resource's own")
        key = storage_group_resource(matches[0])
        with self.registry.lock:
            if verbs is None:
                self.registry.config.verbs.pop(key, None)
            else:
                self.registry.config.verbs[key] = [v for v in ALL_VERBS if v in verbs]
        return {"resource": key, "verbs": next(rt.verbs for rt in self.registry.builtin_types()
                                                if storage_group_resource(rt) == key)}  # fmt: skip

    def set_encryption(self, body: dict[str, Any]) -> dict[str, Any]:
        path = self.registry.config.encryption.file_path
        if path is not None:
            raise bad_request(
                f"this server reads its encryption configuration from {path} (--encryption-provider-config): "
                "edit that file instead"
            )
        keys = body.get("keys")
        resources = body.get("resources")
        if not isinstance(keys, list) or not all(isinstance(k, str) and re.match(r"^[A-Za-z0-9_-]+$", k) for k in keys):
            raise bad_request("keys must be a list of key names (letters, digits, '-', '_'), write key first")
        with self.registry.lock:
            self.registry.config.encryption.keys = list(keys)
            if resources is not None:
                if not isinstance(resources, list):
                    raise bad_request("resources must be a list of group-resources, e.g. ['secrets']")
                self.registry.config.encryption.resources = {str(r) for r in resources}
        return self.admin_state()

    def set_feature_gates(self, body: dict[str, Any]) -> dict[str, Any]:
        """Turn optional built-in APIs on or off, e.g. {"StorageVersionMigrator": true}.

        Then republish: with `StorageVersionAPI` off this server's StorageVersion
        entries are withdrawn, with it on they are published (storageversions.publish).
        """
        unknown = sorted(set(body) - set(FEATURE_GATES))
        if unknown or not all(isinstance(v, bool) for v in body.values()):
            raise bad_request(f"expected {{gate: true|false}} for gates among {list(FEATURE_GATES)}; got {body!r}")
        with self.registry.lock:
            gates = self.registry.config.feature_gates
            for gate, on in body.items():
                (gates.add if on else gates.discard)(gate)
        storageversions.publish(self.registry)
        return self.admin_state()

    def set_metrics(self, body: dict[str, Any]) -> dict[str, Any]:
        """{"encryptionConfigInfo": false}: serve /metrics without
        apiserver_encryption_config_controller_last_config_info (sim/kubesim/metrics.py); true: with it."""
        unknown = sorted(set(body) - {"encryptionConfigInfo"})
        on = body.get("encryptionConfigInfo")
        if unknown or not isinstance(on, bool):
            raise bad_request(f'expected {{"encryptionConfigInfo": true|false}}; got {body!r}')
        with self.registry.lock:
            self.registry.config.encryption_config_metric = on
        return self.admin_state()

    def compact(self) -> dict[str, Any]:
        return {"revision": self.registry.etcd.compact()}

    def counters(self) -> dict[str, Any]:
        snap = self.faults.snapshot()
        snap["etcdWrites"] = self.registry.etcd.writes
        return snap

    def set_faults(self, body: Any) -> dict[str, Any]:
        raw = body.get("rules") if isinstance(body, dict) else body
        if not isinstance(raw, list):
            raise bad_request("expected {'rules': [...]}")
        try:
            rules = [FaultRule.model_validate(r) for r in raw]
        except ValidationError as exc:
            raise bad_request(f"invalid fault rule: {exc}") from exc
        self.faults.set_rules(rules)
        return {"rules": [r.model_dump() for r in self.faults.rules()]}

    def _controller(self) -> SvmController:
        if self.svm_controller is None:
            raise bad_request(
                "this API server runs no kube-controller-manager: the storage version migrator runs with a "
                "kubesim Cluster (python -m kubesim serve)"
            )
        return self.svm_controller

    def route(self, method: str, route: str, body: dict[str, Any]) -> dict[str, Any]:
        """The answer to `METHOD /_kubesim/<route>`; 404 for a route it does not have."""
        if route == "config" and method == "GET":
            return self.admin_state()
        if route == "storage-version" and method in ("PUT", "POST"):
            return self.set_storage_version(body)
        if route == "encryption" and method in ("PUT", "POST"):
            return self.set_encryption(body)
        if route == "verbs" and method in ("PUT", "POST"):
            return self.set_verbs(body)
        if route == "feature-gates" and method in ("PUT", "POST"):
            return self.set_feature_gates(body)
        if route == "metrics" and method in ("PUT", "POST"):
            return self.set_metrics(body)
        if route == "svm-controller" and method == "GET":
            return self._controller().state()
        if route == "svm-controller" and method in ("PUT", "POST"):
            return self._controller().configure(body)
        if route == "svm-controller/restart" and method == "POST":
            return self._controller().restart()
        if route == "compact" and method == "POST":
            return self.compact()
        if route == "faults" and method in ("PUT", "POST"):
            return self.set_faults(body)
        if route == "faults" and method == "GET":
            return {"rules": [r.model_dump() for r in self.faults.rules()]}
        if route == "faults" and method == "DELETE":
            return self.set_faults({"rules": []})
        if route == "counters" and method == "GET":
            return self.counters()
        if route == "timeline" and method == "GET":
            return {"tenths": self.faults.timeline()}
        if route == "counters" and method == "DELETE":
            self.faults.reset()
            self.registry.etcd.writes = 0
            return self.counters()
        raise StatusError(404, "NotFound", f"no admin route {method} /_kubesim/{route}", details={})
