"""One cluster of three API servers for all the tests of a module (issue 29), as a pytest plugin.

A test module that borrows it names this module in its `pytest_plugins` (and never
imports it, so that pytest can load it as a plugin). What a test may rely on, and
what is put back after it: rotation_fixtures.SharedThreeServers.

Per module, not per session: starting one costs about 0.5 s of CPU (etcd, three
servers, the CRDs), while one left idle costs about 0.8 s a minute (etcd, and each
server polling its file every 0.2 s); a session-wide one would idle through the rest
of its pytest-xdist worker's files to save one start.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from rotation_fixtures import SharedThreeServers


@pytest.fixture(scope="module")
def three_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedThreeServers]:
    """The module's cluster of three API servers, started when a test first borrows it."""
    shared = SharedThreeServers(tmp_path_factory.mktemp("three-servers"))
    try:
        yield shared
    finally:
        shared.stop()
