#!/usr/bin/env bash
# The whole test run: lint, types, import layers, then every test tier.
# Usage: bash scripts/test.sh [pytest args]
#
# Without arguments the tests run in two lanes at once: the e2e tier (one Prefect server, its
# deployments and workers; its time is mostly spent waiting for flow runs) beside everything
# else, which pytest-xdist splits over two workers by file, the slowest files first (tests/conftest.py
# SLOWEST_FIRST, not xdist's default of the files with most tests first). Each lane, and each worker, is a
# pytest session with its own etcd, kubesim and Prefect server: three sessions share the 2
# cores CI has. The bar (issue 29): 10 minutes on 2 cores with one of them kept busy beside
# it. At the end each lane's wall time and CPU-seconds are printed (its processes, and those
# they waited for), with the slowest tests of each. With arguments, one pytest run takes them.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh

TIMEFORMAT='%R %U %S'  # bash's `time`: wall, user and system seconds of a command and its children
started=$SECONDS
lint_time=$(mktemp -t storage-migrator-lint-time.XXXXXX)
{ time {
    echo "== ruff"
    uv run ruff check .
    uv run ruff format --check .
    echo "== mypy"
    uv run mypy
    echo "== import layers"
    uv run lint-imports
} 2>&3; } 3>&2 2>"$lint_time"
echo "== pytest"
if [ "$#" -gt 0 ]; then
    rm -f "$lint_time"
    exec uv run pytest "$@"
fi

e2e_log=$(mktemp -t storage-migrator-e2e.XXXXXX)
e2e_time=$(mktemp -t storage-migrator-e2e-time.XXXXXX)
rest_time=$(mktemp -t storage-migrator-rest-time.XXXXXX)
trap 'rm -f "$e2e_log" "$e2e_time" "$rest_time" "$lint_time"' EXIT
{ time uv run pytest tests/e2e --durations=10 >"$e2e_log" 2>&1; } 2>"$e2e_time" &
e2e_pid=$!
rest=0
{ time uv run pytest --ignore=tests/e2e -n 2 --dist loadfile --no-loadscope-reorder --durations=25 2>&3; } 3>&2 2>"$rest_time" || rest=$?
e2e=0
wait "$e2e_pid" || e2e=$?
echo "== pytest tests/e2e (ran beside the above)"
cat "$e2e_log"

lane() {  # NAME FILE: "NAME: W s wall, C CPU-seconds (U user + S system)"
    local wall user sys
    read -r wall user sys < <(tail -n 1 "$2") || true
    awk -v n="$1" -v w="${wall:-0}" -v u="${user:-0}" -v s="${sys:-0}" \
        'BEGIN { printf "%-28s %7.1f s wall %8.1f CPU-seconds (%.1f user + %.1f system)\n", n, w, u + s, u, s }'
}
echo "== time"
lane "lint, types, import layers" "$lint_time"
lane "tests outside e2e (-n 2)" "$rest_time"
lane "tests/e2e (beside it)" "$e2e_time"
echo "whole run: $((SECONDS - started)) s wall, after the bootstrap"
if [ "$rest" -ne 0 ] || [ "$e2e" -ne 0 ]; then
    echo "== FAILED: tests outside e2e exit $rest, tests/e2e exit $e2e"
    exit 1
fi
