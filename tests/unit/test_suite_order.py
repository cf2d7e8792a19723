"""The suite's order (tests/conftest.py SLOWEST_FIRST): a renamed file would silently fall back
to xdist handing it out last, which is how the suite once ran past its 10 minutes (stop 33)."""

from __future__ import annotations

from pathlib import Path

from conftest import SLOWEST_FIRST

INTEGRATION = Path(__file__).resolve().parents[1] / "integration"


def test_every_file_named_slowest_first_is_a_test_file_of_the_integration_tier() -> None:
    missing = [name for name in SLOWEST_FIRST if not (INTEGRATION / name).is_file()]
    assert not missing, f"SLOWEST_FIRST names files that are not in tests/integration: {missing}"
    assert len(set(SLOWEST_FIRST)) == len(SLOWEST_FIRST), "a file named twice"
