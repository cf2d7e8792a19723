"""The CPU of entering "one try per Prefect call" (tasks/single_try.py), which every chunk of a
migration pays once for its progress artifact (flows/best_effort.py), against the baseline
measured in the same run: Prefect's `temporary_settings` with the same update, which the code
used before (it builds and validates a whole settings object each time).

    uv run python -m bench.single_try [--uses 500] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

from prefect.settings import PREFECT_CLIENT_MAX_RETRIES, temporary_settings

from tasks.single_try import single_try


def cpu_ms_per_use(enter: Callable[[], AbstractContextManager[object]], uses: int) -> float:
    started = time.process_time()
    for _ in range(uses):
        with enter():
            pass
    return (time.process_time() - started) / uses * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uses", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    before, now = [], []
    for _ in range(args.repeat):  # interleaved: the machine's load falls on both alike
        before.append(cpu_ms_per_use(lambda: temporary_settings({PREFECT_CLIENT_MAX_RETRIES: 0}), args.uses))
        now.append(cpu_ms_per_use(single_try, args.uses))
    b, n = statistics.median(before), statistics.median(now)
    print(f"temporary_settings (baseline): {b:.2f} ms CPU per use (runs: {', '.join(f'{x:.2f}' for x in before)})")
    print(f"single_try:                    {n:.3f} ms CPU per use (runs: {', '.join(f'{x:.3f}' for x in now)})")
    print(f"ratio single_try / baseline:   {n / b:.4f}")


if __name__ == "__main__":
    main()
