"""Where the tests read what a real kube-apiserver v1.36.2 answered.

`tests/reference/` is a copy of the recordings in `../shared/reference/` (its README says
what each file shows), kept in the repository so that a clone with nothing beside it
passes its tests (issue 36, item 6). Where kubesim answers differently, kubesim is wrong.
"""

from __future__ import annotations

from pathlib import Path

REFERENCE = Path(__file__).resolve().parent / "reference"
