#!/usr/bin/env bash
# The whole test run: lint, types, import layers and every test tier.
# Usage: bash scripts/test.sh [pytest args]
#
# Without arguments lint and types run beside the tests, which run in three lanes at once:
# - the e2e tier (one Prefect server, its deployments and workers; its time is mostly spent
#   waiting for flow runs);
# - the tests that mostly wait (WAITING: a Prefect server they kill for 90 s, writers that come and go
#   for 2 minutes; about 6 minutes of little CPU, which would hold one of the other lane's two
#   workers for all that time);
# - everything else, which pytest-xdist splits over two workers by file, the slowest files first
#   (tests/conftest.py SLOWEST_FIRST, not xdist's default of the files with most tests first).
# Each lane, and each worker, is a pytest session with its own etcd and kubesim (and Prefect
# server where its tests need one): four sessions share the 2 cores CI has. The bar (issue 29):
# 10 minutes on 2 cores with one of them kept busy beside it. At the end each lane's wall time and CPU-seconds are printed (its
# processes, and those they waited for), with the slowest tests of each. With arguments, one
# pytest run takes them.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh

TIMEFORMAT='%R %U %S'  # bash's `time`: wall, user and system seconds of a command and its children
started=$SECONDS
lint() {
    echo "== ruff"
    uv run ruff check .
    uv run ruff format --check .
    echo "== mypy"
    uv run mypy
    echo "== import layers"
    uv run lint-imports
}
if [ "$#" -gt 0 ]; then
    lint
    echo "== pytest"
    exec uv run pytest "$@"
fi

#: The lane of tests that mostly wait (see above): a Prefect server down for 90 s under a migration,
#: and three writers joining and leaving for two minutes (issue 37).
WAITING=(tests/integration/test_prefect_outage.py tests/integration/test_writers_join_and_leave.py)
logs=$(mktemp -d -t storage-migrator-lanes.XXXXXX)
trap 'rm -rf "$logs"' EXIT
# Lint and types beside the tests too (half a minute of CPU that used to come before them).
{ time { (set -e; lint) >"$logs/lint" 2>&1; }; } 2>"$logs/lint-time" &
lint_pid=$!
echo "== pytest"
{ time uv run pytest tests/e2e --durations=10 >"$logs/e2e" 2>&1; } 2>"$logs/e2e-time" &
e2e_pid=$!
{ time uv run pytest "${WAITING[@]}" --durations=10 >"$logs/waiting" 2>&1; } 2>"$logs/waiting-time" &
waiting_pid=$!
ignore=(--ignore=tests/e2e)
for path in "${WAITING[@]}"; do ignore+=("--ignore=$path"); done
rest=0
{ time uv run pytest "${ignore[@]}" -n 2 --dist loadfile --no-loadscope-reorder --durations=25 2>&3; } 3>&2 \
    2>"$logs/rest-time" || rest=$?
linted=0
wait "$lint_pid" || linted=$?
waiting=0
wait "$waiting_pid" || waiting=$?
e2e=0
wait "$e2e_pid" || e2e=$?
cat "$logs/lint"
echo "== pytest ${WAITING[*]} (ran beside the above)"
cat "$logs/waiting"
echo "== pytest tests/e2e (ran beside the above)"
cat "$logs/e2e"

lane() {  # NAME FILE: "NAME: W s wall, C CPU-seconds (U user + S system)"
    local wall user sys
    read -r wall user sys < <(tail -n 1 "$2") || true
    awk -v n="$1" -v w="${wall:-0}" -v u="${user:-0}" -v s="${sys:-0}" \
        'BEGIN { printf "%-28s %7.1f s wall %8.1f CPU-seconds (%.1f user + %.1f system)\n", n, w, u + s, u, s }'
}
echo "== time"
lane "lint, types, import layers" "$logs/lint-time"
lane "tests outside e2e (-n 2)" "$logs/rest-time"
lane "tests that wait (beside it)" "$logs/waiting-time"
lane "tests/e2e (beside it)" "$logs/e2e-time"
echo "whole run: $((SECONDS - started)) s wall, after the bootstrap"
if [ "$linted" -ne 0 ] || [ "$rest" -ne 0 ] || [ "$waiting" -ne 0 ] || [ "$e2e" -ne 0 ]; then
    echo "== FAILED: lint and types exit $linted, tests outside e2e exit $rest, tests that wait exit $waiting," \
        "tests/e2e exit $e2e"
    exit 1
fi
