"""Which discovered resources detection and initialization track (DESIGN 4.3, 4.7)."""

from __future__ import annotations

import pytest

from storage_migrator.detection.tracking import tracked_resources
from storage_migrator.kube.discovery import DiscoveredResource

RW = ("get", "list", "patch", "update")


def res(
    resource: str,
    hash_: str = "h1",
    *,
    group: str = "apps",
    version: str = "v1",
    verbs: tuple[str, ...] = RW,
    preferred: bool = True,
) -> DiscoveredResource:
    return DiscoveredResource(
        group=group,
        version=version,
        resource=resource,
        kind="Kind",
        namespaced=True,
        verbs=verbs,
        storage_version_hash=hash_,
        is_subresource="/" in resource,
        preferred=preferred,
    )


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        (res("deployments"), None),
        (res("deployments", verbs=("get", "list", "patch")), None),
        (res("deployments", verbs=("get", "list", "update")), None),
        (res("deployments/status", ""), "sub-resource: stored with its parent resource"),
        (res("tokenreviews", "", verbs=("create",)), "not persisted: no storageVersionHash"),
        (res("fischers", verbs=("get", "watch")), "cannot be listed: no list verb (serves get, watch)"),
        (res("readonlies", verbs=("get", "list")), "cannot be rewritten: neither update nor patch (serves get, list)"),
    ],
)
def test_unfit_resources_are_skipped_with_a_reason(entry: DiscoveredResource, reason: str | None) -> None:
    kept, skipped = tracked_resources([entry])
    if reason is None:
        assert kept == [entry]
        assert skipped == []
    else:
        assert kept == []
        assert [(s.group_resource, s.reason) for s in skipped] == [(entry.group_resource, reason)]


def test_one_entry_per_resource_in_its_preferred_version() -> None:
    old = res("deployments", version="v1beta1", preferred=False)
    new = res("deployments", version="v1")
    kept, _ = tracked_resources([old, new])
    assert kept == [new]


def test_shared_storage_is_tracked_once_under_the_first_group() -> None:
    # core events and events.events.k8s.io: same hash, same plural (seed 002, DESIGN 4.3).
    core = res("events", "r2yiGXH7wu8=", group="")
    other = res("events", "r2yiGXH7wu8=", group="events.k8s.io")
    lookalike = res("events", "different", group="example.com")
    kept, skipped = tracked_resources([other, lookalike, core])
    assert kept == [core, lookalike]
    assert [(s.group_resource, s.reason) for s in skipped] == [("events.events.k8s.io", "shares storage with events")]


def test_select_resources_honours_include_then_exclude() -> None:
    """DESIGN 5: "resources to include / exclude" apply to detection as to initialize."""
    from storage_migrator.detection.tracking import select_resources
    from storage_migrator.kube.discovery import DiscoveredResource

    def entry(group: str, resource: str) -> DiscoveredResource:
        return DiscoveredResource(group=group, version="v1", resource=resource, kind="K", namespaced=True,
                                  verbs=("list", "patch"), storage_version_hash="h", is_subresource="/" in resource)  # fmt: skip

    found = [entry("", "configmaps"), entry("", "secrets"), entry("apps", "deployments"), entry("", "secrets/status")]
    names = lambda xs: [f"{e.resource}.{e.group}" if e.group else e.resource for e in xs]  # noqa: E731
    assert names(select_resources(found)) == ["configmaps", "secrets", "deployments.apps", "secrets/status"]
    assert names(select_resources(found, include=["secrets", "deployments.apps"])) == [
        "secrets", "deployments.apps", "secrets/status"]  # fmt: skip
    assert names(select_resources(found, exclude=["SECRETS"])) == ["configmaps", "deployments.apps"]
    assert names(select_resources(found, include=["secrets"], exclude=["secrets"])) == []


def test_include_and_exclude_speak_of_storage() -> None:
    """Issue 24: detection and `initialize` select alike (one rule, `listed_out`): naming either
    name of a shared storage selects, or excludes, that storage, tracked under its kept name."""
    from storage_migrator.detection.tracking import listed_out, select_resources

    core = res("events", "r2yiGXH7wu8=", group="")
    other = res("events", "r2yiGXH7wu8=", group="events.k8s.io")
    cms = res("configmaps", "qFsyl6wFWjQ=", group="")
    found = [core, other, cms]
    kept, _ = tracked_resources(select_resources(found, include=["events.events.k8s.io"]))
    assert kept == [core]
    assert select_resources(found, exclude=["events.events.k8s.io"]) == [cms]
    assert select_resources(found, include=["configmaps"]) == [cms]
    assert listed_out(["events", "events.events.k8s.io"], exclude=["EVENTS.events.k8s.io"]) == (
        "in the exclude list (as events.events.k8s.io, which shares its storage)"
    )
    assert listed_out(["events"], include=["secrets"]) == "not in the include list"
    assert listed_out(["events"]) is None
