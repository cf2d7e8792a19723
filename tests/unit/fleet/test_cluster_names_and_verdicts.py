"""Issue 20: "The cluster's identity is the UID of the kube-system namespace ... A block whose
identity changed (its kubeconfig now points at another cluster) fails the run before any
write, and the message names both identities." And "everything scoped by cluster"."""

from __future__ import annotations

import pytest

from storage_migrator.fleet.identity import IdentityVerdict, judge_identity
from storage_migrator.fleet.names import budget_limit_name, cluster_tag, identity_variable

A, B = "6f1c2d3e-0000-4000-8000-00000000000a", "6f1c2d3e-0000-4000-8000-00000000000b"


def test_first_seen_is_recorded_same_goes_on_changed_names_both() -> None:
    assert judge_identity("prod-eu", recorded=None, observed=A)[0] is IdentityVerdict.FIRST_SEEN
    assert judge_identity("prod-eu", recorded=A, observed=A)[0] is IdentityVerdict.SAME
    verdict, message = judge_identity("prod-eu", recorded=A, observed=B)
    assert verdict is IdentityVerdict.CHANGED
    assert A in message and B in message and "'prod-eu'" in message
    assert "Nothing was written" in message and "prefect variable delete storage-migrator-cluster-prod-eu" in message


def test_the_default_cluster_keeps_todays_names_a_named_one_gets_its_own() -> None:
    assert budget_limit_name("storage-migrator-writes", None) == "storage-migrator-writes"
    assert budget_limit_name("storage-migrator-writes", "default") == "storage-migrator-writes"
    assert budget_limit_name("storage-migrator-writes", "prod-eu") == "storage-migrator-writes-prod-eu"
    assert (cluster_tag(None), cluster_tag("prod-eu")) == ("cluster:default", "cluster:prod-eu")


@pytest.mark.parametrize("name", ["Prod", "prod_eu", "-prod", "", "prod eu"])
def test_a_name_prefect_would_not_give_a_block_is_refused_never_mapped(name: str) -> None:
    """Mapping `Prod` and `prod` to one name would give two clusters one budget and one identity record."""
    with pytest.raises(ValueError, match="KubernetesClusterConfig block name"):
        identity_variable(name)
