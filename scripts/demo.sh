#!/usr/bin/env bash
# The embedded default: kubesim over a real etcd with sample data, an upgrade,
# and a rewrite of every object, judged by what etcd holds.
# Usage: bash scripts/demo.sh [--objects N] [--clusters 2] [--engine client|in-tree|auto] [--keep] [--prefect-db postgres]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bootstrap.sh
exec uv run python scripts/demo.py "$@"
