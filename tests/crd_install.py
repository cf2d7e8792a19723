"""Our CRDs (deployments/crds/) into a cluster, and a cluster of its own with them, for every
tier: tests/conftest.py's session cluster, the integration tests' clusters of their own, and
the e2e tier's (whose `conftest` is tests/e2e/conftest.py, hence a module of its own)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CRD_DIR = Path(__file__).resolve().parents[1] / "deployments" / "crds"
#: The install's namespace (deployments/rbac/, the setting `namespace`): the runs' writer Leases live there.
INSTALL_NAMESPACE = "storage-migrator"


def install_migration_crds(api: Any) -> None:
    """`deployments/crds/` into a cluster (those already there are kept), served before returning, and
    the install's namespace, where each run holds its request's writer Lease (issue 37)."""
    import time

    import yaml
    from kubernetes import client as k8s

    try:
        k8s.CoreV1Api(api).create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=INSTALL_NAMESPACE)))
    except k8s.ApiException as exc:
        if exc.status != 409:
            raise

    ext = k8s.ApiextensionsV1Api(api)
    for path in sorted(CRD_DIR.glob("*.yaml")):
        try:
            ext.create_custom_resource_definition(yaml.safe_load(path.read_text()))
        except k8s.ApiException as exc:
            if exc.status != 409:
                raise
    custom = k8s.CustomObjectsApi(api)
    deadline = time.monotonic() + 30
    while True:
        try:
            custom.list_cluster_custom_object("migration.k8s.io", "v1alpha1", "storageversionmigrations")
            return
        except k8s.ApiException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@contextmanager
def cluster_with_crds(kubeconfig: Path) -> Iterator[Any]:
    """Another kubesim cluster over an etcd of its own, its kubeconfig written to `kubeconfig`,
    our CRDs served: a fleet's second cluster (issue 20)."""
    from kubernetes import config as k8s_config

    from kubesim.cluster import Cluster

    with Cluster() as other:
        other.write_kubeconfig(kubeconfig)
        with k8s_config.new_client_from_config(config_file=str(kubeconfig)) as api:
            install_migration_crds(api)
        yield other
