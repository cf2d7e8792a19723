"""Wire form of our APIs (storage_migrator.models), upstream-compatible names."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from storage_migrator.conditions import get_condition, is_condition_true, phase_from_conditions, set_condition
from storage_migrator.models import (
    UNKNOWN,
    MigrationProgress,
    ObjectFailure,
    StorageState,
    StorageVersionHash,
    StorageVersionMigration,
    new_storage_state,
    new_storage_version_migration,
    storage_state_name,
)

T0 = datetime(2026, 11, 22, 3, 58, 31, tzinfo=UTC)

# As kube-storage-version-migrator writes it (and kubectl wait reads it).
UPSTREAM_MIGRATION = {
    "apiVersion": "migration.k8s.io/v1alpha1",
    "kind": "StorageVersionMigration",
    "metadata": {"name": "secrets-abcde", "resourceVersion": "12", "uid": "u"},
    "spec": {
        "resource": {"group": "", "version": "v1", "resource": "secrets"},
        "continueToken": "eyJ2IjoibWV0YS5rOHMuaW8vdjEifQ",
    },
    "status": {
        "conditions": [
            {
                "type": "Succeeded",
                "status": "True",
                "lastUpdateTime": "2026-11-22T03:58:31Z",
                "reason": "Done",
                "message": "all objects migrated",
            }
        ]
    },
}


def test_upstream_migration_round_trips_unchanged() -> None:
    migration = StorageVersionMigration.model_validate(UPSTREAM_MIGRATION)
    assert migration.spec.resource.resource == "secrets"
    assert migration.spec.continue_token == "eyJ2IjoibWV0YS5rOHMuaW8vdjEifQ"
    assert migration.status.conditions[0].last_update_time == T0
    wire = migration.to_wire()
    assert wire["spec"] == UPSTREAM_MIGRATION["spec"]
    assert wire["status"]["conditions"] == UPSTREAM_MIGRATION["status"]["conditions"]  # type: ignore[index]
    assert wire["metadata"] == UPSTREAM_MIGRATION["metadata"]


def test_our_status_fields_are_camel_case() -> None:
    migration = new_storage_version_migration(group="apps", version="v1", resource="deployments")
    migration.status.phase = "Running"
    migration.status.target_storage_version_hash = "8aSe+NMegvE="
    migration.status.progress = MigrationProgress(listed=3, rewritten=2, unchanged=1, chunks=1, remaining_item_count=7)
    migration.status.started_at = T0
    migration.status.failures = [ObjectFailure(namespace="ns", name="d", code=403, reason="Forbidden", message="no")]
    wire = migration.to_wire()
    assert wire["metadata"] == {"generateName": "deployments.apps-"}
    status = wire["status"]
    assert status["targetStorageVersionHash"] == "8aSe+NMegvE="
    assert status["progress"]["remainingItemCount"] == 7
    assert status["startedAt"] == "2026-11-22T03:58:31Z"
    assert status["failures"][0] == {
        "namespace": "ns",
        "name": "d",
        "code": 403,
        "reason": "Forbidden",
        "message": "no",
    }
    assert StorageVersionMigration.model_validate(wire) == migration


def test_storage_state_wire_form_and_names() -> None:
    assert storage_state_name("", "secrets") == "secrets"
    assert storage_state_name("apps", "deployments") == "deployments.apps"
    state = new_storage_state(group="", resource="configmaps")
    assert state.status.persisted_storage_version_hashes == [UNKNOWN]
    state.status.current_storage_version_hash = "qFsyl6wFWjQ="
    state.status.last_heartbeat_time = T0
    state.status.current_storage_version_hashes = [
        StorageVersionHash(
            reporter_id="apiserver-1",
            current_storage_version_hash="qFsyl6wFWjQ=",
            last_heartbeat_time=T0,
        )
    ]
    wire = state.to_wire()
    assert wire == {
        "apiVersion": "migration.k8s.io/v1alpha1",
        "kind": "StorageState",
        "metadata": {"name": "configmaps"},
        "spec": {"resource": {"group": "", "resource": "configmaps"}},
        "status": {
            "persistedStorageVersionHashes": ["Unknown"],
            "currentStorageVersionHash": "qFsyl6wFWjQ=",
            "lastHeartbeatTime": "2026-11-22T03:58:31Z",
            "currentStorageVersionHashes": [
                {
                    "reporterID": "apiserver-1",
                    "currentStorageVersionHash": "qFsyl6wFWjQ=",
                    "lastHeartbeatTime": "2026-11-22T03:58:31Z",
                }
            ],
        },
    }
    assert StorageState.model_validate(wire) == state


def test_times_are_utc_seconds() -> None:
    local = datetime(2026, 11, 22, 4, 58, 31, 999_999, tzinfo=timezone(timedelta(hours=1)))
    state = new_storage_state(group="", resource="secrets")
    state.status.last_heartbeat_time = local
    state = StorageState.model_validate(state.to_wire())
    assert state.status.last_heartbeat_time == T0


def test_unknown_metadata_is_kept_for_read_modify_write() -> None:
    doc = dict(
        UPSTREAM_MIGRATION,
        metadata={"name": "m", "managedFields": [{"manager": "kubectl"}]},
    )
    wire = StorageVersionMigration.model_validate(doc).to_wire()
    assert wire["metadata"]["managedFields"] == [{"manager": "kubectl"}]


def test_conditions_are_set_by_type_without_mutation() -> None:
    first = set_condition([], condition_type="Running", status="True", now=T0)
    assert phase_from_conditions(first) == "Running"
    later = T0 + timedelta(minutes=5)
    done = set_condition(first, condition_type="Running", status="False", now=later)
    done = set_condition(done, condition_type="Succeeded", status="True", now=later, reason="Completed")
    assert [c.type for c in done] == ["Running", "Succeeded"]
    assert first[0].status == "True"  # the input list is untouched
    assert is_condition_true(done, "Succeeded")
    assert not is_condition_true(done, "Running")
    condition = get_condition(done, "Succeeded")
    assert condition is not None and condition.reason == "Completed"
    assert phase_from_conditions(done) == "Succeeded"
    assert phase_from_conditions([]) == "Pending"
    failed = set_condition(done[:1], condition_type="Failed", status="True", now=later)
    assert phase_from_conditions(failed) == "Failed"
