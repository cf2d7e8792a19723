"""Reading what an API server says about its encryption configuration on ``/metrics``.

Design decision (issue 19): kube-apiserver v1.36 reports the configuration it
applied as the gauge
``apiserver_encryption_config_controller_last_config_info{apiserver_id_hash, hash} 1``
(reference/apiserver-metrics-encryption-config.txt): the hash of the
EncryptionConfiguration file, never a key. We read only that family; the rest
of the (large) exposition is parsed by prometheus_client and dropped. Reading
needs ``get`` on the non-resource URL ``/metrics``.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Final

from kubernetes.client import ApiClient
from prometheus_client.parser import text_string_to_metric_families

from storage_migrator.agreement.server_configs import CONFIG_METRIC, ConfigSample
from storage_migrator.kube.transport import DEFAULT_TIMEOUT_SECONDS, request

__all__ = ["ACCEPT_TEXT", "METRICS_PATH", "parse_config_samples", "read_config_samples"]

METRICS_PATH: Final = "/metrics"
ACCEPT_TEXT: Final = "text/plain;version=0.0.4"


def parse_config_samples(text: str, *, via: str, heard_at: datetime) -> list[ConfigSample]:
    """The samples of ``CONFIG_METRIC`` whose value is 1 (the configuration in force); one sample with
    ``id_hash=None`` when there is none, so that "this server has no such metric" is itself an answer."""
    out = []
    for family in text_string_to_metric_families(text):
        if family.name != CONFIG_METRIC:
            continue
        for sample in family.samples:
            if sample.value != 1:
                continue
            out.append(ConfigSample(id_hash=sample.labels.get("apiserver_id_hash") or None,
                                    config_hash=sample.labels.get("hash") or None, via=via, heard_at=heard_at))  # fmt: skip
    return out or [ConfigSample(id_hash=None, config_hash=None, via=via, heard_at=heard_at)]


def read_config_samples(
    api_client: ApiClient, *, via: str, timeout: float = DEFAULT_TIMEOUT_SECONDS
) -> list[ConfigSample]:
    """One ``GET /metrics`` through ``api_client`` (a ``KubeError`` on failure, e.g. 403 naming ``/metrics``)."""
    answer = request(api_client, method="GET", path=METRICS_PATH, what=f"{METRICS_PATH} of {via}",
                     accept=ACCEPT_TEXT, timeout=timeout)  # fmt: skip
    return parse_config_samples(answer.data.decode("utf-8", "replace"), via=via, heard_at=datetime.now(UTC))
