"""What the image's containers meet where a cluster's node would be (issue 38), for
tests/e2e/test_image.py.

- `JobsAPI`: an HTTPS address that answers prefect-kubernetes' worker, and its observer, as the
  API server of its namespace does: discovery of pods and Jobs, empty lists, watches that stay
  open, and Jobs created (201, each one kept). kubesim serves no batch/v1 Jobs, and what matters
  here is the Job the worker sends. It asks for the bearer token it gave the worker's
  ServiceAccount, as an API server would.
- `PodRun`: a pod's container as a kubelet would start it, made into `podman run` options:
  its command and args (`$(VAR)` expanded from its environment), its environment (`valueFrom`
  Secrets and `envFrom` ConfigMaps resolved from what the test gives), its security context (the
  user and group, a read-only root, no capabilities, no privilege escalation), its volumes
  (`emptyDir` a fresh writable tmpfs, `configMap` a directory mounted read-only), its resource
  limits, and the ServiceAccount's credentials where the test gives them. Whatever in the pod it
  does not know fails the test, so that a new field in deployments/ is taught here, not skipped.

Containers share the host's network (no container network here: scripts/image.sh): a pod's own
ports are the host's, so a test that runs a pod that listens moves its port with an `env` override.
"""

from __future__ import annotations

import json
import os
import re
import ssl
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from cryptography.hazmat.primitives import serialization

from kubesim.tls import Authority

#: Where a kubelet mounts a pod's ServiceAccount credentials (token, ca.crt, namespace).
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
#: The uid and gid files given to a pod are owned by (its runAsUser, as fsGroup makes them readable).
POD_USER = 10001

_DISCOVERY = {
    "/api": {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []},
    "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": [{
        "name": "batch", "versions": [{"groupVersion": "batch/v1", "version": "v1"}],
        "preferredVersion": {"groupVersion": "batch/v1", "version": "v1"}}]},
    "/api/v1": {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
        {"name": "pods", "singularName": "pod", "namespaced": True, "kind": "Pod",
         "verbs": ["get", "list", "watch"]}]},
    "/apis/batch/v1": {"kind": "APIResourceList", "groupVersion": "batch/v1", "resources": [
        {"name": "jobs", "singularName": "job", "namespaced": True, "kind": "Job",
         "verbs": ["create", "get", "list", "watch", "delete"]}]},
}  # fmt: skip
_JOBS = re.compile(r"^/apis/batch/v1/namespaces/([^/]+)/jobs$")
_LISTS = re.compile(r"^/(api/v1|apis/batch/v1)(/namespaces/[^/]+)?/(pods|jobs)$")


class JobsAPI:
    """The stand-in API server (see the module); `jobs` holds each Job created, as sent."""

    def __init__(self, directory: Path) -> None:
        self.token = uuid.uuid4().hex
        self.authority = Authority.generate("node-stand-in-ca")
        self.jobs: list[dict[str, Any]] = []
        self.unanswered: list[str] = []
        self._created = threading.Condition()
        self._stop = threading.Event()
        cert, key = directory / "apiserver.crt", directory / "apiserver.key"
        cert.write_bytes(self.authority.serving_cert.public_bytes(serialization.Encoding.PEM))
        key.write_bytes(self.authority.serving_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))  # fmt: skip
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="jobs-api", daemon=True)

    def __enter__(self) -> JobsAPI:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def service_account(self, directory: Path, namespace: str) -> Path:
        """The files a kubelet mounts at SERVICE_ACCOUNT_DIR for a pod of `namespace`."""
        directory.mkdir(parents=True, exist_ok=True)
        for name, data in (("token", self.token.encode()), ("ca.crt", self.authority.ca_pem),
                           ("namespace", namespace.encode())):  # fmt: skip
            (directory / name).write_bytes(data)
            _give_pod(directory / name)
        _give_pod(directory)
        return directory

    def wait_for_job(self, timeout: float) -> dict[str, Any] | None:
        with self._created:
            self._created.wait_for(lambda: bool(self.jobs), timeout=timeout)
            return self.jobs[0] if self.jobs else None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # one request per connection; a watch's body ends when it closes

            def _send(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _authorized(self) -> bool:
                scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
                if scheme.lower() == "bearer" and token.strip() == api.token:  # the scheme is case-insensitive
                    return True
                api.unanswered.append(f"{self.command} {self.path} (unauthorized)")
                self._send(401, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                 "reason": "Unauthorized", "code": 401})  # fmt: skip
                return False

            def do_GET(self) -> None:
                if not self._authorized():
                    return
                path, _, query = self.path.partition("?")
                watch = parse_qs(query).get("watch", ["false"])[0].lower() in ("true", "1")
                if path in _DISCOVERY:
                    self._send(200, _DISCOVERY[path])
                elif (found := _LISTS.match(path)) and watch:
                    # A watch: nothing happens in this namespace; the stream stays open until the end.
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.flush()
                    api._stop.wait()
                elif found:
                    kind = "PodList" if found.group(3) == "pods" else "JobList"
                    version = "v1" if found.group(1) == "api/v1" else "batch/v1"
                    self._send(200, {"kind": kind, "apiVersion": version, "metadata": {"resourceVersion": "1"},
                                     "items": []})  # fmt: skip
                else:
                    api.unanswered.append(f"GET {self.path}")
                    self._send(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                     "reason": "NotFound", "code": 404})  # fmt: skip

            def do_POST(self) -> None:
                if not self._authorized():
                    return
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
                if not (found := _JOBS.match(self.path.partition("?")[0])):
                    api.unanswered.append(f"POST {self.path}")
                    self._send(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404})
                    return
                job = json.loads(json.dumps(body))
                job["metadata"].update(name=f"{job['metadata'].get('generateName', 'job-')}image",
                                       namespace=found.group(1), uid=str(uuid.uuid4()))  # fmt: skip
                with api._created:
                    api.jobs.append(body)
                    api._created.notify_all()
                self._send(201, job)

            def log_message(self, *args: Any) -> None:
                pass

        return Handler


def _give_pod(path: Path) -> None:
    """Owned by the pod's user, as a kubelet makes a pod's volumes readable to it (fsGroup)."""
    os.chown(path, POD_USER, POD_USER)
    path.chmod(0o700 if path.is_dir() else 0o400)


@dataclass
class PodRun:
    """One container of a pod spec, as `podman run` options (see the module).

    `secrets`: (name, key) -> value, for `secretKeyRef`; `config_maps`: name -> data, for `envFrom`
    and `configMap` volumes; `service_account`: a directory of JobsAPI.service_account and the API's
    address, mounted and set as a kubelet does (none: the pod gets no credentials from the node);
    `env`: values the node sets over the container's own (a port, as above); `mounts`: host files
    mounted read-only at a path, for what a real node would project (the test's kubeconfig).
    """

    pod: dict[str, Any]
    workdir: Path
    secrets: dict[tuple[str, str], str] = field(default_factory=dict)
    config_maps: dict[str, dict[str, str]] = field(default_factory=dict)
    service_account: tuple[Path, str, int] | None = None
    env: dict[str, str] = field(default_factory=dict)
    mounts: dict[str, Path] = field(default_factory=dict)

    #: Pod and container fields that change nothing a container on one node does (scheduling,
    #: what the API server keeps, probes the test makes itself). `completions` and `parallelism`
    #: are Job fields that prefect-kubernetes' template puts in the pod spec, which an API server
    #: drops (they are no PodSpec fields).
    IGNORED_POD = frozenset({"restartPolicy", "serviceAccountName", "completions", "parallelism"})
    IGNORED_CONTAINER = frozenset({"name", "imagePullPolicy", "ports", "livenessProbe", "readinessProbe"})

    def options(self) -> tuple[list[str], str, list[str]]:
        """(`podman run` options, the image, the arguments after it)."""
        pod = self.pod
        unknown = set(pod) - self.IGNORED_POD - {"containers", "securityContext", "volumes"}
        assert not unknown, f"the node stand-in does not know these pod fields: {sorted(unknown)}"
        (container,) = pod["containers"]
        unknown = set(container) - self.IGNORED_CONTAINER - {
            "image", "command", "args", "env", "envFrom", "securityContext", "volumeMounts", "resources",
            "workingDir"}  # fmt: skip
        assert not unknown, f"the node stand-in does not know these container fields: {sorted(unknown)}"
        env = self._environment(container)
        options = self._security(pod.get("securityContext", {}), container.get("securityContext", {}))
        options += self._volumes(pod.get("volumes", []), container.get("volumeMounts", []))
        options += self._limits(container.get("resources", {}))
        if "workingDir" in container:
            options += ["--workdir", container["workingDir"]]
        if self.service_account is not None:
            directory, host, port = self.service_account
            options += ["--volume", f"{directory}:{SERVICE_ACCOUNT_DIR}:ro"]
            env.update(KUBERNETES_SERVICE_HOST=host, KUBERNETES_SERVICE_PORT=str(port))
        for path, source in self.mounts.items():
            options += ["--volume", f"{source}:{path}:ro"]
        options += ["--env-file", str(self._env_file(env))]
        command = [_expand(a, env) for a in container.get("command", [])]
        args = [_expand(a, env) for a in container.get("args", [])]
        if command:
            options += ["--entrypoint", json.dumps(command)]
        return options, container["image"], args

    def _environment(self, container: dict[str, Any]) -> dict[str, str]:
        env: dict[str, str] = {}
        for source in container.get("envFrom", []):
            ref = source.get("configMapRef") or {}
            assert ref and set(source) == {"configMapRef"}, f"the node stand-in does not know {source}"
            if ref["name"] in self.config_maps:
                env.update(self.config_maps[ref["name"]])
            else:
                assert ref.get("optional"), f"ConfigMap {ref['name']} is not given and not optional"
        for entry in container.get("env", []):
            if "value" in entry:
                env[entry["name"]] = entry["value"]
                continue
            source = entry.get("valueFrom", {})
            if "configMapKeyRef" in source:
                ref = source["configMapKeyRef"]
                value = self.config_maps.get(ref["name"], {}).get(ref["key"])
                what = f"ConfigMap {ref['name']} key {ref['key']}"
            else:
                ref = source.get("secretKeyRef")
                assert ref, f"the node stand-in does not know {entry}"
                value = self.secrets.get((ref["name"], ref["key"]))
                what = f"Secret {ref['name']}/{ref['key']}"
            if value is not None:
                env[entry["name"]] = value
            else:
                assert ref.get("optional"), f"{what} is not given and not optional"
        env.update(self.env)
        return env

    def _env_file(self, env: dict[str, str]) -> Path:
        # A file, not `-e`: values stay off command lines (an auth string is among them).
        path = self.workdir / "env"
        assert all("\n" not in v for v in env.values())
        path.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
        path.chmod(0o600)
        return path

    def _security(self, pod: dict[str, Any], container: dict[str, Any]) -> list[str]:
        known_pod = {"runAsNonRoot", "runAsUser", "runAsGroup", "fsGroup", "seccompProfile"}
        known_container = {"allowPrivilegeEscalation", "readOnlyRootFilesystem", "capabilities",
                           "runAsNonRoot", "runAsUser", "runAsGroup"}  # fmt: skip
        assert set(pod) <= known_pod, f"the node stand-in does not know {sorted(set(pod) - known_pod)}"
        assert set(container) <= known_container, (
            f"the node stand-in does not know {sorted(set(container) - known_container)}"
        )
        merged = {**pod, **container}
        options: list[str] = []
        user = merged.get("runAsUser")
        if user is not None:
            options += ["--user", f"{user}:{merged.get('runAsGroup', user)}"]
        if merged.get("runAsNonRoot"):
            # The kubelet refuses a root user; the image's own (numeric) user is checked by the test.
            assert user is None or user != 0, "runAsNonRoot with runAsUser 0"
        if "fsGroup" in pod:
            options += ["--group-add", str(pod["fsGroup"])]
        profile = pod.get("seccompProfile", {}).get("type", "RuntimeDefault")
        assert profile == "RuntimeDefault", (
            f"seccomp {profile}: podman's default profile stands for RuntimeDefault only"
        )
        if container.get("allowPrivilegeEscalation") is False:
            options += ["--security-opt", "no-new-privileges"]
        if container.get("readOnlyRootFilesystem"):
            # Only what the pod mounts is writable: podman's own tmpfs on /tmp, /var/tmp and /run is left out.
            options += ["--read-only", "--read-only-tmpfs=false"]
        capabilities = container.get("capabilities", {})
        options += [f"--cap-drop={c.lower()}" for c in capabilities.get("drop", [])]
        options += [f"--cap-add={c.lower()}" for c in capabilities.get("add", [])]
        return options

    def _volumes(self, volumes: list[dict[str, Any]], mounts: list[dict[str, Any]]) -> list[str]:
        by_name = {v["name"]: v for v in volumes}
        options: list[str] = []
        for mount in mounts:
            volume = by_name[mount["name"]]
            if "emptyDir" in volume:
                # A fresh, empty, writable directory for the pod's life.
                options += ["--tmpfs", f"{mount['mountPath']}:rw,mode=1777,notmpcopyup"]
            elif "configMap" in volume:
                directory = self.workdir / f"configmap-{volume['name']}"
                directory.mkdir(exist_ok=True)
                for key, value in self.config_maps[volume["configMap"]["name"]].items():
                    (directory / key).write_text(value)
                    _give_pod(directory / key)
                _give_pod(directory)
                options += ["--volume", f"{directory}:{mount['mountPath']}:ro"]
            else:
                raise AssertionError(f"the node stand-in does not know the volume {volume}")
        return options

    @staticmethod
    def _limits(resources: dict[str, Any]) -> list[str]:
        limits = resources.get("limits", {})
        options = []
        if "memory" in limits:
            options += ["--memory", _bytes(limits["memory"])]
        if "cpu" in limits:
            cpu = str(limits["cpu"])
            options += ["--cpus", str(int(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu))]
        return options


def _expand(arg: str, env: dict[str, str]) -> str:
    """A kubelet's `$(VAR)` in command and args: the container's variable, or left as written."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), arg)


def _bytes(quantity: str) -> str:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "K": 10**3, "M": 10**6, "G": 10**9}
    for unit, factor in units.items():
        if quantity.endswith(unit):
            return str(int(float(quantity[: -len(unit)]) * factor))
    return str(int(quantity))
