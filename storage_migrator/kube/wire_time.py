"""Times as the API server writes them: metav1.Time and metav1.MicroTime.

One parser for every object we read a time from (Leases, in-tree migrations' conditions
and managedFields): a value we cannot read is None, never an error, since a time only
informs a decision (an expiry, an order) and the decision then treats it as unknown.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

__all__ = ["micro_time", "parse_time"]


def parse_time(value: Any) -> datetime | None:
    """metav1.MicroTime (``2026-11-22T03:58:21.123456Z``) or a plain RFC 3339 time; None if absent or unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def micro_time(moment: datetime) -> str:
    """metav1.MicroTime: RFC 3339 in UTC with microseconds."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
