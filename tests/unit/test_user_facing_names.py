"""Every name a user types or reads is fully qualified (issue 9, item 4).

The in-tree `storagemigration.k8s.io` API has a resource of the same plural and
kind as ours and wins a bare `kubectl get storageversionmigrations`: "no
document tells a user to type a bare `storageversionmigrations`". This test
reads every document and every source file for kubectl command lines and
user-facing messages that name our resources without their group. A line that
shows the bare form on purpose (to say it resolves to the in-tree API) says so.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from storage_migrator.models import MIGRATIONS_KIND_NAME, STATES_KIND_NAME

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "scripts").glob("*")),
    *sorted(p for d in ("storage_migrator", "flows", "tasks") for p in (ROOT / d).rglob("*.py")),
    ROOT / "prefect.yaml",
]
# A lowercase resource name (singular or plural, optionally `/name`) not followed by its group.
BARE = re.compile(
    r"(?<![.\w])storage(?:versionmigration|state)s?\b(?!\.(?:storage)?migration\.k8s\.io)(?![\w.-]*\.(?:py|md))"
)
# Where a name is an identifier, a path segment or a Python name, not something typed.
NOT_TYPED = re.compile(r"(/apis/|resources?: \[|plural|STORAGE_|_KIND_NAME|import |def |\w_storage)")
ON_PURPOSE = "in-tree"


def _offending_lines(path: Path, root: Path = ROOT) -> list[str]:
    out = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        user_facing = "kubectl" in line or re.search(r"""f?["'].*\bstorage(versionmigration|state)s?\b""", line)
        if not user_facing or ON_PURPOSE in line or NOT_TYPED.search(line):
            continue
        if BARE.search(line):
            out.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    return out


def test_the_qualified_names_are_what_kubectl_expects() -> None:
    assert MIGRATIONS_KIND_NAME == "storageversionmigrations.migration.k8s.io"
    assert STATES_KIND_NAME == "storagestates.migration.k8s.io"


@pytest.mark.parametrize(
    ("line", "caught"),
    [
        ("kubectl get storageversionmigrations", True),
        ("kubectl wait --for=condition=Succeeded storageversionmigration/x", True),
        ("kubectl delete storagestates --all", True),
        ('raise ValueError(f"storageversionmigration {name} not found")', True),
        ("kubectl get storageversionmigrations.migration.k8s.io", False),
        ("kubectl wait storageversionmigrations.migration.k8s.io/x", False),
        ("kubectl get storageversionmigrations   # the in-tree API", False),
    ],
)
def test_the_check_catches_a_bare_name(line: str, caught: bool, tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(f"```\n{line}\n```\n")
    assert bool(_offending_lines(doc, root=tmp_path)) is caught


def test_no_document_or_message_names_our_resources_without_their_group() -> None:
    offending = [hit for path in SOURCES if path.is_file() for hit in _offending_lines(path)]
    assert not offending, "type the full name (storageversionmigrations.migration.k8s.io):\n" + "\n".join(offending)
