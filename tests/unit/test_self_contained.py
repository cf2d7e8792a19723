"""A clone with nothing beside it passes its tests (issue 36, item 6).

The recordings of a real kube-apiserver the tests read are copied into `tests/reference/`;
no test, nor kubesim, builds a path to the `shared/` folder beside the repository.
"""

from __future__ import annotations

import re
from pathlib import Path

from recorded import REFERENCE

ROOT = Path(__file__).resolve().parents[2]
#: A path built to ../shared: `... / "shared"` or a string starting "../shared".
OUTSIDE = re.compile(r"""/\s*["']shared["']|["']\.\./shared""")


def test_no_test_nor_kubesim_reads_the_folder_beside_the_repository() -> None:
    offenders = [
        str(path.relative_to(ROOT))
        for top in ("tests", "sim", "bench", "scripts")
        for path in (ROOT / top).rglob("*.py")
        if path != Path(__file__).resolve() and OUTSIDE.search(path.read_text())
    ]
    assert offenders == []


def test_the_recordings_are_in_the_repository() -> None:
    names = {p.name for p in REFERENCE.iterdir()}
    assert {"README.md", "discovery-api-v1.json", "svm-succeeded.json", "crd-protected-group-422.json"} <= names
