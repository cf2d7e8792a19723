"""Which engine writes, and what kube-controller-manager's in-tree migration means for our request (issue 36),
as tables: storage_migrator/migration/engines.py and in_tree_runs.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from storage_migrator.kube.discovery import DiscoveredResource
from storage_migrator.kube.in_tree import InTreeMigration
from storage_migrator.migration.engines import (
    IN_TREE_UNSEEN_ANNOTATION,
    choose_engine,
    engine_parameter_refusal,
    in_tree_refusal,
    recent_unseen,
)
from storage_migrator.migration.in_tree_runs import (
    BASELINE_ANNOTATION,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    REQUEST_UID_ANNOTATION,
    count_since,
    in_tree_name,
    in_tree_object,
    judge_in_tree,
    ownership,
    restored_stored_versions,
)
from storage_migrator.models import new_storage_version_migration

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
NOW = datetime(2026, 12, 3, 10, 0, tzinfo=UTC)


def resource(group: str, name: str, verbs: tuple[str, ...] = ALL_VERBS) -> DiscoveredResource:
    return DiscoveredResource(group=group, version="v1", resource=name, kind="K", namespaced=True, verbs=verbs,
                              storage_version_hash="h", is_subresource=False)  # fmt: skip


# ----- what kube-controller-manager's migrator can migrate ----------------------------------------
@pytest.mark.parametrize(
    ("group", "name", "verbs", "aggregated", "refused"),
    [
        ("", "secrets", ALL_VERBS, set(), None),
        ("apps", "deployments", ALL_VERBS, set(), None),
        ("", "events", ALL_VERBS, set(), "garbage collector ignores events"),
        ("events.k8s.io", "events", ALL_VERBS, set(), "garbage collector ignores events"),
        ("metrics.example.com", "things", ALL_VERBS, {"metrics.example.com"}, "aggregated API server"),
        ("", "configmaps", ("get", "list", "patch", "update", "watch"), set(), "serves no delete"),
        ("", "configmaps", ("delete", "get", "list", "update", "watch"), set(), "serves no patch: kube-controller"),
    ],
    ids=["secrets", "deployments", "events", "events.k8s.io", "aggregated", "no-delete", "no-patch"],
)
def test_what_the_in_tree_controller_cannot_migrate(
    group: str, name: str, verbs: tuple[str, ...], aggregated: set[str], refused: str | None
) -> None:
    """Issue 36: "It cannot migrate aggregated APIs, nor resources the garbage collector ignores"."""
    answer = in_tree_refusal(resource(group, name, verbs), aggregated_groups=frozenset(aggregated))
    if refused is None:
        assert answer is None
    else:
        assert answer is not None and refused in answer, answer


# ----- the engine of a run ------------------------------------------------------------------
UNSEEN = ("secrets-abc", NOW - timedelta(seconds=30))


@pytest.mark.parametrize(
    ("setting", "served", "refusal", "unseen", "engine", "falls_back", "refused", "says"),
    [
        ("client", "v1", None, None, "client", False, None, ""),
        ("client", None, "x", UNSEEN, "client", False, None, ""),
        ("in-tree", "v1", None, None, "in-tree", False, None, "storagemigration.k8s.io/v1"),
        ("in-tree", "v1beta1", None, UNSEEN, "in-tree", False, None, "storagemigration.k8s.io/v1beta1"),
        ("in-tree", None, None, None, "in-tree", False, "does not serve storagemigration.k8s.io", ""),
        ("in-tree", "v1", "events: ignored", None, "in-tree", False, "STORAGE_MIGRATOR_ENGINE=auto", ""),
        ("auto", "v1", None, None, "in-tree", True, None, "engine auto: in-tree"),
        ("auto", None, None, None, "client", False, None, "does not serve"),
        ("auto", "v1", "events: ignored", None, "client", False, None, "events: ignored: the client engine"),
        ("auto", "v1", None, UNSEEN, "client", False, None, "did not pick up the in-tree migration of request secrets-abc"),
    ],
)  # fmt: skip
def test_the_engine_of_a_run(setting: Any, served: str | None, refusal: str | None, unseen: Any, engine: str,
                             falls_back: bool, refused: str | None, says: str) -> None:  # fmt: skip
    """Issue 36: "`auto` picks `in-tree` where the cluster serves `storagemigration.k8s.io` (`v1`, or
    `v1beta1`) and its controller is seen working, else `client`"; in-tree refuses at once naming the fix."""
    choice = choose_engine(setting, served_version=served, refusal=refusal, unseen=unseen, recheck_seconds=600)
    assert (choice.engine, choice.may_fall_back) == (engine, falls_back)
    if refused is None:
        assert choice.refusal is None
        assert says in choice.note
    else:
        assert choice.refusal is not None and refused in choice.refusal
    if choice.engine == "in-tree" and choice.refusal is None:
        assert choice.in_tree_version == served


def test_a_fallback_is_remembered_on_the_requests_for_a_while() -> None:
    def request(name: str, at: str | None) -> Any:
        made = new_storage_version_migration(group="", version="v1", resource="secrets", name=name)
        if at is not None:
            made.metadata.annotations = {IN_TREE_UNSEEN_ANNOTATION: at}
        return made

    requests = [request("a", "2026-12-03T09:59:00Z"), request("b", "2026-12-03T09:50:30Z"), request("c", None),
                request("d", "not a time")]  # fmt: skip
    assert recent_unseen(requests, now=NOW, within_seconds=600) == ("a", datetime(2026, 12, 3, 9, 59, tzinfo=UTC))
    assert recent_unseen(requests[1:], now=NOW, within_seconds=600) == (
        "b",
        datetime(2026, 12, 3, 9, 50, 30, tzinfo=UTC),
    )
    assert recent_unseen(requests[1:], now=NOW, within_seconds=300) is None
    assert recent_unseen(requests, now=NOW - timedelta(hours=1), within_seconds=600) is None  # from the future


@pytest.mark.parametrize(
    ("asked", "install", "pull", "refused"),
    [
        (None, "in-tree", "prod", False),
        ("in-tree", "in-tree", "prod", False),
        ("client", "in-tree", "prod", True),
        ("auto", "client", "prod", True),
        ("client", "in-tree", None, False),  # push mode: the Prefect server holds the credentials, its choice
    ],
)
def test_in_pull_mode_the_install_decides(asked: Any, install: Any, pull: str | None, refused: bool) -> None:
    """Issue 36: "the cluster decides": a run in pull mode may repeat the install's engine, not change it."""
    answer = engine_parameter_refusal(asked, install=install, pull_mode=pull)
    assert (answer is not None) == refused
    if answer is not None:
        assert "ConfigMap storage-migrator-cluster" in answer and f"fleet add {pull} --engine {install}" in answer


# ----- the in-tree object, and what its state means -------------------------------------------
def test_the_in_tree_object_is_named_annotated_labelled_and_owned_by_our_request() -> None:
    body = in_tree_object(version="v1", name="secrets-key2", group="", resource="secrets", request="secrets-key2",
                          request_uid="u-1", baseline="42", stored_versions=None)  # fmt: skip
    assert body["apiVersion"] == "storagemigration.k8s.io/v1"
    assert body["spec"] == {"resource": {"group": "", "resource": "secrets"}}
    meta = body["metadata"]
    assert meta["labels"] == {MANAGED_BY_LABEL: MANAGED_BY}
    assert meta["annotations"][BASELINE_ANNOTATION] == "42" and meta["annotations"][REQUEST_UID_ANNOTATION] == "u-1"
    assert meta["ownerReferences"] == [{"apiVersion": "migration.k8s.io/v1alpha1", "kind": "StorageVersionMigration",
                                        "name": "secrets-key2", "uid": "u-1"}]  # fmt: skip
    assert ownership(meta, request_uid="u-1") == "this-request"
    assert ownership(meta, request_uid="u-2") == "earlier-request"
    assert ownership({"name": "x"}, request_uid="u-1") == "not-ours"
    assert in_tree_name("secrets-key2", 1) == "secrets-key2"
    assert in_tree_name("secrets-key2", 3) == "secrets-key2-pass3"
    assert len(in_tree_name("x" * 253, 2)) == 253


def observed(phase: str, rv: str | None = "100", message: str = "") -> InTreeMigration:
    return InTreeMigration(api_version="storagemigration.k8s.io/v1", name="m", uid="u", group="", resource="secrets",
                           phase=phase, resource_version=rv, message=message)  # fmt: skip


@pytest.mark.parametrize(
    ("seen", "waited", "step", "says"),
    [
        (None, 1, "gone", "deleted by someone else"),
        (observed("Pending", rv=None), 5, "wait", "waiting for kube-controller-manager"),
        (observed("Pending", rv=None), 61, "not-picked-up", "StorageVersionMigrator feature gate is off"),
        (observed("Pending"), 61, "queued", "kube-controller-manager runs one per resource at a time"),
        (observed("Running"), 61, "running", "not newer than resourceVersion 100"),
        (observed("Running"), 90_000, "timed-out", "in_tree_timeout_seconds"),
        (observed("Succeeded"), 90_000, "succeeded", "Succeeded"),
        (observed("Failed", message="boom"), 1, "failed", "Failed (boom). Failed is terminal there"),
    ],
)
def test_what_the_in_tree_object_means_for_our_request(seen: Any, waited: float, step: str, says: str) -> None:
    verdict = judge_in_tree(seen, name="m", waited_seconds=waited, pickup_seconds=60, timeout_seconds=86_400)
    assert verdict.step == step
    assert says in verdict.message and "storageversionmigrations.storagemigration.k8s.io/m" in verdict.message


def test_our_counts_compare_resource_versions_as_integers() -> None:
    """kubernetes/kubernetes#126521: resourceVersions of one resource compare as integers."""
    counted = count_since(["9", "10", "11", "100"], baseline="10")
    assert (counted.listed, counted.rewritten, counted.unchanged) == (4, 2, 2)  # "9" < "10" as text too; "100" not
    assert count_since(["5", "x"], baseline="10").rewritten == 1  # never a proof by accident
    assert count_since(["5"], baseline="").rewritten == 1


@given(st.lists(st.integers(min_value=1, max_value=10**9)), st.integers(min_value=1, max_value=10**9))
def test_a_pass_rewrote_nothing_exactly_when_no_resource_version_moved_past_the_baseline(
    versions: list[int], baseline: int
) -> None:
    counted = count_since([str(v) for v in versions], baseline=str(baseline))
    assert counted.listed == counted.rewritten + counted.unchanged == len(versions)
    assert (counted.rewritten == 0) == all(v <= baseline for v in versions)


@pytest.mark.parametrize(
    ("before", "now", "restored"),
    [
        (["v1", "v2"], ["v2"], ["v1", "v2"]),  # kcm trimmed on failure: put back
        (["v1", "v2"], ["v1", "v2"], None),
        (["v1", "v2"], ["v1", "v2", "v3"], None),
        (["v1"], ["v2", "v3"], ["v1", "v2", "v3"]),
    ],
)
def test_trimmed_stored_versions_are_put_back(before: list[str], now: list[str], restored: list[str] | None) -> None:
    """The brief of issue 36: kcm trims a CRD's storedVersions on failure too; a trim proves nothing."""
    assert restored_stored_versions(before, now) == restored
