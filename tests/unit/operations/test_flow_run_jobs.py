"""The admission policy shipped in deployments/ is the one storage_migrator builds (issue 35)."""

from __future__ import annotations

from pathlib import Path

import yaml

from storage_migrator.operations.flow_run_jobs import (
    ADMISSION_POLICY,
    IMAGE_PLACEHOLDER,
    REFUSALS,
    RUN_ENVIRONMENT,
    admission_policy,
)

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = ROOT / "deployments" / "admission" / "flow-run-jobs.yaml"


def test_the_shipped_file_is_the_built_policy_with_the_image_placeholder() -> None:
    assert [d for d in yaml.safe_load_all(SHIPPED.read_text()) if d] == admission_policy(IMAGE_PLACEHOLDER)
    kustomization = yaml.safe_load((ROOT / "deployments" / "kustomization.yaml").read_text())
    assert "admission/flow-run-jobs.yaml" in kustomization["resources"]


def test_the_image_is_a_cel_string_kustomize_can_replace_between_its_quotes() -> None:
    image = "registry.example.com/storage-migrator@sha256:" + "0" * 64
    policy, binding = admission_policy(image)
    [variable] = [v for v in policy["spec"]["variables"] if v["name"] == "image"]
    assert variable["expression"].split("'") == ["", image, ""]  # kustomization.yaml: delimiter "'", index 1
    assert binding["spec"] == {"policyName": ADMISSION_POLICY, "validationActions": ["Deny"]}
    assert policy["spec"]["failurePolicy"] == "Fail"


def test_each_refusal_is_said_and_the_environment_is_what_prefects_worker_sets() -> None:
    policy, _ = admission_policy()
    assert tuple(v["message"] for v in policy["spec"]["validations"]) == REFUSALS
    # BaseJobConfiguration.prepare_for_flow_run (Prefect 3.9.1): the flow run and attribution variables.
    from prefect.workers.base import BaseJobConfiguration

    assert set(BaseJobConfiguration._base_flow_run_environment(_Run())) <= set(RUN_ENVIRONMENT)  # type: ignore[arg-type]
    assert set(BaseJobConfiguration._base_attribution_environment(
        flow_run=_Run(), deployment=_Named(), flow=_Named(), worker_id=_Run.id, worker_name="w"  # type: ignore[arg-type]
    )) <= set(RUN_ENVIRONMENT)  # fmt: skip


class _Run:
    id = "00000000-0000-0000-0000-000000000001"
    flow_id = "00000000-0000-0000-0000-000000000002"
    deployment_id = "00000000-0000-0000-0000-000000000003"


class _Named:
    name = "n"
