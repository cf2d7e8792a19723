# The image the Prefect worker (deployments/worker/) and the flow-run Jobs run
# (docs/operator-guide.md, "The image"):
#   docker build -t REGISTRY/storage-migrator:0.1.0 .
#   bash scripts/image.sh build       (podman or docker, with or without a registry: below)
# Dependencies exactly as uv.lock pins them, without the dev group; the flows in the
# working directory /opt/prefect, which `prefect deploy --job-variable image=...`
# records as the runs' working directory; a non-root user; nothing writable but /tmp.

# The base: Python 3.11 on Debian bookworm. Where no registry answers, scripts/image.sh makes
# one from Debian's packages (mmdebstrap: python3, python3-venv) and names it here
# (--build-arg BASE=localhost/storage-migrator-base:...); the rest of this file is the same.
ARG BASE=docker.io/library/python:3.11-slim

# What uv reads to install from the lock, and nothing else: the tools' settings in
# pyproject.toml (ruff, mypy, pytest, import-linter) and README.md change often, and a change
# to them must leave the dependencies' layer as it is. Only this small stage runs again then.
FROM ${BASE} AS lock
WORKDIR /lock
COPY pyproject.toml uv.lock ./
COPY sim/pyproject.toml ./sim/
RUN awk '/^\[/ { keep = /^\[\[?(project|build-system|dependency-groups|tool\.uv|tool\.hatch)[].]/ } keep' \
        pyproject.toml >pyproject.lock.toml \
    && mv pyproject.lock.toml pyproject.toml

FROM ${BASE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    # Prefect's home (profiles, local storage) on the writable /tmp (an emptyDir in the pods).
    PREFECT_HOME=/tmp/prefect \
    # The ledger's default SQLite file, also on /tmp (the working directory is read-only): it
    # lives as long as the pod. Point STORAGE_MIGRATOR_DATABASE_URL at PostgreSQL to keep it.
    STORAGE_MIGRATOR_DATABASE_URL=sqlite:////tmp/storage-migrator-ledger.db \
    DO_NOT_TRACK=1 \
    PATH=/opt/prefect/.venv/bin:$PATH

RUN groupadd --gid 10001 migrator \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin migrator

WORKDIR /opt/prefect

# Build-only settings, none of them in the image: where the build's network goes through a TLS
# proxy, the CA bundle that trusts it (pip reads PIP_CERT, uv SSL_CERT_FILE), mounted by
# scripts/image.sh for the build only; and uv's download cache: none by default, while
# scripts/image.sh with podman mounts the host's (filled by scripts/bootstrap.sh from the same
# uv.lock) and sets UV_NO_CACHE=0, so that a first build downloads nothing twice.
ARG PIP_CERT
ARG SSL_CERT_FILE
ARG UV_NO_CACHE=1

# Dependencies first (a layer that changes only with the lock file, above). sim/pyproject.toml
# only describes the workspace's other member (kubesim and the dev stack, dev-only):
# uv reads it to trust the lock, and installs none of it without the dev group. uv itself is
# installed in /tmp and removed in the same step: it is in no layer. The project is installed
# editable (a .pth naming /opt/prefect, and the storage-migrator script), its packages (and
# the README its metadata names) empty here: their code is copied in below, and a change to it
# leaves this layer as it is.
COPY --from=lock /lock/ ./
RUN python3 -m venv /tmp/uv && /tmp/uv/bin/pip install --no-cache-dir --quiet 'uv>=0.5,<1' \
    && mkdir storage_migrator flows tasks flow_runner \
    && touch README.md storage_migrator/__init__.py flows/__init__.py tasks/__init__.py flow_runner/__init__.py \
    && UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never /tmp/uv/bin/uv sync --frozen --no-dev \
    && rm -rf /tmp/uv /tmp/uv-*.lock README.md storage_migrator flows tasks flow_runner

# The project: the flows, tasks and domain code prefect.yaml's entrypoints name.
COPY prefect.yaml ./
COPY storage_migrator ./storage_migrator
COPY tasks ./tasks
COPY flows ./flows
# The flow-run process of every Job (issue 35): storage-migrator-run.
COPY flow_runner ./flow_runner
# Compiled (on the read-only root no run can write their bytecode, and each would compile them
# again), then the import check with a Prefect home of its own, removed after: nothing
# root-owned is left in /tmp.
RUN python -m compileall -q storage_migrator tasks flows flow_runner \
    && storage-migrator --help >/dev/null \
    && PREFECT_HOME=/tmp/build-prefect python -c "import flows.migrate_resource, flow_runner.main, prefect_kubernetes" \
    && rm -rf /tmp/build-prefect

# Numeric, so that runAsNonRoot can verify it.
USER 10001:10001

# Our worker (issue 35), as deployments/worker/ runs it: it checks the Prefect API first (a missing
# auth string is one line naming PREFECT_API_AUTH_STRING), then builds every Job from the install.
CMD ["storage-migrator", "worker", "--pool", "storage-migrator-kubernetes", "--type", "kubernetes"]
