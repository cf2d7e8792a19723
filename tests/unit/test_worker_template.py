"""`storage-migrator worker --type kubernetes` builds every Job from the install's template and image
(issue 35), and refuses to start on a template that would not be the install's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from storage_migrator.cli.workers import TemplateError, install_template

SHIPPED = Path(__file__).resolve().parents[2] / "deployments" / "work-pool" / "kubernetes.json"
IMAGE = "registry.example.com/storage-migrator@sha256:" + "c" * 64


def _container(template: dict[str, object]) -> dict[str, object]:
    return template["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]["containers"][0]  # type: ignore[index, no-any-return]


def test_the_install_image_goes_into_the_shipped_template() -> None:
    template = install_template(SHIPPED, IMAGE)
    assert _container(template)["image"] == IMAGE
    assert _container(template)["command"] == ["storage-migrator-run"]


def test_a_template_without_an_image_or_another_command_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TemplateError, match="names no image: give --image"):
        install_template(SHIPPED, None)  # the kustomize name only: the install's ConfigMap gives the image
    other = json.loads(SHIPPED.read_text())
    _container(other)["command"] = ["python", "-m", "prefect.engine"]
    (tmp_path / "t.json").write_text(json.dumps(other))
    with pytest.raises(TemplateError, match="does not start storage-migrator-run"):
        install_template(tmp_path / "t.json", IMAGE)
    with pytest.raises(TemplateError, match="cannot read the job template"):
        install_template(tmp_path / "missing.json", IMAGE)
