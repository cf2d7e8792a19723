"""Whether the API servers agree on the version they encode a resource in (DESIGN 4.4).

Design decision: the sources of agreement are observations turned into one
shape, the reporters of seed 000 (:class:`storage_migrator.agreement.reporters.ReporterHash`),
so detection applies one set of rules whatever the source. Best first:

1. the StorageVersion API (seed 001, as shipped: ``internal.apiserver.k8s.io/v1alpha1``,
   reference/storageversion-core-secrets.json): one reporter per
   ``status.storageVersions[].apiServerID``; ``status.commonEncodingVersion`` is
   seed 001's ``agreedEncodingVersion`` and is absent while they differ;
2. one discovery poll per API server (each server's ``storageVersionHash``);
3. a single discovery document, only when there is one server.

Built-in resources only have StorageVersion objects (v1.36); custom resources
store in the version their CRD names, which every server reads from etcd, so
their discovery hash is one reporter.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from storage_migrator.agreement.reporters import ReporterHash
from storage_migrator.kube.crds import as_mapping, storage_version_hash
from storage_migrator.kube.discovery import DiscoveredResource

__all__ = [
    "MAX_PASSES",
    "AgreementMoment",
    "AgreementSource",
    "AgreementVerdict",
    "StorageVersionObservation",
    "decide_agreement",
    "reporters_from_storage_versions",
    "storage_version_name",
]

#: Which source told detection what each API server encodes (best first).
AgreementSource = Literal["storage-version-api", "discovery-per-server", "discovery"]

STORAGE_VERSION_GROUP: Final = "internal.apiserver.k8s.io"


def storage_version_name(group: str, resource: str) -> str:
    """The StorageVersion object of a resource: ``<group>.<resource>``, ``core`` for core (as shipped)."""
    return f"{group or 'core'}.{resource}"


class StorageVersionObservation(BaseModel):
    """One StorageVersion object as read: who encodes in what, and whether they agree."""

    model_config = ConfigDict(frozen=True)

    name: str = Field(description="metadata.name, e.g. core.secrets or apps.deployments.")
    resource_version: str = Field(description="metadata.resourceVersion: moves whenever any server's entry changes.")
    common_encoding_version: str | None = Field(
        description="status.commonEncodingVersion (seed 001's agreedEncodingVersion); None while servers differ."
    )
    encodings: dict[str, str] = Field(
        description="apiServerID -> encodingVersion ('v1' for core, 'apps/v1' otherwise)."
    )

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> StorageVersionObservation:
        meta = as_mapping(obj.get("metadata"))
        status = as_mapping(obj.get("status"))
        encodings: dict[str, str] = {}
        for entry in status.get("storageVersions") or []:
            entry = as_mapping(entry)
            server, encoding = entry.get("apiServerID"), entry.get("encodingVersion")
            if isinstance(server, str) and server and isinstance(encoding, str) and encoding:
                encodings[server] = encoding
        common = status.get("commonEncodingVersion")
        return cls(
            name=str(meta.get("name", "")),
            resource_version=str(meta.get("resourceVersion", "")),
            common_encoding_version=common if isinstance(common, str) and common else None,
            encodings=encodings,
        )

    def describe(self) -> str:
        """`apiserver-a: v1, apiserver-b: v2`, for messages."""
        return ", ".join(f"{server}: {encoding}" for server, encoding in sorted(self.encodings.items())) or "none"


def _hash_of(encoding_version: str, kind: str) -> str:
    group, _, version = encoding_version.rpartition("/")
    return storage_version_hash(group, version, kind)


def reporters_from_storage_versions(
    observations: Sequence[StorageVersionObservation], discovered: Sequence[DiscoveredResource]
) -> list[ReporterHash]:
    """One reporter per API server and resource, with the hash discovery would show for its encoding.

    The hash needs the stored kind, which discovery gives; a resource whose
    StorageVersion object is missing (custom resources, aggregated APIs) gets no
    reporter here, and the caller falls back to discovery for it.
    """
    by_name = {o.name: o for o in observations}
    out: list[ReporterHash] = []
    for entry in discovered:
        if not entry.storage_version_hash or "/" in entry.resource:
            continue
        observed = by_name.get(storage_version_name(entry.group, entry.resource))
        if observed is None:
            continue
        for server, encoding in sorted(observed.encodings.items()):
            out.append(
                ReporterHash(
                    reporter_id=server,
                    group=entry.group,
                    resource=entry.resource,
                    hash=_hash_of(encoding, entry.kind),
                )
            )
    return out


# --- Seed 001 "Consuming the StorageVersion API", in the migration run -------------

#: When a migration run asks: before it starts, between two chunks, before it is marked Succeeded.
AgreementMoment = Literal["start", "chunk", "end"]

#: Passes of one run before a StorageVersion that keeps moving fails it (StorageVersionUnstable).
MAX_PASSES: Final = 3


class AgreementVerdict(BaseModel):
    """What the run does next: go on, stop (`Failed` with `reason`), or migrate again from the beginning."""

    model_config = ConfigDict(frozen=True)

    action: Literal["go", "abort", "rerun"]
    reason: str = Field(default="", description="The Failed condition's reason (abort) or the pass's (rerun).")
    message: str = Field(default="", description="What happened and what to do, naming each server's encoding.")


GO: Final = AgreementVerdict(action="go")


def _disagree(resource: str, now: StorageVersionObservation) -> str:
    return f"API servers disagree on the encoding version of {resource} ({now.describe()})"


def decide_agreement(
    *,
    resource: str,
    moment: AgreementMoment,
    baseline: StorageVersionObservation | None,
    now: StorageVersionObservation | None,
    passes: int = 1,
    max_passes: int = MAX_PASSES,
) -> AgreementVerdict:
    """Seed 001's rules for one migration run (DESIGN 4.4), as a table.

    "The storage migrator starts migration if the agreedEncodingVersion ... [is set],
    aborts ongoing migration if the storageVersion.status.agreedEncodingVersion is
    empty", and "can determine if the storage version has changed in the middle of
    migration by comparing the RV of the storageVersion object before and after the
    migration" (Version Skew Strategy). As shipped, agreedEncodingVersion is
    ``status.commonEncodingVersion``.

    - `baseline` is the object read when the current pass began, `now` the one
      just read; `passes` counts the passes made, this one included.
    - No object now and none at the start (custom resources, aggregated APIs,
      clusters without the API): no check, go.
    - `commonEncodingVersion` empty: abort, `NoCommonEncodingVersion` before the
      start (nothing written), `CommonEncodingVersionLost` once running (the
      checkpoint is kept).
    - At the end, a resourceVersion different from the baseline's (or an object
      that appeared or vanished) means the storage version may have moved, even
      if the servers agree on the same version again (a rollback and a
      roll-forward between two reads): rerun from the beginning, at most
      `max_passes` passes in all, then abort with `StorageVersionUnstable`.
      Between chunks a moved resourceVersion alone is no reason to stop: the end
      decides, so a pass is only repeated once.
    """
    if now is not None and now.common_encoding_version is None:
        if moment == "start":
            return AgreementVerdict(
                action="abort",
                reason="NoCommonEncodingVersion",
                message=(
                    f"{_disagree(resource, now)}: not started, nothing was written. Detection requests its "
                    "migrations again once they agree; re-apply a request made by hand once "
                    f"`kubectl get storageversions {now.name}` shows a commonEncodingVersion."
                ),
            )
        return AgreementVerdict(
            action="abort",
            reason="CommonEncodingVersionLost",
            message=(
                f"{_disagree(resource, now)}: stopped; the checkpoint is kept. Objects written meanwhile may be "
                "in either version: once the servers agree, a new migration of the resource runs from the beginning."
            ),
        )
    if moment != "end" or (baseline is None and now is None):
        return GO
    if baseline is not None and now is not None and baseline.resource_version == now.resource_version:
        return GO
    name = now.name if now is not None else baseline.name if baseline is not None else resource
    before = f"resourceVersion {baseline.resource_version}" if baseline else "no object"
    after = f"resourceVersion {now.resource_version}, {now.describe()}" if now else "no object"
    moved = (f"the storage version of {resource} changed while the migration ran "
             f"(StorageVersion {name}: {before} -> {after})")  # fmt: skip
    if passes >= max_passes:
        return AgreementVerdict(
            action="abort",
            reason="StorageVersionUnstable",
            message=f"{moved}, in each of {passes} passes: stopped; run it again once the upgrade is over.",
        )
    return AgreementVerdict(
        action="rerun",
        reason="StorageVersionChanged",
        message=f"{moved}: migrating again from the beginning (pass {passes + 1} of at most {max_passes}).",
    )
