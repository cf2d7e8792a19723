"""Pydantic models of the APIs we own: ``migration.k8s.io/v1alpha1``.

Design decision (DESIGN 4.2): the wire form is that of
kubernetes-sigs/kube-storage-version-migrator (field names, camelCase, the
``Running``/``Succeeded``/``Failed`` conditions), so ``kubectl wait
--for=condition=Succeeded`` and existing tooling work. Our additions live in
``status`` only (phase, target hash, progress counters, times, failures) and
are all declared in the CRD schemas of ``deployments/crds`` (the API server
prunes anything else; a unit test keeps the two in step). Field descriptions
are the user-facing documentation, as upstream's ``types.go`` comments are.

Fields are snake_case in Python and camelCase on the wire:
``model.to_wire()`` gives the dict to send, ``Model.model_validate(dict)`` reads
one. Condition helpers are pure functions returning new lists, so the
decisions that use them can be table-tested. This module imports nothing of
ours: it is the bottom layer.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainSerializer
from pydantic.alias_generators import to_camel

__all__ = [
    "API_VERSION",
    "CONDITION_FAILED",
    "CONDITION_RUNNING",
    "CONDITION_SUCCEEDED",
    "GROUP",
    "MAX_RECORDED_FAILURES",
    "MIGRATIONS_KIND_NAME",
    "OWNER_ANNOTATION",
    "STATES_KIND_NAME",
    "STORAGE_STATES",
    "STORAGE_VERSION_MIGRATIONS",
    "UNKNOWN",
    "VERSION",
    "ConditionStatus",
    "GroupResource",
    "GroupVersionResource",
    "KubeTime",
    "MigrationCondition",
    "MigrationPhase",
    "MigrationProgress",
    "ObjectFailure",
    "ObjectMeta",
    "StorageState",
    "StorageStateSpec",
    "StorageStateStatus",
    "StorageVersionHash",
    "StorageVersionMigration",
    "StorageVersionMigrationSpec",
    "StorageVersionMigrationStatus",
    "WireModel",
    "as_utc",
    "format_time",
    "new_storage_state",
    "new_storage_version_migration",
    "owner_of",
    "storage_state_name",
]

GROUP: Final = "migration.k8s.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
#: Plural resource names of our CRDs (for building a ResourceRef in the kube layer).
STORAGE_VERSION_MIGRATIONS: Final = "storageversionmigrations"
STORAGE_STATES: Final = "storagestates"
#: The names a user types and reads (kubectl, messages, docs). Always fully qualified:
#: a bare `kubectl get storageversionmigrations` resolves to the in-tree API
#: (storagemigration.k8s.io), which has the same plural and kind (DESIGN 4.2, issue 9).
MIGRATIONS_KIND_NAME: Final = f"{STORAGE_VERSION_MIGRATIONS}.{GROUP}"
STATES_KIND_NAME: Final = f"{STORAGE_STATES}.{GROUP}"

#: Valid in persistedStorageVersionHashes: versions persisted before we looked are unknown.
UNKNOWN: Final = "Unknown"

CONDITION_RUNNING: Final = "Running"
CONDITION_SUCCEEDED: Final = "Succeeded"
CONDITION_FAILED: Final = "Failed"

#: The flow run that claimed a migration last, the one that may write its checkpoint (issue 31).
OWNER_ANNOTATION: Final = f"{GROUP}/flow-run"

#: Failures kept in status.failures: enough to act on, small enough for etcd's 1.5 MB.
MAX_RECORDED_FAILURES: Final = 20

ConditionStatus = Literal["True", "False", "Unknown"]
MigrationPhase = Literal["Pending", "Running", "Succeeded", "Failed"]


def as_utc(value: datetime) -> datetime:
    """Naive times are UTC; seconds precision, as metav1.Time stores (exact round trips)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).replace(microsecond=0)


def format_time(value: datetime) -> str:
    """metav1.Time wire form: RFC 3339, second precision, ``Z`` (naive times are UTC)."""
    return as_utc(value).strftime("%Y-%m-%dT%H:%M:%SZ")


KubeTime = Annotated[
    datetime,
    AfterValidator(as_utc),
    PlainSerializer(format_time, return_type=str),
]
"""A ``metav1.Time``: aware UTC in Python, ``2026-11-22T03:58:31Z`` on the wire."""


class WireModel(BaseModel):
    """Base of our API models: camelCase aliases, unknown fields ignored."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="ignore",
    )

    def to_wire(self) -> dict[str, Any]:
        """The JSON-ready dict to send to the API server (camelCase, no nulls)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class ObjectMeta(WireModel):
    """The parts of ``metav1.ObjectMeta`` we read or set; others are kept as extra.

    Extra fields are allowed (not dropped) so that a read-modify-replace does
    not lose metadata we do not model (managedFields and the like).
    """

    model_config = ConfigDict(extra="allow")

    name: str | None = None
    generate_name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = None
    creation_timestamp: KubeTime | None = None
    deletion_timestamp: KubeTime | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    owner_references: list[dict[str, Any]] | None = None
    finalizers: list[str] | None = None


class GroupVersionResource(WireModel):
    """The names of the group, the version, and the resource."""

    group: str = Field(default="", description="The name of the group.")
    version: str = Field(default="", description="The name of the version.")
    resource: str = Field(default="", description="The name of the resource.")


class GroupResource(WireModel):
    """The names of the group and the resource."""

    group: str = Field(default="", description="The name of the group.")
    resource: str = Field(default="", description="The name of the resource.")


class StorageVersionMigrationSpec(WireModel):
    """Spec of the storage version migration."""

    resource: GroupVersionResource = Field(
        description=(
            "The resource that is being migrated. The migrator sends requests to "
            "the endpoint serving the resource. Immutable."
        )
    )
    continue_token: str | None = Field(
        default=None,
        description=(
            "The token used in the list options to get the next chunk of objects to "
            'migrate. When the .status.conditions indicates the migration is "Running", '
            "users can use this token to check the progress of the migration."
        ),
    )


class MigrationCondition(WireModel):
    """Describes the state of a migration at a certain point."""

    type: str = Field(description="Type of the condition: Running, Succeeded or Failed.")
    status: ConditionStatus = Field(description="Status of the condition, one of True, False, Unknown.")
    last_update_time: KubeTime | None = Field(default=None, description="The last time this condition was updated.")
    reason: str | None = Field(default=None, description="The reason for the condition's last transition.")
    message: str | None = Field(
        default=None,
        description="A human readable message indicating details about the transition.",
    )


class MigrationProgress(WireModel):
    """Counters of a migration, updated at every checkpoint (after each chunk)."""

    listed: int = Field(default=0, ge=0, description="Objects returned by the LIST so far.")
    rewritten: int = Field(
        default=0,
        ge=0,
        description="Objects re-encoded and written (new resourceVersion).",
    )
    unchanged: int = Field(
        default=0,
        ge=0,
        description="Objects already stored in the current version and key (no write).",
    )
    gone: int = Field(default=0, ge=0, description="Objects deleted between LIST and write.")
    conflicted: int = Field(
        default=0,
        ge=0,
        description="Objects written by someone else since the LIST (already re-encoded).",
    )
    failed: int = Field(
        default=0,
        ge=0,
        description="Objects that could not be rewritten (see failures).",
    )
    chunks: int = Field(default=0, ge=0, description="LIST chunks completed.")
    remaining_item_count: int | None = Field(
        default=None,
        ge=0,
        description="Objects after the last chunk, as estimated by the API server.",
    )


class ObjectFailure(WireModel):
    """One object that could not be rewritten, and the API's answer."""

    namespace: str | None = Field(default=None, description="Namespace; empty if cluster-scoped.")
    name: str = Field(description="Name of the object.")
    code: int = Field(description="HTTP status code of the last answer (0: no answer).")
    reason: str = Field(default="", description="Reason of the API's answer, e.g. Forbidden.")
    message: str = Field(
        default="",
        description=(
            "The fields the API named (a 422's causes: path and reason), e.g. 'fields: data.x "
            "(FieldValueInvalid)'. Never the API's message, which can quote the object."
        ),
    )


class StorageVersionMigrationStatus(WireModel):
    """Status of the storage version migration."""

    conditions: list[MigrationCondition] = Field(
        default_factory=list,
        description="The latest available observations of the migration's current state.",
    )
    phase: MigrationPhase | None = Field(
        default=None,
        description="Summary of the conditions for display: Pending, Running, Succeeded, Failed.",
    )
    target_storage_version_hash: str | None = Field(
        default=None,
        description=(
            "The storageVersionHash of the resource when the migration started: the "
            "version objects are being migrated to."
        ),
    )
    encryption_config_hash: str | None = Field(
        default=None,
        description=(
            "For a request that names an encryption key: the encryption configuration hash every API "
            "server reported on /metrics when the current pass began (issue 19). The proof of a rotation "
            "holds under this configuration only."
        ),
    )
    progress: MigrationProgress | None = Field(default=None, description="Counters of objects handled so far.")
    resource_version: str | None = Field(
        default=None,
        description=(
            "The list resourceVersion of the first LIST of the current pass: every object that existed "
            "then was rewritten, as storagemigration.k8s.io's status.resourceVersion says for its own "
            "migrations. Kept by a resumed run; a new pass from the beginning records its own. A "
            "StorageState is refined only by a migration whose resourceVersion is later than the one "
            "the state recorded its current hash at (issue 36)."
        ),
    )
    started_at: KubeTime | None = Field(default=None, description="When the migration (first) started running.")
    finished_at: KubeTime | None = Field(default=None, description="When the migration succeeded or failed.")
    failures: list[ObjectFailure] = Field(
        default_factory=list,
        max_length=MAX_RECORDED_FAILURES,
        description=(
            f"The first {MAX_RECORDED_FAILURES} objects that could not be rewritten, "
            "with the API's reason; progress.failed counts all of them."
        ),
    )


class StorageVersionMigration(WireModel):
    """A migration of stored data to the latest storage version (one resource)."""

    api_version: Literal["migration.k8s.io/v1alpha1"] = "migration.k8s.io/v1alpha1"
    kind: Literal["StorageVersionMigration"] = "StorageVersionMigration"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: StorageVersionMigrationSpec = Field(description="Specification of the migration.")
    status: StorageVersionMigrationStatus = Field(
        default_factory=StorageVersionMigrationStatus,
        description="Status of the migration.",
    )


class StorageStateSpec(WireModel):
    """Specification of the storage state."""

    resource: GroupResource = Field(description="The resource this storageState is about.")


class StorageVersionHash(WireModel):
    """The storage version hash observed by one reporter at lastHeartbeatTime (seed 000, HA)."""

    reporter_id: str = Field(
        alias="reporterID",
        description=(
            "The ID of the reporting triggering controller (or API server) whose "
            "discovery document this hash was read from."
        ),
    )
    current_storage_version_hash: str = Field(
        description=(
            "The hash value of the current storage version, as shown in the discovery "
            "document served by the API server local to the reporter."
        )
    )
    last_heartbeat_time: KubeTime | None = Field(
        default=None,
        description="The last time the reporter checked the hash and updated this entry.",
    )


class StorageStateStatus(WireModel):
    """Status of the storage state."""

    persisted_storage_version_hashes: list[str] = Field(
        default_factory=list,
        description=(
            "The hash values of storage versions that persisted instances of "
            'spec.resource might still be encoded in. "Unknown" is a valid value in the '
            "list, and is the default value. It is not safe to upgrade or downgrade to an "
            "apiserver binary that does not support all versions listed in this field, "
            'or if "Unknown" is listed. Once the storage version migration for this '
            "resource has completed, the value of this field is refined to only contain "
            "the currentStorageVersionHash. Once the apiserver has changed the storage "
            "version, the new storage version is appended to the list."
        ),
    )
    current_storage_version_hash: str | None = Field(
        default=None,
        description=(
            "The hash value of the current storage version, as shown in the discovery "
            "document served by the API server. Storage Version is the version to which "
            "objects are converted to before persisted."
        ),
    )
    last_heartbeat_time: KubeTime | None = Field(
        default=None,
        description=(
            "LastHeartbeatTime is the last time the storage migration triggering "
            "controller checks the storage version hash of this resource in the "
            "discovery document and updates this field."
        ),
    )
    current_storage_version_hashes: list[StorageVersionHash] = Field(
        default_factory=list,
        description=(
            "A list of current storage version hashes. In case of HA setup, the storage "
            "version hashes exposed by all API server instances are reported here. In "
            "case of non-HA setup, this list should only contain one element."
        ),
    )
    current_hash_resource_version: str | None = Field(
        default=None,
        description=(
            "The resource's list resourceVersion (a LIST with limit 1) when currentStorageVersionHash "
            "was recorded: only a migration whose first LIST came later (a greater resourceVersion) "
            "refines persistedStorageVersionHashes. Absent until recorded (a state written by an "
            "older storage-migrator, or a read that failed): the next poll records it."
        ),
    )


class StorageState(WireModel):
    """The state of the storage of a specific resource."""

    api_version: Literal["migration.k8s.io/v1alpha1"] = "migration.k8s.io/v1alpha1"
    kind: Literal["StorageState"] = "StorageState"
    metadata: ObjectMeta = Field(
        default_factory=ObjectMeta,
        description='The name must be "<.spec.resource.resource>.<.spec.resource.group>".',
    )
    spec: StorageStateSpec = Field(description="Specification of the storage state.")
    status: StorageStateStatus = Field(default_factory=StorageStateStatus, description="Status of the storage state.")


def storage_state_name(group: str, resource: str) -> str:
    """``<resource>.<group>``, or ``<resource>`` for the core group (upstream naming)."""
    return f"{resource}.{group}" if group else resource


def new_storage_state(*, group: str, resource: str) -> StorageState:
    """A StorageState for a resource seen for the first time (persisted: Unknown, seed 000)."""
    return StorageState(
        metadata=ObjectMeta(name=storage_state_name(group, resource)),
        spec=StorageStateSpec(resource=GroupResource(group=group, resource=resource)),
        status=StorageStateStatus(persisted_storage_version_hashes=[UNKNOWN]),
    )


def new_storage_version_migration(
    *,
    group: str,
    version: str,
    resource: str,
    name: str | None = None,
    labels: dict[str, str] | None = None,
) -> StorageVersionMigration:
    """A migration request; without ``name`` the server picks one from ``<resource>.<group>-``."""
    meta = ObjectMeta(name=name, labels=labels)
    if name is None:
        meta.generate_name = f"{storage_state_name(group, resource)}-"
    return StorageVersionMigration(
        metadata=meta,
        spec=StorageVersionMigrationSpec(
            resource=GroupVersionResource(group=group, version=version, resource=resource)
        ),
    )


def owner_of(migration: StorageVersionMigration) -> str | None:
    """The flow run that claimed the request last (None: none recorded)."""
    return (migration.metadata.annotations or {}).get(OWNER_ANNOTATION) or None
