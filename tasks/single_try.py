"""Prefect calls tried once, without the client's retries (2 + 4 + 8 + 16 + 32 s): those a
migration can do without (issue 31: artifacts, labels, a lease of a silent budget).

Design decision: Prefect's `temporary_settings` builds and validates a whole new settings
object each time (its sources read the environment and stat the settings files): 20-40 ms
of CPU, paid per chunk by the progress artifact; 7% of an in-process rotation's CPU in the
tests. The settings without retries are made once per settings object and entered as a
context, which is what `temporary_settings` does after building them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from prefect.context import SettingsContext, get_settings_context
from prefect.settings import PREFECT_CLIENT_MAX_RETRIES, Settings

#: (the settings in force, the same without retries): the last pair made. Threads that make one
#: at once each make a right one; the last stays.
_LAST: tuple[Settings, Settings] | None = None


def _without_retries(current: Settings) -> Settings:
    global _LAST
    last = _LAST
    if last is not None and last[0] is current:
        return last[1]
    derived = current.copy_with_update(updates={PREFECT_CLIENT_MAX_RETRIES: 0})
    _LAST = (current, derived)
    return derived


@contextmanager
def single_try() -> Iterator[None]:
    """Inside the block, each Prefect client request is sent once: an unreachable server fails it at once."""
    context = get_settings_context()
    with SettingsContext(profile=context.profile, settings=_without_retries(context.settings)):
        yield
