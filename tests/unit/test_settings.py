"""Settings from STORAGE_MIGRATOR_* variables (storage_migrator.settings)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from storage_migrator.settings import Settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("STORAGE_MIGRATOR_"):
            monkeypatch.delenv(key)


def test_defaults() -> None:
    s = Settings()
    assert s.chunk_size == 500
    assert s.write_rate_per_second == 10.0
    assert s.poll_seconds == 600
    assert s.settle_seconds == 60
    assert s.stale_after == 1200  # two poll periods (DESIGN 4.3)
    assert s.in_cluster is None
    assert s.include_resources == [] and s.exclude_resources == []
    assert s.namespace == "storage-migrator"  # the kustomize install's (issue 37: the writer Leases' namespace)
    assert s.shared_write_budget is True


def test_every_field_is_described() -> None:
    for name, field in Settings.model_fields.items():
        assert field.description, f"{name} has no description"


def test_environment_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STORAGE_MIGRATOR_KUBECONFIG", "/tmp/kc")
    monkeypatch.setenv("STORAGE_MIGRATOR_CONTEXT", "kind-a")
    monkeypatch.setenv("STORAGE_MIGRATOR_CHUNK_SIZE", "50")
    monkeypatch.setenv("STORAGE_MIGRATOR_WRITE_RATE_PER_SECOND", "2.5")
    monkeypatch.setenv("STORAGE_MIGRATOR_POLL_SECONDS", "60")
    monkeypatch.setenv("STORAGE_MIGRATOR_INCLUDE_RESOURCES", "secrets, deployments.apps")
    monkeypatch.setenv("STORAGE_MIGRATOR_EXCLUDE_RESOURCES", '["events"]')
    s = Settings()
    assert s.kubeconfig == Path("/tmp/kc")
    assert s.context == "kind-a"
    assert s.chunk_size == 50
    assert s.write_rate_per_second == 2.5
    assert s.stale_after == 120
    assert s.include_resources == ["secrets", "deployments.apps"]
    assert s.exclude_resources == ["events"]


@pytest.mark.parametrize(
    ("env", "value", "fragment"),
    [
        ("CHUNK_SIZE", "0", "chunk_size"),
        ("WRITE_RATE_PER_SECOND", "0", "write_rate_per_second"),
        ("MAX_WRITE_ATTEMPTS", "0", "max_write_attempts"),
        ("INCLUDE_RESOURCES", "apps/deployments", "deployments.apps"),
        ("STALE_AFTER_SECONDS", "10", "stale_after_seconds"),
        ("BACKOFF_MAX_SECONDS", "0.1", "backoff_max_seconds"),
    ],
)
def test_invalid_values_name_the_setting(monkeypatch: pytest.MonkeyPatch, env: str, value: str, fragment: str) -> None:
    monkeypatch.setenv(f"STORAGE_MIGRATOR_{env}", value)
    with pytest.raises(ValidationError, match=fragment):
        Settings()


def test_in_cluster_and_kubeconfig_are_exclusive() -> None:
    with pytest.raises(ValidationError, match="not both"):
        Settings(in_cluster=True, kubeconfig=Path("/tmp/kc"))


def test_api_servers_accept_the_comma_form_the_field_documents(monkeypatch: pytest.MonkeyPatch) -> None:
    """The description's own example, 'https://10.0.0.1:6443,https://10.0.0.2:6443', from the
    environment (pydantic-settings parsed it as JSON first and refused it), and the JSON form."""
    monkeypatch.setenv("STORAGE_MIGRATOR_API_SERVERS", "https://10.0.0.1:6443, https://10.0.0.2:6443/")
    assert Settings().api_servers == ["https://10.0.0.1:6443", "https://10.0.0.2:6443"]
    monkeypatch.setenv("STORAGE_MIGRATOR_API_SERVERS", '["https://10.0.0.3:6443"]')
    assert Settings().api_servers == ["https://10.0.0.3:6443"]
    monkeypatch.setenv("STORAGE_MIGRATOR_API_SERVERS", "10.0.0.4:6443")
    with pytest.raises(ValueError, match="expected https://HOST:PORT"):
        Settings()
