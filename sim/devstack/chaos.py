"""The chaos the CI test and `bench/chaos.py` inflict on a migration, and the verdict read from etcd.

Issue 13, "Chaos campaigns": "Faults on 20% of requests (5xx, 429 with
Retry-After, dropped connections, latency), etcd compacted every few seconds
(expired continue tokens), and writers creating, updating and deleting objects
throughout: the migration ends `Succeeded`, every surviving object is
re-encoded in etcd, no writer's update is lost, no object's content changed."

The faults hit the migrator's verbs only (`list`, `patch`): the writers stand for
the cluster's other users, and their own requests (`get`, `update` with a
resourceVersion precondition, `create`, `delete`) must have a known outcome, or
"the last value it wrote" would not be known. Each writer owns its objects, so
that last value is what etcd must hold at the end. The verdict reads etcd, never
the flow's own report (DESIGN 8).
"""

from __future__ import annotations

import base64
import json
import random
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from kubernetes import client as k8s
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from kubesim.admin import Admin
from kubesim.codec import Stored, decode
from kubesim.etcd import EtcdStore, prefix_end

Resource = Literal["configmaps", "secrets"]
Data = dict[str, str]

#: How the 20% of faulty requests are shared: (share, rule without verb/resource/rate).
FAULT_KINDS: tuple[tuple[float, dict[str, Any]], ...] = (
    (0.20, {"code": 500}),
    (0.15, {"code": 503}),
    (0.15, {"code": 429, "retry_after": 1}),  # a Status with details.retryAfterSeconds
    (0.10, {"code": 429, "retry_after": 1, "shape": "plain"}),  # priority-and-fairness' plain text
    (0.20, {"drop": True}),
    (0.20, {"latency": 0.2}),  # answered normally, late
)


def fault_mix(resource: str, *, rate: float = 0.2, verbs: Sequence[str] = ("list", "patch"),
              retry_after: int = 1, latency: float = 0.2) -> list[dict[str, Any]]:  # fmt: skip
    """kubesim fault rules hitting `rate` of the `verbs` requests on `resource`, spread over FAULT_KINDS.

    kubesim tries the rules in order, each with its own probability, so rule k gets
    p_k / (1 - p_1 - ... - p_k-1): the kinds then add up to exactly `rate`.
    """
    rules: list[dict[str, Any]] = []
    for verb in verbs:
        taken = 0.0
        for share, kind in FAULT_KINDS:
            p = rate * share
            rule = {**kind, "verb": verb, "resource": resource, "rate": min(1.0, p / (1.0 - taken))}
            if "retry_after" in rule:
                rule["retry_after"] = retry_after
            if "latency" in rule:
                rule["latency"] = latency
            rules.append(rule)
            taken += p
    return rules


class Compactor(threading.Thread):
    """Compacts etcd every `period` seconds (kubesim's admin API): continue tokens expire."""

    def __init__(self, admin: Admin, *, period: float = 2.0) -> None:
        super().__init__(daemon=True, name="compactor")
        self.admin, self.period = admin, period
        self.stop = threading.Event()
        self.compactions = 0
        self.errors: list[str] = []

    def run(self) -> None:
        while not self.stop.wait(self.period):
            try:
                self.admin.compact()
                self.compactions += 1
            except Exception as exc:  # noqa: BLE001 - counted; a campaign goes on
                self.errors.append(repr(exc))

    def __enter__(self) -> Compactor:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.join(timeout=30)


def encode_data(resource: Resource, data: Data) -> Data:
    """The API's `data` for these values: a Secret's are base64."""
    if resource == "secrets":
        return {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    return dict(data)


class Writers:
    """`count` threads creating, updating and deleting objects of `resource` in `namespace`.

    Writer w owns `names[w::count]` and the objects it creates (`w<w>-new-<k>`).
    `expected[name]` is the API `data` of its last successful write, None once
    it deleted the object; names never written are absent (their seeded value
    must stand). An update is a GET then a PUT with the object's
    resourceVersion: a 409 (the migrator or the compaction raced it) means nothing
    was written, and it reads again.
    """

    def __init__(self, api: ApiClient, *, resource: Resource, namespace: str, names: Sequence[str], count: int = 3,
                 pause: float = 0.01, seed: int = 13) -> None:  # fmt: skip
        self.api, self.resource, self.namespace, self.pause = api, resource, namespace, pause
        self.kind = "ConfigMap" if resource == "configmaps" else "Secret"
        self._method = "config_map" if resource == "configmaps" else "secret"
        self.core = k8s.CoreV1Api(api)
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.expected: dict[str, Data | None] = {}
        self.ops: Counter[str] = Counter()
        self.errors: list[str] = []
        self.threads = [
            threading.Thread(
                target=self._guard, args=(w, list(names[w::count]), seed + w), daemon=True, name=f"writer-{w}"
            )
            for w in range(count)
        ]

    def _call(self, verb: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        fn = getattr(self.core, f"{verb}_namespaced_{self._method}")
        resp = fn(*args, _preload_content=False, **kwargs)
        return dict(json.loads(resp.data))

    def _record(self, name: str, data: Data | None, op: str) -> None:
        with self.lock:
            self.expected[name] = data
            self.ops[op] += 1

    def _guard(self, w: int, owned: list[str], seed: int) -> None:
        try:
            self._write(w, owned, random.Random(seed))
        except Exception as exc:  # noqa: BLE001 - reported by the verdict
            with self.lock:
                self.errors.append(f"writer {w}: {exc!r}")

    def _write(self, w: int, live: list[str], rng: random.Random) -> None:
        i = 0
        while not self.stop.wait(self.pause):
            i += 1
            roll = rng.random()
            if roll < 0.15 or not live:
                name = f"w{w}-new-{i:06d}"
                data = encode_data(self.resource, {"v": f"w{w}-created-{i}"})
                body = {"apiVersion": "v1", "kind": self.kind, "metadata": {"name": name}, "data": data}
                self._call("create", self.namespace, body)
                live.append(name)
                self._record(name, data, "creates")
            elif roll < 0.30:
                name = live.pop(rng.randrange(len(live)))
                self._call("delete", name, self.namespace)
                self._record(name, None, "deletes")
            else:
                name = rng.choice(live)
                data = encode_data(self.resource, {"v": f"w{w}-updated-{i}"})
                self._update(name, data)

    def _update(self, name: str, data: Data) -> None:
        while True:
            obj = self._call("read", name, self.namespace)
            obj["data"] = data
            try:
                self._call("replace", name, self.namespace, obj)
            except ApiException as exc:
                if exc.status != 409:
                    raise
                with self.lock:
                    self.ops["conflicts"] += 1
                continue
            self._record(name, data, "updates")
            return

    def __enter__(self) -> Writers:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)


def stored_objects(store: EtcdStore, prefix: str, *, read_keys: Sequence[str] | Mapping[str, bytes] = ()) -> Iterator[
        tuple[str, Stored]]:  # fmt: skip
    """(name, decoded value) of every key under `prefix`, read from etcd page by page."""
    start = prefix.encode()
    end = prefix_end(start)
    while True:
        page = store.range(start, end, limit=2_000)  # a gRPC answer is at most 4 MB
        for kv in page.kvs:
            yield kv.key.decode().rsplit("/", 1)[1], decode(kv.value, read_keys=read_keys)
        if not page.more:
            return
        start = page.kvs[-1].key + b"\0"


@dataclass
class Verdict:
    """One campaign's figures, all read from etcd (plus the writers' own record)."""

    campaign: str
    seeded: int
    surviving: int = 0
    reencoded: int = 0
    missed: int = 0
    lost_updates: int = 0
    changed: int = 0
    writer_errors: int = 0
    succeeded: bool | None = None  # the request's Succeeded condition (None: not asked)
    notes: list[str] = field(default_factory=list)
    examples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        clean = self.missed == 0 and self.lost_updates == 0 and self.changed == 0 and self.writer_errors == 0
        return clean and self.succeeded is not False

    @property
    def verdict(self) -> str:
        return "PASS" if self.ok else "FAIL"


def judge(campaign: str, objects: Iterator[tuple[str, Stored]], *, seeded: Mapping[str, Data],
          written: Mapping[str, Data | None], current: Callable[[Stored], bool],
          writer_errors: int = 0) -> Verdict:  # fmt: skip
    """Compare what etcd holds with what it must hold.

    missed: a surviving object not in the new encoding (`current`); lost: an object
    a writer wrote last whose value is not that write (or a deleted one back, or
    a created one gone); changed: an object no writer touched whose data is not
    its seeded value, or gone, or one nobody created.
    """
    verdict = Verdict(campaign=campaign, seeded=len(seeded), writer_errors=writer_errors)
    found: set[str] = set()

    def bad(kind: str, name: str) -> None:
        if len(verdict.examples) < 10:
            verdict.examples.append(f"{kind}: {name}")

    for name, value in objects:
        found.add(name)
        verdict.surviving += 1
        if current(value):
            verdict.reencoded += 1
        else:
            verdict.missed += 1
            bad("missed", name)
        data = value.obj.get("data") or {}
        if name in written:
            if written[name] != data:
                verdict.lost_updates += 1
                bad("lost update", name)
        elif name not in seeded or seeded[name] != data:
            verdict.changed += 1
            bad("changed", name)
    for name in set(seeded) | set(written):
        if name in found:
            continue
        if name in written and written[name] is not None:
            verdict.lost_updates += 1
            bad("lost (gone)", name)
        elif name not in written:
            verdict.changed += 1
            bad("vanished", name)
    return verdict


def _request(succeeded: bool | None) -> str:
    return "-" if succeeded is None else ("Succeeded" if succeeded else "not Succeeded")


def markdown(verdicts: Sequence[Verdict]) -> str:
    """The report's table, one row per campaign."""
    lines = [
        "| campaign | seeded | surviving | re-encoded | missed | lost writer updates | changed contents "
        "| request | verdict |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for v in verdicts:
        lines.append(f"| {v.campaign} | {v.seeded} | {v.surviving} | {v.reencoded} | {v.missed} | {v.lost_updates} "
                     f"| {v.changed} | {_request(v.succeeded)} | {v.verdict} |")  # fmt: skip
    return "\n".join(lines)
