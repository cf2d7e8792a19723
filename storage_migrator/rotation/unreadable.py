"""What an API server's refusal to read a resource says about objects it can no longer decrypt.

Design decision (issue 39): the keys an EncryptionConfiguration holds are not
observable through the API. A server reports only the file's hash on /metrics
(agreement/server_configs.py), and never a key's name; etcd holds each value's key
name (rotation/etcd_values.py), but a rotation does not read etcd. What *is*
observable is the effect of a missing key: an object stored under a key the
servers' configuration no longer holds cannot be read, and the API server says
so when asked to LIST it. kube-apiserver v1.36 (KEP-3926, `AllowUnsafeMalformedObjectDeletion`,
beta and on by default; apiserver storage/etcd3 `corruptObjErrAggregator`) reads
on past such values and answers 500 ``StorageReadError`` with one
``details.causes`` entry per value, its ``field`` the value's etcd key, at most
100 and then a ``FieldValueTooMany`` cause. Older servers, or that gate turned
off, answer 500 ``InternalError`` ``unable to transform key "<key>": ...`` at
the first one. Either answer is the loss, with the objects it names.

Only names are kept (namespace/name, from the etcd key): never the message
beyond the key (DESIGN 8). Pure functions; the read is tasks/reading_check.py's.
"""

from __future__ import annotations

import re
from typing import Final

from pydantic import BaseModel, ConfigDict, Field

from storage_migrator.kube.errors import KubeError

__all__ = ["STORE_READ_ERROR", "Unreadable", "unreadable_objects"]

#: metav1.StatusReasonStoreReadError's value on the wire.
STORE_READ_ERROR: Final = "StorageReadError"
#: The cause kube-apiserver appends after the 100th key (metav1.CauseTypeTooMany).
_TOO_MANY: Final = "FieldValueTooMany"
#: How kube-apiserver words one value it cannot transform (etcd3 store: `unable to transform key %q: %w`).
_TRANSFORM = re.compile(r"""unable to transform key [\"']([^\"']+)[\"']""")
#: Words of an InternalError that is about a value that cannot be decrypted (not a passing fault).
_UNDECRYPTABLE = ("unable to transform key", "no matching prefix found", "corrupt object")
#: Objects named in a verdict.
NAMED: Final = 10


class Unreadable(BaseModel):
    """Objects of one resource that the API servers cannot read: how many, and which."""

    model_config = ConfigDict(frozen=True)

    objects: list[str] = Field(default_factory=list, description="``namespace/name`` of each one named.")
    more: bool = Field(
        default=False,
        description="The server named no more than it could: 100 and more (truncated), or only the first it met.",
    )

    @property
    def count(self) -> int:
        return len(self.objects)

    def describe(self) -> str:
        """``3 object(s)``, ``more than 100 object(s)``, ``at least 1 object(s)``."""
        if not self.objects:
            return "one or more object(s) (the API server did not name them)"
        if not self.more:
            return f"{self.count} object(s)"
        return f"more than {self.count} object(s)" if self.count >= 100 else f"at least {self.count} object(s)"

    def named(self) -> str:
        """The first of them, for a message: ``ns/a, ns/b and 3 more``."""
        shown = ", ".join(self.objects[:NAMED])
        rest = self.count - NAMED
        return f"{shown} and {rest} more" if rest > 0 else shown


def _object_name(key: str, resource: str) -> str:
    """``ns/name`` from an etcd key such as ``/registry/secrets/ns/name`` (whatever the etcd prefix)."""
    marker = f"/{resource}/"
    at = key.rfind(marker)
    return key[at + len(marker) :] if at >= 0 else key.rsplit("/", 2)[-2] + "/" + key.rsplit("/", 1)[-1]


def unreadable_objects(exc: KubeError, *, resource: str) -> Unreadable | None:
    """The objects of ``resource`` (its plural) a failed read says cannot be decrypted, or None when
    the failure is about something else (a passing fault, a permission, ...)."""
    if exc.code != 500:
        return None
    status = exc.status_object or {}
    causes = (status.get("details") or {}).get("causes") or []
    if exc.reason == STORE_READ_ERROR:
        keys = [str(c.get("field")) for c in causes if c.get("field")]
        truncated = any(c.get("reason") == _TOO_MANY for c in causes)
        names = list(dict.fromkeys(_object_name(k, resource) for k in keys))
        return Unreadable(objects=names, more=truncated or not names)
    if exc.reason == "InternalError" and any(words in exc.message for words in _UNDECRYPTABLE):
        found = _TRANSFORM.search(exc.message)
        return Unreadable(objects=[_object_name(found.group(1), resource)] if found else [], more=True)
    return None
