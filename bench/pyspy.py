"""Sampling this process with py-spy while a pass runs, and the top of what it saw.

For bench/client_cpu.py `--profile PASS`: py-spy (`uv pip install py-spy`, not a
dependency) attaches to this process for the chosen pass only, samples every
thread (cProfile sees only the thread that enabled it, and the writes run on a
pool) while they hold the GIL (`--gil`: Python's own CPU; a thread blocked in
a TLS read counts as busy otherwise), and leaves collapsed stacks (`--format raw`). `summary` prints the
functions where the samples were (self) and those under which they were
(inclusive, each counted once per sample), as shares of all samples.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["sampled", "summary"]


@contextmanager
def sampled(out: Path, *, rate: int = 250) -> Iterator[None]:
    """py-spy attached to this process while the block runs; stacks written to `out`."""
    exe = shutil.which("py-spy")
    if exe is None:
        raise SystemExit("--profile needs py-spy: uv pip install py-spy")
    spy = subprocess.Popen([exe, "record", "--pid", str(os.getpid()), "--rate", str(rate), "--format", "raw",
                            "--gil", "--output", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    time.sleep(1.0)  # attached before the pass starts
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)
        spy.wait(timeout=60)


def _frames(line: str) -> tuple[list[str], int]:
    stack, _, count = line.rpartition(" ")
    # "func (path/to/file.py:123)" -> "func (file.py)": lines of one function together
    frames = []
    for frame in stack.split(";"):
        name, _, where = frame.partition(" (")
        frames.append(f"{name} ({Path(where.split(':')[0]).name})" if where else name)
    return frames, int(count)


def summary(out: Path, *, top: int = 25) -> str:
    """The `top` functions by self and by inclusive share of the samples."""
    own: Counter[str] = Counter()
    under: Counter[str] = Counter()
    total = 0
    for line in out.read_text().splitlines():
        if not line.strip():
            continue
        frames, count = _frames(line)
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            under[frame] += count
    rows = [f"{total} samples (all threads, holding the GIL)", f"{'self':>6}  function"]
    rows += [f"{100 * n / total:5.1f}%  {name}" for name, n in own.most_common(top)]
    rows += ["", f"{'incl.':>6}  function"]
    rows += [f"{100 * n / total:5.1f}%  {name}" for name, n in under.most_common(top)]
    return "\n".join(rows)
