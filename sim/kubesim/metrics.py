"""`GET /metrics` of one simulated API server: the Prometheus text exposition.

Design decision: a client (the migrator, issue 19) tells which encryption
configuration each API server applied from kube-apiserver's gauge
`apiserver_encryption_config_controller_last_config_info`, one sample per
server, `{apiserver_id_hash="sha256:<hex of sha256(identity lease name)>",
hash="sha256:<hex of sha256(EncryptionConfiguration file bytes)>"} 1`
(../shared/reference/apiserver-metrics-encryption-config.txt, recorded from a
real v1.36.2; the HELP text and the label order are copied from it). kubesim
serves that family and `process_start_time_seconds` (component-base's, worded
from its source, not recorded), nothing else of the real server's hundreds: a
parser (prometheus_client's `text_string_to_metric_families`) reads it as it
reads the real one.

- `hash`: from a file, the hash of the bytes last applied (a reload of a valid
  new file changes it, an invalid one keeps the old, as the real controller);
  from kubesim's admin API, the hash of a canonical file rendered from the
  admin settings (`server_config.admin_document`).
- `ServerConfig.encryption_config_metric = False` (admin `metrics`) serves
  /metrics without the family (a server that predates it, or whose encryption
  config controller does not run): a GaugeVec with no sample prints nothing,
  not even its HELP and TYPE lines.
- Authorization: `/metrics` is a non-resource URL that no default role grants
  (kube-apiserver's `system:discovery` and `system:public-info-viewer` don't
  list it): RBAC (sim/kubesim/access.py) denies it to users without a rule for it;
  during the authorization warm-up (sim/kubesim/health.py) only `system:masters`
  gets it.
"""

from __future__ import annotations

import hashlib
from typing import Final

from kubesim.authn import UserInfo
from kubesim.errors import StatusError
from kubesim.health import WARMUP_USER
from kubesim.rbac_authorizer import Attributes, forbidden
from kubesim.server_config import ServerConfig

__all__ = ["CONTENT_TYPE", "ENCRYPTION_CONFIG_INFO", "PATH", "exposition", "id_hash", "render", "warmup_forbidden"]

PATH: Final = "/metrics"
#: What promhttp answers in the text format (kube-apiserver does not offer OpenMetrics).
CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
ENCRYPTION_CONFIG_INFO: Final = "apiserver_encryption_config_controller_last_config_info"
_ENCRYPTION_CONFIG_HELP: Final = (
    "[ALPHA] Information about the last applied encryption configuration with hash as label, "
    "split by apiserver identity."
)
_START_TIME: Final = "process_start_time_seconds"
_START_TIME_HELP: Final = "[ALPHA] Start time of the process since unix epoch in seconds."


def id_hash(server_id: str) -> str:
    """The `apiserver_id_hash` label: "sha256:" + hex(sha256(the server's identity lease name))."""
    return "sha256:" + hashlib.sha256(server_id.encode()).hexdigest()


def _label(value: str) -> str:
    """A label value escaped as the text format wants it."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render(*, server_id: str, config_hash: str | None, started_at: float) -> bytes:
    """The exposition; `config_hash` None: without the encryption configuration family."""
    lines = []
    if config_hash is not None:
        lines += [
            f"# HELP {ENCRYPTION_CONFIG_INFO} {_ENCRYPTION_CONFIG_HELP}",
            f"# TYPE {ENCRYPTION_CONFIG_INFO} gauge",
            f'{ENCRYPTION_CONFIG_INFO}{{apiserver_id_hash="{_label(id_hash(server_id))}",'
            f'hash="{_label(config_hash)}"}} 1',
        ]
    lines += [
        f"# HELP {_START_TIME} {_START_TIME_HELP}",
        f"# TYPE {_START_TIME} gauge",
        f"{_START_TIME} {started_at!r}",
    ]
    return ("\n".join(lines) + "\n").encode()


def exposition(config: ServerConfig, *, started_at: float) -> bytes:
    """What this server's /metrics answers now."""
    config_hash = config.encryption.config_hash if config.encryption_config_metric else None
    return render(server_id=config.server_id, config_hash=config_hash, started_at=started_at)


def warmup_forbidden(user: str | None) -> StatusError:
    """The 403 of /metrics while authorization warms up (`user`: None when authentication is off)."""
    return forbidden(Attributes(user=UserInfo(name=user or WARMUP_USER), verb="get", path=PATH, resource_request=False))
