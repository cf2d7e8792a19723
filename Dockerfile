# The image the Prefect worker (deployments/worker/) and the flow-run Jobs run
# (docs/operator-guide.md, "The image"):
#   docker build -t REGISTRY/storage-migrator:0.1.0 .
# Dependencies exactly as uv.lock pins them, without the dev group; the flows in the
# working directory /opt/prefect, which `prefect deploy --job-variable image=...`
# records as the runs' working directory; a non-root user; nothing writable but /tmp.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    # Prefect's home (profiles, local storage) on the writable /tmp (an emptyDir in the pods).
    PREFECT_HOME=/tmp/prefect \
    # The ledger's default SQLite file, also on /tmp (the working directory is read-only): it
    # lives as long as the pod. Point STORAGE_MIGRATOR_DATABASE_URL at PostgreSQL to keep it.
    STORAGE_MIGRATOR_DATABASE_URL=sqlite:////tmp/storage-migrator-ledger.db \
    DO_NOT_TRACK=1 \
    PATH=/opt/prefect/.venv/bin:$PATH

RUN pip install --no-cache-dir 'uv>=0.5,<1' \
    && groupadd --gid 10001 migrator \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin migrator

WORKDIR /opt/prefect

# Dependencies first (a layer that changes only with the lock file). sim/pyproject.toml
# only describes the workspace's other member (kubesim and the dev stack, dev-only):
# uv reads it to trust the lock, and installs none of it without the dev group.
COPY pyproject.toml uv.lock README.md ./
COPY sim/pyproject.toml ./sim/
RUN uv sync --frozen --no-dev --no-install-project --no-cache

# The project: the flows, tasks and domain code prefect.yaml's entrypoints name.
COPY prefect.yaml ./
COPY storage_migrator ./storage_migrator
COPY tasks ./tasks
COPY flows ./flows
# The flow-run process of every Job (issue 35): storage-migrator-run.
COPY flow_runner ./flow_runner
# The import check with a Prefect home of its own, removed after: nothing root-owned is left in /tmp.
RUN uv sync --frozen --no-dev --no-cache \
    && storage-migrator --help >/dev/null \
    && PREFECT_HOME=/tmp/build-prefect python -c "import flows.migrate_resource, prefect_kubernetes" \
    && rm -rf /tmp/build-prefect

# Numeric, so that runAsNonRoot can verify it.
USER 10001:10001

# The check first, as deployments/worker/ runs it: a missing auth string is one line naming
# PREFECT_API_AUTH_STRING, not the worker's stack trace.
CMD ["sh", "-c", "storage-migrator check-prefect && exec prefect worker start --pool storage-migrator-kubernetes --type kubernetes"]
