#!/usr/bin/env bash
# The whole test run: lint, types, import layers, then every test tier.
# Usage: bash scripts/test.sh [pytest args]
#
# Without arguments the tests run in two lanes at once: the e2e tier (Prefect
# servers and workers of its own; its time is mostly spent waiting for flow runs
# to start) beside everything else, which pytest-xdist splits over two workers by
# file. Each lane, and each worker, is a pytest session with its own etcd,
# kubesim and Prefect server: most tests wait on servers and flow runs, so three
# sessions share the 2 cores CI has. With arguments, one pytest run takes them.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh

echo "== ruff"
uv run ruff check .
uv run ruff format --check .
echo "== mypy"
uv run mypy
echo "== import layers"
uv run lint-imports
echo "== pytest"
if [ "$#" -gt 0 ]; then
    exec uv run pytest "$@"
fi

e2e_log=$(mktemp -t storage-migrator-e2e.XXXXXX)
trap 'rm -f "$e2e_log"' EXIT
# --durations: the slowest tests of each lane: the run's bar is 12 minutes, and it takes
# about 19 on 2 cores today (both lanes bound by CPU together; see the closing notes).
uv run pytest tests/e2e --durations=10 >"$e2e_log" 2>&1 &
e2e_pid=$!
rest=0
uv run pytest --ignore=tests/e2e -n 2 --dist loadfile --durations=25 || rest=$?
e2e=0
wait "$e2e_pid" || e2e=$?
echo "== pytest tests/e2e (ran beside the above)"
cat "$e2e_log"
if [ "$rest" -ne 0 ] || [ "$e2e" -ne 0 ]; then
    echo "== FAILED: tests outside e2e exit $rest, tests/e2e exit $e2e"
    exit 1
fi
