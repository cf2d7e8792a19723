"""The runbook's last phase: every object of each resource is read through every API server.

Issue 19 item 3, phase 5: after the old key is removed, an object still under it
can no longer be decrypted, and the API server answers its LIST with an error
(kube-apiserver: 500 "no matching prefix found"). A chunked, metadata-only LIST
through each server's own endpoint reads every object without bringing a byte
of its content to the migrator (DESIGN 8). It is a check, not the proof: a server
that serves a LIST from its watch cache may not read etcd again; the proof is the
verification pass of phase 3.
"""

from __future__ import annotations

from prefect import task
from pydantic import BaseModel, ConfigDict

from storage_migrator.kube.endpoints import api_server_urls
from storage_migrator.kube.errors import KubeError
from storage_migrator.kube.listing import iterate_items
from storage_migrator.migration.targets import MigrationTarget
from storage_migrator.settings import Settings
from tasks.common import PRIVATE, REQUEST_RETRIES, api_client, connected

__all__ = ["ReadCheck", "read_through_every_server"]


class ReadCheck(BaseModel):
    """One resource read through one server: how many objects, or the error (its code and reason only)."""

    model_config = ConfigDict(frozen=True)

    server: str
    resource: str
    objects: int = 0
    error: str = ""


@task(name="read-through-every-server", **REQUEST_RETRIES, **PRIVATE)
def read_through_every_server(settings: Settings, targets: list[MigrationTarget]) -> list[ReadCheck]:
    with connected(settings) as api:
        found = settings.api_servers or api_server_urls(api, timeout=settings.request_timeout_seconds)
    servers: list[str | None] = [*found] or [None]  # None: the cluster's own address
    out = []
    for server in servers:
        one = api_client(settings, server=server)
        where = server or str(one.configuration.host)
        try:
            for target in targets:
                try:
                    count = sum(1 for _ in iterate_items(one, target.ref, metadata_only=True,
                                                         timeout=settings.request_timeout_seconds))  # fmt: skip
                except KubeError as exc:  # the code and reason: a message may quote an object
                    out.append(ReadCheck(server=where, resource=target.ref.group_resource,
                                         error=f"{exc.code} {exc.reason}"))  # fmt: skip
                    continue
                out.append(ReadCheck(server=where, resource=target.ref.group_resource, objects=count))
        finally:
            one.close()  # type: ignore[no-untyped-call]
    return out
