#!/usr/bin/env bash
# The whole test run: lint, types, import layers, then every test tier.
# Usage: bash scripts/test.sh [pytest args]
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
uv run pytest "$@"
