"""Client construction from settings and kubeconfig dicts (no network)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from storage_migrator.kube.connection import (
    ConnectionConfigError,
    api_client_from_config_dict,
    api_client_from_settings,
)
from storage_migrator.settings import Settings

KUBECONFIG: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Config",
    "clusters": [
        {"name": "a", "cluster": {"server": "https://a.example:6443"}},
        {"name": "b", "cluster": {"server": "http://127.0.0.1:8080"}},
    ],
    "users": [{"name": "u", "user": {"token": "tok-123"}}],
    "contexts": [
        {"name": "ctx-a", "context": {"cluster": "a", "user": "u"}},
        {"name": "ctx-b", "context": {"cluster": "b", "user": "u"}},
    ],
    "current-context": "ctx-a",
}


def test_config_dict_with_context() -> None:
    client = api_client_from_config_dict(KUBECONFIG, context="ctx-b")
    assert client.configuration.host == "http://127.0.0.1:8080"
    config = client.configuration
    assert config.get_api_key_with_prefix("BearerToken", alias="authorization") == "Bearer tok-123"


def test_kubeconfig_file_and_pool_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(KUBECONFIG))
    client = api_client_from_settings(Settings(kubeconfig=path, write_concurrency=32))
    assert client.configuration.host == "https://a.example:6443"
    assert client.configuration.connection_pool_maxsize >= 32


def test_in_cluster_is_chosen_automatically_in_a_pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In a pod without service-account files the in-cluster loader is what fails."""
    from kubernetes.config.config_exception import ConfigException

    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    with pytest.raises(ConnectionConfigError, match="service account") as info:
        api_client_from_settings(Settings())
    assert isinstance(info.value.__cause__, ConfigException)
    assert "Service token file does not exist" in str(info.value)


def test_refresh_before_each_request_keeps_host_proxy_and_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 22: the loader's refresh hook sets the same host before every request; skipping that
    no-op must leave the environment's proxy, the host and the token as the official client has them."""
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("HTTP_PROXY", "http://plain-proxy.example:3128")
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(KUBECONFIG))
    config = api_client_from_settings(Settings(kubeconfig=path)).configuration
    assert (config.host, config.proxy) == ("https://a.example:6443", "http://proxy.example:3128")
    for _ in range(2):  # each call runs the refresh hook, as every request does
        assert config.get_api_key_with_prefix("BearerToken", alias="authorization") == "Bearer tok-123"
    assert (config.host, config.proxy) == ("https://a.example:6443", "http://proxy.example:3128")
    config.host = "http://127.0.0.1:8080"  # a new host still picks its proxy
    assert (config.host, config.proxy) == ("http://127.0.0.1:8080", "http://plain-proxy.example:3128")
