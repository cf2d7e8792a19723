"""The registry's WATCH: etcd's events on a prefix, as the API server's events.

Apart from the read path because it streams: an initial LIST (and the
`initial-events-end` bookmark of `sendInitialEvents`), then each etcd event
decoded, served and filtered, an object that stops matching the selector
answering DELETED, as the watch cache does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from kubesim.errors import StatusError
from kubesim.etcd import Compacted
from kubesim.etcd import WatchEvent as EtcdEvent
from kubesim.registry_core import storage_group_resource
from kubesim.registry_reads import RegistryReads
from kubesim.resources import ResourceType


@dataclass(frozen=True)
class WatchEvent:
    type: str
    obj: dict[str, Any]


class RegistryWatch(RegistryReads):
    """WATCH, starting from a LIST of the read path when asked to."""

    def watch(
        self,
        rt: ResourceType,
        version: str,
        namespace: str | None,
        *,
        resource_version: str | None,
        predicate: Callable[[dict[str, Any]], bool],
        send_initial: bool,
    ) -> tuple[Iterator[WatchEvent | None], Callable[[], None]]:
        """Events from `resource_version` on; None items are keep-alive ticks."""
        prefix = rt.list_prefix(namespace)
        initial: list[dict[str, Any]] = []
        if send_initial or resource_version in (None, "", "0"):
            listed = self.list(rt, version, namespace, predicate=predicate)
            initial = listed.items
            start = int(listed.resource_version) + 1
        else:
            assert resource_version is not None
            start = int(resource_version) + 1
        events, cancel = self.etcd.watch(prefix, start_revision=start)
        gr = storage_group_resource(rt)

        def stream() -> Iterator[WatchEvent | None]:
            for obj in initial:
                yield WatchEvent("ADDED", obj)
            if send_initial:
                bookmark = {
                    "apiVersion": rt.group_version(version),
                    "kind": rt.kind,
                    "metadata": {
                        "resourceVersion": str(start - 1),
                        "annotations": {"k8s.io/initial-events-end": "true"},
                    },
                }
                yield WatchEvent("BOOKMARK", bookmark)
            for batch in events:
                if isinstance(batch, Compacted):
                    yield WatchEvent(
                        "ERROR",
                        StatusError(410, "Expired", f"too old resource version: {start - 1}", details={}).body(),
                    )
                    return
                if isinstance(batch, Exception):
                    return
                if not batch:
                    yield None
                    continue
                for ev in batch:
                    event = self._watch_event(rt, version, gr, ev, predicate)
                    if event is not None:
                        yield event

        return stream(), cancel

    def _watch_event(
        self,
        rt: ResourceType,
        version: str,
        gr: str,
        ev: EtcdEvent,
        predicate: Callable[[dict[str, Any]], bool],
    ) -> WatchEvent | None:
        """One etcd event as the watcher sees it; None when the object neither matches nor matched."""
        if ev.type == "DELETE":
            if ev.prev is None:
                return None
            obj = self.served(rt, version, self._decode(ev.prev, gr).obj, ev.kv.mod_revision)
            return WatchEvent("DELETED", obj) if predicate(obj) else None
        obj = self.served(rt, version, self._decode(ev.kv, gr).obj, ev.kv)
        now_match = predicate(obj)
        was_match = False
        if ev.prev is not None:
            prev = self.served(rt, version, self._decode(ev.prev, gr).obj, ev.prev)
            was_match = predicate(prev)
        if now_match:
            return WatchEvent("MODIFIED" if ev.prev is not None and was_match else "ADDED", obj)
        if was_match:
            return WatchEvent("DELETED", obj)
        return None
