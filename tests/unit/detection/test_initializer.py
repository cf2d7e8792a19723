"""What the initialize flow plans and reports (issue 24; seed 002 "Alpha workflow", DESIGN 4.7), from recorded discovery.

Issue 24: the first look at a resource is one path. ``plan_initialization`` is
the detection poll's plan (seed 000) with a report; these tables check both the
report (seed 002's rules) and that the plan is the poll's, StorageState first.
"""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from recorded import REFERENCE

from storage_migrator.agreement.reporters import ReporterHash
from storage_migrator.conditions import set_condition
from storage_migrator.detection.actions import CreateMigration, CreateState, DeleteMigration, UpdateState
from storage_migrator.detection.changes import is_heartbeat
from storage_migrator.detection.initializer import (
    ApiServiceInfo,
    InitialRequest,
    InitPlan,
    plan_initialization,
)
from storage_migrator.detection.observation import Observations
from storage_migrator.detection.planner import SINCE_ANNOTATION, format_time
from storage_migrator.detection.poll import plan_poll
from storage_migrator.kube.crds import CrdObservation
from storage_migrator.kube.discovery import (
    APIResourceListDoc,
    DiscoveredResource,
    GroupVersionFailure,
    parse_resource_list,
)
from storage_migrator.models import (
    UNKNOWN,
    GroupResource,
    GroupVersionResource,
    ObjectMeta,
    StorageState,
    StorageStateSpec,
    StorageStateStatus,
    StorageVersionMigration,
    new_storage_version_migration,
)
from storage_migrator.settings import Settings

EVENTS_HASH = "r2yiGXH7wu8="  # reference/README: core events and events.events.k8s.io report the same hash


def load(name: str) -> APIResourceListDoc:
    doc: APIResourceListDoc = json.loads((REFERENCE / name).read_text())
    return doc


def doc(group_version: str, *resources: dict[str, Any]) -> APIResourceListDoc:
    """A discovery document for group versions not recorded in tests/reference."""
    return cast(
        APIResourceListDoc, {"kind": "APIResourceList", "groupVersion": group_version, "resources": list(resources)}
    )


RW = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


def entry(name: str, kind: str, verbs: list[str], hash_: str = "") -> dict[str, Any]:
    found: dict[str, Any] = {"name": name, "kind": kind, "namespaced": True, "verbs": verbs}
    if hash_:
        found["storageVersionHash"] = hash_
    return found


def crd_versions(version: str) -> APIResourceListDoc:
    """The recorded CRD document (hash of bars.example.com/v2/Widget) served at `version`."""
    recorded = load("discovery-crd-after-flip.json")
    return {**recorded, "groupVersion": f"bars.example.com/{version}"}


def realistic_discovery() -> list[DiscoveredResource]:
    found = parse_resource_list(load("discovery-api-v1.json"), preferred=True)
    found += parse_resource_list(load("discovery-apis-apps-v1.json"), preferred=True)
    # A CRD served in two versions, v2 preferred (as after the recorded storage flip).
    found += parse_resource_list(crd_versions("v2"), preferred=True)
    found += parse_resource_list(crd_versions("v1"))
    found += parse_resource_list(
        doc("events.k8s.io/v1", entry("events", "Event", RW, EVENTS_HASH)),
        preferred=True,
    )
    found += parse_resource_list(
        doc("authentication.k8s.io/v1", entry("tokenreviews", "TokenReview", ["create"])),
        preferred=True,
    )
    # Aggregated APIs: metrics-server serves no hash; wardle (the sample apiserver) stores flunders.
    found += parse_resource_list(
        doc("metrics.k8s.io/v1beta1", entry("pods", "PodMetrics", ["get", "list"])),
        preferred=True,
    )
    found += parse_resource_list(
        doc(
            "wardle.example.com/v1beta1",
            entry("flunders", "Flunder", RW, "Gz4cX8lGXKc="),
            entry("fischers", "Fischer", ["create", "get", "watch"], "aQ1b2c3d4e5="),
            entry("readonlies", "ReadOnly", ["get", "list", "watch"], "ZZtop12345A="),
            entry("putonlies", "PutOnly", ["get", "list", "update"], "PuT0nly1234="),
        ),
        preferred=True,
    )
    return found


CRD_OBJECT: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.bars.example.com", "resourceVersion": "7"},
    "spec": {
        "group": "bars.example.com",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
        "scope": "Namespaced",
        "versions": [
            {"name": "v1", "served": True, "storage": False},
            {"name": "v2", "served": True, "storage": True},
        ],
    },
    "status": {"storedVersions": ["v1", "v2"]},
}


def apiservice(group: str, version: str, service: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": f"{version}.{group}"},
        "spec": {"group": group, "version": version, "service": service, "groupPriorityMinimum": 100},
    }


APISERVICES = [
    apiservice("", "v1", None),  # local: kube-apiserver itself ("v1.")
    apiservice("apps", "v1", None),
    apiservice("bars.example.com", "v2", None),  # CRDs get local APIServices too
    apiservice("metrics.k8s.io", "v1beta1", {"namespace": "kube-system", "name": "metrics-server", "port": 443}),
    apiservice("wardle.example.com", "v1beta1", {"namespace": "wardle", "name": "api", "port": 443}),
]


def observed(
    *,
    discovered: list[DiscoveredResource] | None = None,
    crds: list[CrdObservation] | None = None,
    states: list[StorageState] | None = None,
    existing: list[StorageVersionMigration] | None = None,
    reporters: list[ReporterHash] | None = None,
    failures: list[GroupVersionFailure] | None = None,
) -> Observations:
    """What the poll of initialize sees: recorded discovery, the CRD of widgets, nothing else by default."""
    crd = CrdObservation.from_object(CRD_OBJECT)
    return Observations(
        discovered=realistic_discovery() if discovered is None else discovered,
        discovery_failures=failures or [],
        states=states or [],
        migrations=existing or [],
        crds=([crd] if crd else []) if crds is None else crds,
        reporters=reporters or [],
    )


def settings_of(include: tuple[str, ...] = (), exclude: tuple[str, ...] = (), *, settle: float = 60) -> Settings:
    return Settings(include_resources=list(include), exclude_resources=list(exclude), settle_seconds=settle)


def plan(
    *,
    existing: list[StorageVersionMigration] | None = None,
    states: list[StorageState] | None = None,
    include: tuple[str, ...] = (),
    exclude: tuple[str, ...] = (),
    settle: float = 60,
    seen: Observations | None = None,
    apiservices: list[ApiServiceInfo] | None = None,
) -> InitPlan:
    return plan_initialization(
        seen or observed(existing=existing, states=states),
        settings=settings_of(include, exclude, settle=settle),
        apiservices=[ApiServiceInfo.from_object(obj) for obj in APISERVICES] if apiservices is None else apiservices,
        now=NOW,
    )


def outcome(result: InitPlan, group_resource: str) -> str:
    """'request <origin> <version>' or 'skip <reason>', the one entry for that group-resource."""
    requests = [f"request {r.origin} {r.version}" for r in result.requests if r.group_resource == group_resource]
    skips = [f"skip {s.reason}" for s in result.skipped if s.group_resource == group_resource]
    assert len(requests) + len(skips) == 1, (group_resource, requests, skips)
    return (requests + skips)[0]


ROWS = [
    (
        'seed 002: "generates a comprehensive list of resource types via the discovery API"',
        "secrets",
        "request built-in v1",
    ),
    ("built-in group resources come from discovery too", "deployments.apps", "request built-in v1"),
    (
        'seed 002: "discovers all custom resources via listing CRDs" (the preferred version is requested)',
        "widgets.bars.example.com",
        "request custom v2",
    ),
    (
        'seed 002: "discovers all aggregated resources via listing all apiservices that have .spec.service != null"',
        "flunders.wardle.example.com",
        "request aggregated v1beta1",
    ),
    (
        "a resource served through a local APIService (spec.service null) is built-in",
        "configmaps",
        "request built-in v1",
    ),
    ("DESIGN 4.7: sub-resources are dropped", "pods/status", "skip sub-resource: stored with its parent resource"),
    (
        "DESIGN 4.3: resources whose storageVersionHash is empty are skipped (bindings)",
        "bindings",
        "skip not persisted: no storageVersionHash",
    ),
    (
        "DESIGN 4.3: virtual resources such as tokenreviews are skipped",
        "tokenreviews.authentication.k8s.io",
        "skip not persisted: no storageVersionHash",
    ),
    (
        "an aggregated API that stores nothing (metrics) is not persisted",
        "pods.metrics.k8s.io",
        "skip not persisted: no storageVersionHash",
    ),
    (
        "DESIGN 4.7: resources without list are dropped",
        "fischers.wardle.example.com",
        "skip cannot be listed: no list verb (serves create, get, watch)",
    ),
    (
        "DESIGN 4.7: resources without update (and without patch) are dropped",
        "readonlies.wardle.example.com",
        "skip cannot be rewritten: neither update nor patch (serves get, list, watch)",
    ),
    (
        "update without patch is enough: the PUT fallback rewrites it (DESIGN 4.5)",
        "putonlies.wardle.example.com",
        "request aggregated v1beta1",
    ),
    (
        'seed 002: "removes resources that share the same storage": core events is kept',
        "events",
        "request built-in v1",
    ),
    (
        "DESIGN 4.7: e.g. events and events.events.k8s.io: the one in the group sorting later is skipped",
        "events.events.k8s.io",
        "skip shares storage with events",
    ),
    (
        "the same plural in another group with another hash is another storage (pods vs pods.metrics is not shared)",
        "pods",
        "request built-in v1",
    ),
]


@pytest.mark.parametrize(("rule", "group_resource", "expected"), ROWS, ids=[row[0] for row in ROWS])
def test_initializer_rules(rule: str, group_resource: str, expected: str) -> None:
    assert outcome(plan(), group_resource) == expected


def test_one_entry_per_group_resource_not_per_version() -> None:
    result = plan()
    names = [r.group_resource for r in result.requests] + [s.group_resource for s in result.skipped]
    assert [n for n, count in Counter(names).items() if count > 1] == []
    # widgets is served in v1 and v2 and requested once, in the preferred version.
    assert [r for r in result.requests if r.resource == "widgets"] == [
        InitialRequest(
            group="bars.example.com",
            version="v2",
            resource="widgets",
            origin="custom",
            storage_version_hash="dcbo7X9Z3o4=",
        )
    ]


def test_every_discovered_group_resource_is_requested_or_skipped() -> None:
    result = plan()
    discovered = {r.group_resource for r in realistic_discovery()}
    accounted = {r.group_resource for r in result.requests} | {s.group_resource for s in result.skipped}
    assert accounted == discovered


def test_requests_sorted_by_group_then_resource_with_the_discovery_hash() -> None:
    result = plan()
    keys = [(r.group, r.resource) for r in result.requests]
    assert keys == sorted(keys)
    assert keys[0] == ("", "configmaps")
    assert [(r.group_resource, r.storage_version_hash) for r in result.requests if not r.group][:3] == [
        ("configmaps", "qFsyl6wFWjQ="),
        ("endpoints", "fWeeMqaN/OA="),
        ("events", EVENTS_HASH),
    ]
    assert [r.group_resource for r in result.requests] == [
        *CORE_PERSISTED,
        "controllerrevisions.apps",
        "daemonsets.apps",
        "deployments.apps",
        "replicasets.apps",
        "statefulsets.apps",
        "widgets.bars.example.com",
        "flunders.wardle.example.com",
        "putonlies.wardle.example.com",
    ]
    skipped = [s.group_resource for s in result.skipped]
    assert skipped == sorted(skipped, key=lambda n: (n.partition(".")[2], n.partition(".")[0]))


CORE_PERSISTED = [
    "configmaps",
    "endpoints",
    "events",
    "limitranges",
    "namespaces",
    "nodes",
    "persistentvolumeclaims",
    "persistentvolumes",
    "pods",
    "podtemplates",
    "replicationcontrollers",
    "resourcequotas",
    "secrets",
    "serviceaccounts",
    "services",
]


def svm(name: str, resource: str, *, group: str = "", state: str = "new") -> StorageVersionMigration:
    migration = new_storage_version_migration(group=group, version="v1", resource=resource, name=name)
    if state != "new":
        migration.status.conditions = set_condition(
            migration.status.conditions, condition_type=state, status="True", now=NOW
        )
    return migration


NOW = datetime(2026, 11, 22, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("rule", "existing", "group_resource", "expected"),
    [
        (
            "a pending (no status) request already exists for the resource",
            [svm("secrets-abcde", "secrets")],
            "secrets",
            "skip already requested: secrets-abcde",
        ),
        (
            "a Running request is pending too",
            [svm("deployments.apps-x", "deployments", group="apps", state="Running")],
            "deployments.apps",
            "skip already requested: deployments.apps-x",
        ),
        (
            "a Succeeded request is a record of the past, not pending: a new request is made",
            [svm("secrets-old", "secrets", state="Succeeded")],
            "secrets",
            "request built-in v1",
        ),
        (
            "a Failed request is finished, not pending: a new request is made",
            [svm("secrets-old", "secrets", state="Failed")],
            "secrets",
            "request built-in v1",
        ),
        (
            "a pending request of another resource does not count",
            [svm("configmaps-a", "configmaps")],
            "secrets",
            "request built-in v1",
        ),
        (
            "a pending request through the other name of a shared storage counts (same objects)",
            [svm("ev-1", "events", group="events.k8s.io")],
            "events",
            "skip already requested: ev-1",
        ),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_already_requested(
    rule: str, existing: list[StorageVersionMigration], group_resource: str, expected: str
) -> None:
    assert outcome(plan(existing=existing), group_resource) == expected


@pytest.mark.parametrize(
    ("rule", "include", "exclude", "expected"),
    [
        (
            "include names a core resource as <resource>",
            ("secrets",),
            (),
            {"secrets": "request built-in v1", "configmaps": "skip not in the include list"},
        ),
        (
            "include names a group resource as <resource>.<group>",
            ("deployments.apps",),
            (),
            {"deployments.apps": "request built-in v1", "secrets": "skip not in the include list"},
        ),
        (
            "exclude wins over include (applied after it, as the settings say)",
            ("secrets", "configmaps"),
            ("secrets",),
            {"secrets": "skip in the exclude list", "configmaps": "request built-in v1"},
        ),
        (
            "names are matched case-insensitively",
            (),
            ("Secrets",),
            {"secrets": "skip in the exclude list", "configmaps": "request built-in v1"},
        ),
        (
            "including the skipped name of a shared storage migrates that storage through the kept name",
            ("events.events.k8s.io",),
            (),
            {"events": "request built-in v1", "events.events.k8s.io": "skip shares storage with events"},
        ),
        (
            "excluding either name of a shared storage excludes the storage",
            (),
            ("events.events.k8s.io",),
            {
                "events": "skip in the exclude list (as events.events.k8s.io, which shares its storage)",
                "events.events.k8s.io": "skip shares storage with events",
            },
        ),
        (
            "filters do not hide structural reasons: an excluded virtual resource is still not persisted",
            (),
            ("bindings",),
            {"bindings": "skip not persisted: no storageVersionHash", "pods": "request built-in v1"},
        ),
        (
            "a sub-resource follows its parent: excluding pods leaves pods/status a sub-resource",
            (),
            ("pods",),
            {"pods/status": "skip sub-resource: stored with its parent resource", "pods": "skip in the exclude list"},
        ),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_include_and_exclude(
    rule: str, include: tuple[str, ...], exclude: tuple[str, ...], expected: dict[str, str]
) -> None:
    result = plan(include=include, exclude=exclude)
    assert {name: outcome(result, name) for name in expected} == expected


def test_include_only_requests_what_it_names() -> None:
    result = plan(include=("secrets", "widgets.bars.example.com"))
    assert [r.group_resource for r in result.requests] == ["secrets", "widgets.bars.example.com"]


def test_crd_without_discovery_entry_is_reported() -> None:
    """A CRD that is not served yet (not established) has no hash to migrate to: said, not dropped silently."""
    gadgets = CrdObservation(name="gadgets.bars.example.com", group="bars.example.com", plural="gadgets",
                             kind="Gadget", storage_version="v1", resource_version="1")  # fmt: skip
    result = plan(seen=observed(crds=[gadgets]), apiservices=[])
    assert outcome(result, "gadgets.bars.example.com") == "skip defined by a CRD but not served by discovery"
    # Without the CRD and APIService lists, widgets and flunders are counted as built-in.
    assert outcome(result, "widgets.bars.example.com") == "request built-in v2"
    assert outcome(result, "flunders.wardle.example.com") == "request built-in v1beta1"


def test_crd_from_object_reads_the_storage_version() -> None:
    crd = CrdObservation.from_object(CRD_OBJECT)
    assert crd is not None
    assert (crd.group, crd.plural, crd.kind, crd.storage_version) == ("bars.example.com", "widgets", "Widget", "v2")
    assert crd.stored_versions == ["v1", "v2"]


def test_crd_from_object_v1beta1_single_version() -> None:
    legacy = {
        "metadata": {"name": "foos.example.com", "resourceVersion": "3"},
        "spec": {"group": "example.com", "version": "v1alpha1", "names": {"plural": "foos", "kind": "Foo"}},
    }
    crd = CrdObservation.from_object(legacy)
    assert crd is not None and crd.storage_version == "v1alpha1"


def test_crd_from_object_without_group_is_not_read() -> None:
    assert CrdObservation.from_object({"metadata": {"name": "broken"}, "spec": {"names": {"plural": "x"}}}) is None


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (APISERVICES[0], ApiServiceInfo(group="", version="v1", has_service=False)),
        (APISERVICES[1], ApiServiceInfo(group="apps", version="v1", has_service=False)),
        (APISERVICES[4], ApiServiceInfo(group="wardle.example.com", version="v1beta1", has_service=True)),
        # kube-apiserver omits spec.service for local APIServices rather than writing null.
        ({"spec": {"group": "batch", "version": "v1"}}, ApiServiceInfo(group="batch", version="v1", has_service=False)),
    ],
)
def test_apiservice_from_object(obj: dict[str, Any], expected: ApiServiceInfo) -> None:
    assert ApiServiceInfo.from_object(obj) == expected


def test_apiservice_from_object_rejects_one_without_version() -> None:
    with pytest.raises(ValueError, match=r"no spec\.version"):
        ApiServiceInfo.from_object({"metadata": {"name": "odd"}, "spec": {"group": "x"}})


def test_aggregated_means_the_requested_group_version_is_served_by_a_service() -> None:
    """Seed 002 lists APIServices, which are per group *version*: another version of the group may be local."""
    discovered = parse_resource_list(
        doc("wardle.example.com/v1", entry("flunders", "Flunder", RW, "Gz4cX8lGXKc=")), preferred=True
    ) + parse_resource_list(doc("wardle.example.com/v1beta1", entry("flunders", "Flunder", RW, "Gz4cX8lGXKc=")))
    services = [
        ApiServiceInfo(group="wardle.example.com", version="v1", has_service=False),
        ApiServiceInfo(group="wardle.example.com", version="v1beta1", has_service=True),
    ]
    result = plan(seen=observed(discovered=discovered, crds=[]), apiservices=services)
    assert outcome(result, "flunders.wardle.example.com") == "request built-in v1"
    flipped = [ApiServiceInfo(group="wardle.example.com", version="v1", has_service=True)]
    result = plan(seen=observed(discovered=discovered, crds=[]), apiservices=flipped)
    assert outcome(result, "flunders.wardle.example.com") == "request aggregated v1"


def test_a_group_version_discovery_could_not_read_is_reported_and_the_rest_requested() -> None:
    """On a real cluster an aggregated API whose server is down answers 503 to discovery
    (`kubectl api-resources`: "unable to retrieve the complete list of server APIs").
    That must not leave every other resource unmigrated: the rest is requested, the
    miss is named with what to do."""
    down = GroupVersionFailure(
        group_version="metrics.k8s.io/v1beta1", code=503, reason="ServiceUnavailable", message="service unavailable"
    )
    complete = plan(seen=observed(crds=[]), apiservices=[])
    partial = plan(seen=observed(crds=[], failures=[down]), apiservices=[])
    assert complete.complete and not partial.complete
    assert partial.requests == complete.requests
    assert partial.plan == complete.plan
    assert partial.skipped == complete.skipped
    (missed,) = partial.unreachable
    assert missed.startswith("metrics.k8s.io/v1beta1: discovery answered 503 ServiceUnavailable")
    assert "run initialize again" in missed


# ----- issue 24: the first look at a resource is the detection poll's ---------------------------

MIN = timedelta(minutes=1)


def hash_of(group_resource: str) -> str:
    return next(r.storage_version_hash for r in realistic_discovery() if r.group_resource == group_resource)


SECRETS = hash_of("secrets")
OLD = "oldHash123="


def rv_at(when: datetime) -> str:
    """The resourceVersion etcd had at `when` in these tests (issue 36: refinement is ordered by it)."""
    return str(int((when - NOW).total_seconds()) + 100_000)


def known(
    current: str | None, persisted: list[str], *, since: datetime = NOW - 5 * MIN, name: str = "secrets", rv: str = "5"
) -> StorageState:
    """A StorageState as a poll wrote it, one heartbeat ago (its switch recorded at `since`)."""
    return StorageState(
        metadata=ObjectMeta(name=name, resource_version=rv, annotations={SINCE_ANNOTATION: format_time(since)}),
        spec=StorageStateSpec(resource=GroupResource(group="", resource=name)),
        status=StorageStateStatus(
            persisted_storage_version_hashes=persisted,
            current_storage_version_hash=current,
            last_heartbeat_time=NOW - MIN,
            current_hash_resource_version=rv_at(since),
        ),
    )


def succeeded(
    name: str, resource: str, *, target: str, started: datetime, requested_by: str = "initialize"
) -> StorageVersionMigration:
    migration = new_storage_version_migration(
        group="", version="v1", resource=resource, name=name, labels={"migration.k8s.io/requested-by": requested_by}
    )
    migration.status.target_storage_version_hash = target
    migration.status.started_at = started
    migration.status.resource_version = rv_at(started)  # its first LIST
    migration.status.finished_at = started + MIN
    migration.status.conditions = set_condition(
        migration.status.conditions, condition_type="Succeeded", status="True", now=started + MIN
    )
    return migration


def test_the_plan_is_the_detection_polls() -> None:
    """Issue 24: "Make `initialize` a detection poll over every resource ... one code path"."""
    seen = observed(existing=[svm("secrets-abcde", "secrets")], states=[known(SECRETS, [SECRETS], name="configmaps")])
    settings = settings_of()
    assert plan_initialization(seen, settings=settings, apiservices=[], now=NOW).plan == plan_poll(
        seen, settings, now=NOW
    )


def test_every_request_comes_after_the_state_that_records_its_hash() -> None:
    """Seed 000: a new resource gets its StorageState, persisted ["Unknown"] and the current hash
    recorded now, and a migration; the state is written first, so the migration starts after the
    state recorded the hash, and its success refines the state."""
    result = plan()
    actions = result.plan.actions
    created = {a.name: (i, a) for i, a in enumerate(actions) if isinstance(a, CreateState)}
    assert [r.group_resource for r in result.requests] == [
        a.group_resource for a in result.plan.of_kind(CreateMigration)
    ]
    for i, request in enumerate(actions):
        if isinstance(request, CreateMigration):
            at, state = created[request.group_resource]
            assert at < i
            assert (state.current_hash, state.persisted) == (request.target_hash, [UNKNOWN])
            assert state.annotations == {SINCE_ANNOTATION: format_time(NOW)}
    assert len(result.requests) == len(created), "one state per request, no state without one on a first install"


@pytest.mark.parametrize(
    ("rule", "states", "existing", "settle", "expected"),
    [
        (
            "a resource a poll (or an earlier initialize) already refined is not migrated again",
            [known(SECRETS, [SECRETS])],
            [],
            60,
            f"skip already migrated: every object is stored in {SECRETS} (its StorageState says so)",
        ),
        (
            "an earlier initialize's request still pending is waited for, not doubled (seed 003: one at a time)",
            [known(SECRETS, [UNKNOWN])],
            [svm("secrets-abcde", "secrets")],
            60,
            "skip already requested: secrets-abcde",
        ),
        (
            "seed 000: a migration refines a state only if it started after the state recorded the hash; "
            "one that started before proves nothing: a new one is requested",
            [known(SECRETS, [UNKNOWN], since=NOW - MIN)],
            [succeeded("secrets-early", "secrets", target=SECRETS, started=NOW - 3 * MIN)],
            60,
            "request built-in v1",
        ),
        (
            "the same migration started after the state recorded the hash refines it: nothing to request",
            [known(SECRETS, [UNKNOWN], since=NOW - 5 * MIN)],
            [succeeded("secrets-later", "secrets", target=SECRETS, started=NOW - 3 * MIN)],
            60,
            f"skip already migrated: every object is stored in {SECRETS} (its StorageState says so)",
        ),
        (
            "a hash that changed since the last poll waits for the settle delay, as in every poll (seed 004)",
            [known(OLD, [OLD])],
            [],
            60,
            f"skip no migration yet (persisted ['{OLD}', '{SECRETS}']): "
            f"storage version hash changed from {OLD} to {SECRETS}",
        ),
        (
            "without a settle delay the changed resource gets its migration at once (seed 000)",
            [known(OLD, [OLD])],
            [],
            0,
            "request built-in v1",
        ),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_a_resource_with_a_storage_state(
    rule: str, states: list[StorageState], existing: list[StorageVersionMigration], settle: float, expected: str
) -> None:
    assert outcome(plan(states=states, existing=existing, settle=settle), "secrets") == expected


def test_api_servers_that_disagree_get_a_state_and_no_request() -> None:
    """Seed 000 (HA): a migration starts only while every server reports one hash. The state
    records what each server reports, without the time the hash was recorded (no SINCE)."""
    reports = [
        ReporterHash(reporter_id=f"api-{i}", group="", resource="secrets", hash=h) for i, h in enumerate([SECRETS, OLD])
    ]
    result = plan(seen=observed(reporters=reports))
    (state,) = [a for a in result.plan.of_kind(CreateState) if a.name == "secrets"]
    assert state.persisted == [UNKNOWN] and state.annotations == {}
    assert sorted(h.current_storage_version_hash for h in state.current_hashes) == sorted([SECRETS, OLD])
    assert "secrets" not in [a.group_resource for a in result.plan.of_kind(CreateMigration)]
    assert outcome(result, "secrets").startswith("skip no migration yet: no StorageState: created with persisted")
    assert "reporters disagree" in outcome(result, "secrets")
    assert outcome(result, "configmaps") == "request built-in v1"


def _written(action: CreateState | UpdateState, old: StorageState | None, rv: int) -> StorageState:
    """The StorageState an applied state write leaves (what tasks/detecting.py writes)."""
    spec = old.spec if old else StorageStateSpec(resource=GroupResource(group="", resource=action.name))
    return StorageState(
        metadata=ObjectMeta(name=action.name, resource_version=str(rv), annotations=dict(action.annotations)),
        spec=spec,
        status=StorageStateStatus(
            persisted_storage_version_hashes=list(action.persisted),
            current_storage_version_hash=action.current_hash,
            last_heartbeat_time=action.heartbeat,
            current_storage_version_hashes=list(action.current_hashes),
            # Issue 36: the revision when the switch is recorded (tasks/detecting.py reads it).
            current_hash_resource_version=rv_at(action.heartbeat)
            if action.record_switch
            else action.switch_resource_version,
        ),
    )


def _apply(states: list[StorageState], actions: list[Any], rv: int) -> list[StorageState]:
    by_name = {s.metadata.name: s for s in states}
    for action in actions:
        if isinstance(action, CreateState | UpdateState):
            by_name[action.name] = _written(action, by_name.get(action.name), rv)
    return list(by_name.values())


def test_after_initialize_and_its_migrations_a_poll_plans_nothing_but_heartbeats() -> None:
    """Issue 24: after `initialize` and `run-migrations`, a detection poll plans nothing for those
    resources and their StorageStates hold the current hash alone; a hash that changes afterwards
    still gets its one new migration (the seed's safety rule is unchanged)."""
    include = ("secrets", "configmaps")
    settings = settings_of(include, settle=0)
    first = plan_initialization(observed(), settings=settings, apiservices=[], now=NOW)
    assert [r.group_resource for r in first.requests] == ["configmaps", "secrets"]
    states = _apply([], first.plan.actions, 1)
    # run-migrations: each request starts after its state recorded the hash, and succeeds.
    done = [
        succeeded(f"{r.group_resource}-init", r.resource, target=r.storage_version_hash, started=NOW + MIN)
        for r in first.requests
    ]

    closing = plan_poll(observed(states=states, existing=done), settings, now=NOW + 3 * MIN)  # run-migrations' poll
    assert closing.of_kind(CreateMigration) == []
    assert {a.name: a.refined_by for a in closing.of_kind(UpdateState)} == {
        "configmaps": "configmaps-init",
        "secrets": "secrets-init",
    }
    states = _apply(states, closing.actions, 2)
    assert {s.metadata.name: s.status.persisted_storage_version_hashes for s in states} == {
        "configmaps": [hash_of("configmaps")],
        "secrets": [SECRETS],
    }

    later = observed(states=states, existing=done)
    after = plan_poll(later, settings, now=NOW + 13 * MIN)
    by_name = {s.metadata.name: s for s in states}
    assert [a.kind for a in after.actions] == ["UpdateState", "UpdateState"]
    assert all(is_heartbeat(a, by_name[a.name]) for a in after.of_kind(UpdateState))

    # configmaps' storage version changes: exactly one more migration, for it alone.
    moved = [
        r.model_copy(update={"storage_version_hash": "newHash456="}) if r.group_resource == "configmaps" else r
        for r in realistic_discovery()
    ]
    changed = plan_poll(observed(discovered=moved, states=states, existing=done), settings, now=NOW + 23 * MIN)
    assert [(a.group_resource, a.target_hash) for a in changed.of_kind(CreateMigration)] == [
        ("configmaps", "newHash456=")
    ]
    assert changed.of_kind(DeleteMigration) == []


def test_a_heartbeat_is_a_write_of_nothing_else() -> None:
    old = known(SECRETS, [SECRETS])
    update = UpdateState(
        name="secrets",
        resource_version="5",
        current_hash=SECRETS,
        persisted=[SECRETS],
        heartbeat=NOW,
        annotations=dict(old.metadata.annotations or {}),
        reason="heartbeat",
        switch_resource_version=old.status.current_hash_resource_version,
    )
    assert is_heartbeat(update, old)
    assert not is_heartbeat(update, None), "a state not read yet is created, not beaten"
    assert not is_heartbeat(update.model_copy(update={"persisted": [UNKNOWN]}), old)
    assert not is_heartbeat(update.model_copy(update={"current_hash": OLD}), old)
    assert not is_heartbeat(update.model_copy(update={"annotations": {}}), old)
    # Issue 36: recording the switch's resourceVersion (again) is a change, not a heartbeat.
    assert not is_heartbeat(update.model_copy(update={"switch_resource_version": None}), old)
    ref = GroupVersionResource(group="", version="v1", resource="secrets")
    assert not is_heartbeat(update.model_copy(update={"record_switch": ref}), old)
