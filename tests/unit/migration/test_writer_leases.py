"""The writer Leases on the wire (storage_migrator.migration.writer_leases): what a holder writes is
what a reader understands (issue 37); kubesim answers them as kube-apiserver does
(tests/integration/test_write_budget.py)."""

from __future__ import annotations

from datetime import UTC, datetime

from storage_migrator.migration.write_budget import LEASE_SECONDS
from storage_migrator.migration.writer_leases import (
    RATE_ANNOTATION,
    WRITER_SELECTOR,
    lease_body,
    lease_name,
    parse_lease,
)

AT = datetime(2026, 11, 29, 12, 0, 0, 123456, tzinfo=UTC)


def test_a_lease_written_reads_back_as_written() -> None:
    body = lease_body(namespace="storage-migrator", request="secrets-key2", holder="run-1/0a0b0c0d", acquired=AT,
                      renewed=AT, transitions=2, writes_per_second=12.5, resource_version="41")  # fmt: skip
    body["metadata"]["resourceVersion"] = "42"
    lease = parse_lease(body)
    assert (lease.name, lease.request, lease.holder, lease.renewed) == (
        "storage-migrator-writer-secrets-key2",
        "secrets-key2",
        "run-1/0a0b0c0d",
        AT,
    )
    assert (lease.duration_seconds, lease.writes_per_second, lease.transitions, lease.resource_version) == (
        LEASE_SECONDS, 12.5, 2, "42")  # fmt: skip
    assert body["spec"]["renewTime"] == "2026-11-29T12:00:00.123456Z"  # metav1.MicroTime
    assert set(WRITER_SELECTOR.split(",")) == {f"{k}={v}" for k, v in body["metadata"]["labels"].items()}


def test_a_lease_that_holds_without_writing_says_no_rate() -> None:
    body = lease_body(namespace="ns", request="r", holder="h", acquired=AT, renewed=AT, transitions=0,
                      writes_per_second=None)  # fmt: skip
    assert RATE_ANNOTATION not in body["metadata"]["annotations"] and "resourceVersion" not in body["metadata"]
    assert parse_lease(body).writes_per_second is None
    body["metadata"]["annotations"][RATE_ANNOTATION] = "not a number"  # an operator's edit: not a writer
    assert parse_lease(body).writes_per_second is None


def test_a_request_name_too_long_for_a_lease_name_is_cut_and_hashed_never_shared() -> None:
    long_a, long_b = "a" * 250, "a" * 249 + "b"
    assert len(lease_name(long_a)) <= 253 and len(lease_name(long_b)) <= 253
    assert lease_name(long_a) != lease_name(long_b)
    assert lease_name("x") == "storage-migrator-writer-x"
