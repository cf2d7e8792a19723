"""`storage-migrator rbac` against kubesim's discovery, piped to kubectl.

Issue 14 item 3: "`storage-migrator rbac [--resources secrets,configmaps]
[--no-put]` prints a ClusterRole for exactly the resources it will migrate".
kubesim authorizes every request, so this proves the role parses and applies as
written; that it suffices is for a cluster with RBAC (docs/cli.md says how).
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import Kubectl

from storage_migrator.cli import main
from storage_migrator.operations.rbac import CLUSTER_IDENTITY_RULES, FIXED_RULES

CLI = str(Path(sys.executable).with_name("storage-migrator"))


def _kubectl(kubectl: Kubectl, *args: str, stdin: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(kubectl.argv(*args), input=stdin, capture_output=True, text=True, timeout=60,
                          env=kubectl.env, check=False)  # fmt: skip


@pytest.fixture(scope="module")
def rotation_role(kubesim_session: Any) -> tuple[str, subprocess.CompletedProcess[str]]:
    """`storage-migrator rbac --resources secrets,configmaps`, the console script, once for both kubectls."""
    name = f"sm-rotation-{uuid.uuid4().hex[:6]}"
    made = subprocess.run(
        [CLI, "--kubeconfig", kubesim_session.kubeconfig, "rbac", "--resources", "secrets,configmaps", "--name", name],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return name, made


def test_the_role_for_a_key_rotation_pipes_into_kubectl_apply(
    rotation_role: tuple[str, subprocess.CompletedProcess[str]], kubectl: Kubectl
) -> None:
    name, made = rotation_role
    assert made.returncode == 0, made.stderr
    assert "STORAGE_MIGRATOR_INCLUDE_RESOURCES=configmaps,secrets" in made.stderr  # the workers' setting to match

    dry = _kubectl(kubectl, "apply", "--dry-run=client", "-f", "-", stdin=made.stdout)
    assert dry.returncode == 0, dry.stderr
    assert f"clusterrole.rbac.authorization.k8s.io/{name} created (dry run)" in dry.stdout
    assert f"clusterrolebinding.rbac.authorization.k8s.io/{name} created (dry run)" in dry.stdout

    applied = _kubectl(kubectl, "apply", "-f", "-", stdin=made.stdout)
    try:
        assert applied.returncode == 0, applied.stderr
        role = json.loads(kubectl("get", f"clusterroles.rbac.authorization.k8s.io/{name}", "-o", "json").stdout)
        assert role["rules"] == [
            {"apiGroups": [""], "resources": ["configmaps", "secrets"], "verbs": ["list", "patch"]},
            *(r.to_wire() for r in (*FIXED_RULES, *CLUSTER_IDENTITY_RULES)),
        ]
    finally:
        kubectl("delete", f"clusterroles.rbac.authorization.k8s.io/{name}",
                f"clusterrolebindings.rbac.authorization.k8s.io/{name}", "--ignore-not-found", check=False)  # fmt: skip


def test_unknown_resources_are_refused_by_name(kubesim: Any, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--kubeconfig", kubesim.kubeconfig, "rbac", "--resources", "secrets,sekrets,widgets.nowhere.io"])
    out, err = capsys.readouterr()
    assert code == 1 and out == ""
    assert "cannot grant migrating sekrets, widgets.nowhere.io" in err and "'<resource>.<group>' from: " in err


def test_json_and_table_carry_the_same_role(kubesim: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """Without --resources: every resource detection tracks on this cluster, from discovery."""
    assert main(["--kubeconfig", kubesim.kubeconfig, "rbac"]) == 0
    as_yaml = yaml.safe_load(capsys.readouterr().out)
    assert main(["--kubeconfig", kubesim.kubeconfig, "rbac", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == as_yaml
    rules = as_yaml["items"][0]["rules"]
    core = next(r for r in rules if r.get("apiGroups") == [""])
    assert {"secrets", "configmaps", "namespaces"} <= set(core["resources"])
    assert "namespaces/status" not in core["resources"]  # sub-resources are stored with their parent
    assert "tokenreviews" not in {res for r in rules for res in r.get("resources", [])}

    assert main(["--kubeconfig", kubesim.kubeconfig, "rbac", "--resources", "secrets", "-o", "table"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["GRANTED", "BY", "API", "GROUPS", "RESOURCES", "NON-RESOURCE", "URLS", "VERBS"]
    assert lines[1].split() == ["ClusterRole", '""', "secrets", "-", "list,patch"]
    # Issue 19: the API servers' identity Leases, in kube-system only; issue 37: the writer Leases, in the
    # install's namespace only.
    assert lines[-2].split() == ["Role", "in", "kube-system", "coordination.k8s.io", "leases", "-", "list"]
    assert lines[-1].split() == ["Role", "in", "storage-migrator", "coordination.k8s.io", "leases", "-",
                                 "list,create,update,patch,delete"]  # fmt: skip
    assert any("/metrics" in line for line in lines)


def test_the_admission_policy_is_shown_and_applies(kubesim: Any, kubectl: Kubectl,
                                                  capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """Issue 35: "`storage-migrator rbac` and the operator guide show the policy and say what it refuses"."""
    from storage_migrator.operations.flow_run_jobs import ADMISSION_POLICY, REFUSALS, admission_policy

    image = "registry.example.com/storage-migrator@sha256:" + "b" * 64
    base = ["--kubeconfig", kubesim.kubeconfig, "rbac", "--resources", "secrets"]
    assert main([*base, "--admission-policy"]) == 2  # the policy pins an image: usage error without one
    assert "--image" in capsys.readouterr().err
    assert main([*base, "--admission-policy", "--image", image]) == 0
    made = capsys.readouterr().out
    items = yaml.safe_load(made)["items"]
    assert items[-2:] == admission_policy(image)
    assert main([*base, "--admission-policy", "--image", image, "-o", "table"]) == 0
    table = capsys.readouterr().out
    for refusal in REFUSALS:
        assert refusal in table, refusal
    policies = [yaml.safe_dump(i) for i in items[-2:]]
    dry = _kubectl(kubectl, "apply", "--dry-run=server", "-f", "-", stdin="---\n".join(policies))
    assert dry.returncode == 0, dry.stderr
    assert f"validatingadmissionpolicy.admissionregistration.k8s.io/{ADMISSION_POLICY} created (server dry run)" in (
        dry.stdout
    )
