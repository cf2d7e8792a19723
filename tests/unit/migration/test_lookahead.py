"""The page asked for ahead (storage_migrator.migration.lookahead), without a cluster.

Issue 13: "the next page's continue token is known as soon as the LIST returns";
DESIGN 4.5: "a crash re-does at most one chunk and never skips an object". A page
asked for ahead is handed only to a chunk starting from the same token, once; a
LIST ahead that failed is forgotten so the chunk LISTs again with its own retries.
"""

from __future__ import annotations

import threading

from storage_migrator.kube.listing import ListPage
from storage_migrator.migration.lookahead import PageAhead


def page(token: str | None) -> ListPage:
    return ListPage(kind="PartialObjectMetadataList", items=[{"metadata": {"name": "a"}}], continue_token=token)


def test_the_page_is_handed_once_to_the_chunk_starting_from_its_token() -> None:
    ahead = PageAhead()
    ahead.start("t1", lambda: (page("t2"), 0))
    taken = ahead.take("t1")
    assert taken is not None
    assert taken[0].continue_token == "t2"
    assert ahead.take("t1") is None  # handed once: a retried chunk LISTs again


def test_another_token_gets_nothing_and_the_page_is_dropped() -> None:
    ahead = PageAhead()
    ahead.start("t1", lambda: (page(None), 0))
    assert ahead.take(None) is None  # a new pass from the beginning
    assert ahead.take("t1") is None


def test_take_waits_for_a_list_still_in_flight() -> None:
    release = threading.Event()

    def slow() -> tuple[ListPage, int]:
        release.wait(5)
        return page(None), 1

    ahead = PageAhead()
    ahead.start("t1", slow)
    threading.Timer(0.05, release.set).start()
    taken = ahead.take("t1")
    assert taken is not None
    assert taken[1] == 1


def test_a_failed_list_ahead_is_forgotten() -> None:
    def failing() -> tuple[ListPage, int]:
        raise RuntimeError("connection reset")

    ahead = PageAhead()
    ahead.start("t1", failing)
    assert ahead.take("t1") is None


def test_forget_drops_the_page() -> None:
    ahead = PageAhead()
    ahead.start("t1", lambda: (page(None), 0))
    ahead.forget()
    assert ahead.take("t1") is None
