"""Reading every object of a resource, to know whether the API servers can still decrypt each one.

Issue 19 item 3, the runbook's phase 5: after the old key is removed, an object
still under it can no longer be decrypted, and the API server answers its LIST
with an error (kube-apiserver v1.36: 500 `StorageReadError` naming each one; older:
500 "unable to transform key"). A chunked, metadata-only LIST reads every object
without bringing a byte of its content to the migrator (DESIGN 8). Issue 39: a
rotation run again under a changed configuration reads first
(`read_every_object`), so that a loss is reported as one, with the objects the
server names (storage_migrator/rotation/unreadable.py), instead of a verification
pass failing on it. It is a check, not the proof: a server that serves a LIST
from its watch cache may not read etcd again; the proof is the verification pass.
"""

from __future__ import annotations

from kubernetes.client import ApiClient
from prefect import task
from pydantic import BaseModel, ConfigDict

from storage_migrator.kube.endpoints import api_server_urls
from storage_migrator.kube.errors import KubeError
from storage_migrator.kube.listing import list_page
from storage_migrator.migration.targets import MigrationTarget
from storage_migrator.rotation.unreadable import Unreadable, unreadable_objects
from storage_migrator.settings import Settings
from tasks.common import PRIVATE, REQUEST_RETRIES, api_client, connected

__all__ = ["ReadCheck", "read_every_object", "read_through_every_server"]

#: Objects per LIST page.
PAGE = 500
#: The LIST that counts what a failed page could not read reads the rest of the range at once: kube-apiserver
#: names the unreadable values among those it read for the answer (up to 100), and a page stops reading after
#: `limit` readable ones.
REST_OF_RANGE = 2**31 - 1


class ReadCheck(BaseModel):
    """One resource read through one server: how many objects, or the error (its code and reason only),
    and the objects that server cannot decrypt, when that is what the error says."""

    model_config = ConfigDict(frozen=True)

    server: str
    resource: str
    objects: int = 0
    error: str = ""
    unreadable: Unreadable | None = None


def _read(api: ApiClient, where: str, target: MigrationTarget, timeout: float) -> ReadCheck:
    """Every page of `target`; a failure that says objects cannot be decrypted is counted over the rest of
    the range, any other failure is raised (the task's retries take the passing ones)."""
    count, token = 0, None
    resource = target.ref.group_resource
    while True:
        try:
            page = list_page(api, target.ref, limit=PAGE, continue_token=token, metadata_only=True, timeout=timeout)
        except KubeError as exc:
            lost = unreadable_objects(exc, resource=target.ref.resource)
            if lost is None:
                raise
            try:  # the whole rest of the range, so that every unreadable value in it is named
                list_page(api, target.ref, limit=REST_OF_RANGE, continue_token=token, metadata_only=True,
                          timeout=timeout)  # fmt: skip
            except KubeError as again:
                lost = unreadable_objects(again, resource=target.ref.resource) or lost
            return ReadCheck(server=where, resource=resource, objects=count, error=f"{exc.code} {exc.reason}",
                             unreadable=lost)  # fmt: skip
        count += len(page.items)
        token = page.continue_token
        if not token:
            return ReadCheck(server=where, resource=resource, objects=count)


@task(name="read-every-object", **REQUEST_RETRIES, **PRIVATE)
def read_every_object(settings: Settings, targets: list[MigrationTarget]) -> list[ReadCheck]:
    """Each resource read through the cluster's address: the servers run one configuration (the gate)."""
    with connected(settings) as api:
        where = str(api.configuration.host)
        return [_read(api, where, t, settings.request_timeout_seconds) for t in targets]


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
                    out.append(_read(one, where, target, settings.request_timeout_seconds))
                except KubeError as exc:  # the code and reason: a message may quote an object
                    out.append(ReadCheck(server=where, resource=target.ref.group_resource,
                                         error=f"{exc.code} {exc.reason}"))  # fmt: skip
        finally:
            one.close()  # type: ignore[no-untyped-call]
    return out
