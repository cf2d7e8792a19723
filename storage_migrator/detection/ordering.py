"""Which migration came after a storage switch: ordered by resourceVersion, not by the clock.

Design decision (issue 36, item 5): a StorageState may be refined to
``[current]`` only by a migration that rewrote every object written before the
switch to the current hash was recorded. Timestamps cannot say so: they are cut
to whole seconds (``metav1.Time``) and come from two machines' clocks, so a
migration that began listing up to a second (plus skew) before the switch was
recorded counted as proof. resourceVersions are one order, etcd's:

- when detection records a switch, it reads the resource's list resourceVersion
  (a LIST with limit 1), after discovery showed the new hash
  (``status.currentHashResourceVersion``);
- a migration records the list resourceVersion of its pass's first LIST
  (our ``status.resourceVersion``; the in-tree controller's
  ``status.resourceVersion``, read the same way when it starts);
- the migration proves the switch only when its resourceVersion is greater:
  its LIST saw every object that existed at the switch, and each was rewritten
  after the API servers wrote the new version.

resourceVersions are compared as integers: SIG Architecture approved it for
this API's GA (kubernetes/kubernetes#126521), and etcd's revisions are what
every kube-apiserver answers. One that does not parse is never guessed at, and
never replaced by the timestamps: no refinement, and the reason says why.
Equal is not later: two reads at one revision saw the same objects, but which
came first is not known. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Coverage", "covers", "revision"]


def revision(resource_version: str | None) -> int | None:
    """The resourceVersion as an integer; None when absent or not a non-negative integer."""
    text = (resource_version or "").strip()
    if not text.isdigit():
        return None
    return int(text)


@dataclass(frozen=True)
class Coverage:
    """Whether a migration came after a switch, and, when that cannot be told, why."""

    after: bool
    unknown: str | None = None


def covers(migrated_from: str | None, switch: str | None) -> Coverage:
    """Whether a migration whose first LIST was at ``migrated_from`` came after ``switch``.

    ``unknown`` says why it cannot be told (a value missing or not an integer);
    a migration that merely came first is ``after=False`` with no ``unknown``.
    """
    if not switch:
        return Coverage(after=False, unknown="the state recorded no resourceVersion for its current hash")
    at_switch = revision(switch)
    if at_switch is None:
        return Coverage(after=False, unknown=f"the state's resourceVersion {switch!r} is not an integer")
    if not migrated_from:
        return Coverage(after=False, unknown="it recorded no list resourceVersion (it began before they were recorded)")
    at_list = revision(migrated_from)
    if at_list is None:
        return Coverage(after=False, unknown=f"its list resourceVersion {migrated_from!r} is not an integer")
    return Coverage(after=at_list > at_switch)
