"""Authentication on the Prefect API (issue 30), on the session's Prefect server, which asks
for an auth string as every server we start does (tests/prefect_server.py).

"The Prefect API of the demo, of the dev stack and of the documented install asks no one
for anything. So whoever reaches one port can read every cluster's credentials." With
Prefect's basic auth on: a call without the string gets 401 and reads nothing, `/api/health`
stays open (probes), and the string opens the same calls. The websockets are checked too:
Prefect once left its events websocket open under basic auth (PrefectHQ/prefect#17687);
on 3.9 it is closed (a client must send the string in its first message). And our command
line, without the string, says in one line which setting to set, whatever the command.
The other tests of the tier run with the string: flows, deployments, events, the CLI.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Kubesim
from prefect.events import Event
from prefect.settings import PREFECT_API_AUTH_STRING, temporary_settings
from prefect_kubernetes.credentials import KubernetesClusterConfig
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.typing import Subprotocol

from storage_migrator.cli import main

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api")]

REPO = Path(__file__).resolve().parents[2]
PREFECT_SUBPROTOCOL = [Subprotocol("prefect")]
#: Seconds for one websocket step (a handshake, a message): the machine is shared, these are bounds, not waits.
WS_SECONDS = 60


def auth_string() -> str:
    value = PREFECT_API_AUTH_STRING.value()
    assert value, "the session's Prefect server runs without an auth string (tests/prefect_server.py)"
    return str(value)


def call(api: str, path: str, body: Any = None, *, auth: str | None = None) -> tuple[int, Any]:
    """One HTTP call as any client on the network makes it: the status and the decoded answer."""
    headers = {"Content-Type": "application/json"}
    if auth is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(auth.encode()).decode()
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{api}{path}", data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


@pytest.fixture
def cluster_block(kubesim: Kubesim) -> Iterator[str]:
    """A KubernetesClusterConfig block holding the cluster's credentials, as a fleet has one per cluster."""
    name = f"auth-{uuid.uuid4().hex[:8]}"
    block = KubernetesClusterConfig.from_file(Path(kubesim.kubeconfig))
    block_id = block.save(name, overwrite=True)
    yield name
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        client.delete_block_document(block_id)


def test_a_call_without_the_string_gets_401_and_reads_nothing_but_health_stays_open(
    prefect_api: str, cluster_block: str
) -> None:
    """The issue's call: POST /api/block_documents/filter returned a KubernetesClusterConfig's
    kubeconfig to anyone. Now 401 without the string or with another one; 200 with it."""
    reads = [("/block_documents/filter", {"include_secrets": True}), ("/flow_runs/filter", {"limit": 1})]
    for path, body in reads:
        for auth in (None, "admin:not-the-string", auth_string() + "x"):
            status, answer = call(prefect_api, path, body, auth=auth)
            assert (status, answer) == (401, {"exception_message": "Unauthorized"}), (path, auth, status)
    # Health probes (Kubernetes', ours) need no credentials; they say nothing but "healthy".
    assert call(prefect_api, "/health") == (200, True)
    # The same calls with the string: the block and its credentials are there, to those who hold it.
    status, blocks = call(prefect_api, *reads[0], auth=auth_string())
    assert status == 200
    [ours] = [b for b in blocks if b["name"] == cluster_block]
    assert ours["data"]["config"]["clusters"], "the block's kubeconfig, read with the string"
    status, runs = call(prefect_api, *reads[1], auth=auth_string())
    assert status == 200 and isinstance(runs, list)


def _ws_url(api: str, path: str) -> str:
    return api.replace("http://", "ws://", 1) + path


async def _refused(api: str, path: str, first: dict[str, Any] | None, *, subprotocol: bool = True) -> str:
    """How the websocket at `path` refuses a client that sends `first` as its first message
    (or, without the "prefect" subprotocol, that only connects): the handshake's status or the close."""
    try:
        async with connect(_ws_url(api, path), subprotocols=PREFECT_SUBPROTOCOL if subprotocol else None,
                           open_timeout=WS_SECONDS) as ws:  # fmt: skip
            if first is not None:
                await ws.send(json.dumps(first))
            answer = await asyncio.wait_for(ws.recv(), WS_SECONDS)
            return f"accepted: {answer}"
    except InvalidStatus as exc:
        return f"HTTP {exc.response.status_code}"
    except ConnectionClosed as exc:
        assert exc.rcvd is not None
        return f"closed {exc.rcvd.code}: {exc.rcvd.reason}"


async def _authenticated(api: str, path: str) -> ClientConnection:
    ws = await connect(_ws_url(api, path), subprotocols=PREFECT_SUBPROTOCOL, open_timeout=WS_SECONDS)
    await ws.send(json.dumps({"type": "auth", "token": auth_string()}))
    assert json.loads(await asyncio.wait_for(ws.recv(), WS_SECONDS)) == {"type": "auth_success"}
    return ws


def test_the_events_websockets_refuse_a_client_without_the_string(prefect_api: str) -> None:
    """PrefectHQ/prefect#17687: Prefect once accepted events on `/api/events/in` without
    credentials under basic auth. On our version (3.9) both events websockets refuse such a
    client: without Prefect's subprotocol the handshake is refused (403), with it the first
    message must carry the string (else close 1008), and an event sent without it is never
    published: a subscriber (with the string) sees only the event sent with it."""
    resource = f"storage-migrator.test.auth-{uuid.uuid4().hex[:8]}"

    def event(name: str) -> Event:
        return Event(event=f"storage-migrator.test.{name}", resource={"prefect.resource.id": resource})

    refused, sent = event("unauthenticated"), event("authenticated")

    async def scenario() -> list[str]:
        outcomes = []
        for path in ("/events/in", "/events/out"):
            outcomes += [
                await _refused(prefect_api, path, None, subprotocol=False),
                await _refused(prefect_api, path, {"type": "auth", "token": None}),
                await _refused(prefect_api, path, {"type": "auth", "token": "admin:not-the-string"}),
            ]
        # The hole of #17687: an event as the first message, no credentials.
        outcomes.append(await _refused(prefect_api, "/events/in", json.loads(refused.model_dump_json())))
        # With the string: subscribe to the resource's events, send one, and read what arrives.
        subscriber = await _authenticated(prefect_api, "/events/out")
        try:
            await subscriber.send(json.dumps({"type": "filter", "backfill": False,
                                              "filter": {"resource": {"id": [resource]}}}))  # fmt: skip
            # The subscription is open before anything is sent (an event sent earlier would be missed).
            publisher = await _authenticated(prefect_api, "/events/in")
            async with publisher:
                await _refused(prefect_api, "/events/in", json.loads(refused.model_dump_json()))
                await publisher.send(sent.model_dump_json())
                received = []
                while str(sent.id) not in received:
                    message = json.loads(await asyncio.wait_for(subscriber.recv(), WS_SECONDS))
                    received.append(message["event"]["id"])
        finally:
            await subscriber.close()
        return [*outcomes, *(f"received {i}" for i in received)]

    outcomes = asyncio.run(scenario())
    for path in range(2):
        assert outcomes[3 * path : 3 * path + 3] == [
            "HTTP 403",
            "closed 1008: Auth required but no token provided",
            "closed 1008: Invalid token",
        ], outcomes
    assert outcomes[6] == "closed 1008: Expected 'auth' message", outcomes
    assert outcomes[7:] == [f"received {sent.id}"], "only the event sent with the string was published"


@pytest.fixture
def without_the_string(prefect_api: str) -> Iterator[dict[str, str]]:
    """This process's Prefect settings without the auth string (as a shell without the export);
    yields an environment of the same server without it, for processes."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_AUTH_STRING"}
    with temporary_settings(restore_defaults={PREFECT_API_AUTH_STRING}):
        yield {**env, "PREFECT_API_URL": prefect_api}


@pytest.mark.usefixtures("migration_crds")
def test_the_cli_without_the_string_names_the_setting_in_one_line(
    kubesim: Kubesim, cluster_block: str, without_the_string: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 30: "Without the auth string, the CLI ... get[s] a clear error that names the
    setting, not a stack trace." Every command's way to the Prefect API: the recorded clusters
    (`--all-clusters`), a cluster's block (`--cluster NAME`), the fleet's deployments; the
    console script in a process of its own; a stale string after a rotation."""
    default = ["--kubeconfig", kubesim.kubeconfig]
    for argv in (["fleet", "list"], [*default, "status", "--all-clusters"], [*default, "plan", "--all-clusters"],
                 ["status", "--cluster", cluster_block], ["check-prefect"]):  # fmt: skip
        assert main(argv) == 1, argv
        err = capsys.readouterr().err
        assert "asks for credentials (401 Unauthorized): set PREFECT_API_AUTH_STRING to the server's " \
               "PREFECT_SERVER_API_AUTH_STRING (user:password)" in err, (argv, err)  # fmt: skip
        assert "Traceback" not in err, err

    with temporary_settings(updates={PREFECT_API_AUTH_STRING: "admin:before-the-rotation"}):
        assert main(["fleet", "list"]) == 1
    assert "PREFECT_API_AUTH_STRING is set but is not the server's PREFECT_SERVER_API_AUTH_STRING" in (
        capsys.readouterr().err
    )

    done = subprocess.run([sys.executable, "-m", "storage_migrator.cli", "fleet", "list"], cwd=REPO,
                          env=without_the_string, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and "set PREFECT_API_AUTH_STRING" in done.stderr, done.stderr


def test_check_prefect_passes_with_the_string(prefect_api: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-prefect"]) == 0
    assert capsys.readouterr().out.strip() == (
        f"the Prefect API at {prefect_api} answers and accepts this process's credentials"
    )
