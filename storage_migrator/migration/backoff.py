"""How long to wait before trying a transient failure again.

Design decision (STYLE "server hints win", DESIGN 4.5): a `Retry-After` the
server sent (header first, then the Status's `details.retryAfterSeconds`, both
already folded into `KubeError.retry_after`) is obeyed as is; otherwise
exponential backoff with full jitter (a random delay between half and all of
`base * 2**attempt`, capped), so that many workers throttled at once do not
come back in step. Attempts are bounded by the caller: upstream's migrator
retried forever (its issue #83).
"""

from __future__ import annotations

import random

from storage_migrator.kube.errors import KubeError

__all__ = ["retry_delay"]
#: Jitter draws from a generator of its own: writer threads must not move the
#: process-wide `random` state (test frameworks that seed it notice).
_JITTER = random.Random()

#: Longest Retry-After we obey; a larger hint is capped so that a run cannot stall for hours.
MAX_SERVER_HINT_SECONDS = 300.0


def retry_delay(
    error: BaseException,
    *,
    attempt: int,
    base: float,
    cap: float,
    rng: random.Random | None = None,
) -> float:
    """Seconds to wait before attempt number ``attempt + 1`` (``attempt`` counts from 0)."""
    hint = error.retry_after if isinstance(error, KubeError) else None
    if hint is not None and hint >= 0:
        return min(float(hint), MAX_SERVER_HINT_SECONDS)
    # 2**attempt overflows a float past attempt 1023; any attempt past 64 is at the cap anyway.
    ceiling = min(cap, base * (2.0 ** min(attempt, 64)))
    return (rng or _JITTER).uniform(ceiling / 2, ceiling)
