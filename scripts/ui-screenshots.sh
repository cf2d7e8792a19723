#!/usr/bin/env bash
# Takes docs/ui.md's screenshots again (docs/img/ui-*.png, 1400x900): the browser
# tests (tests/e2e/test_ui.py) on a Prefect server of their own, after the project's
# deployments ran on it, save the pages they check. About three minutes.
# Usage: bash scripts/ui-screenshots.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh
UI_SCREENSHOTS_DIR=docs/img exec uv run pytest tests/e2e/test_ui.py -q "$@"
