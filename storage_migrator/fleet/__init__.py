"""Fleet: many clusters on one Prefect server (issue 20).

A cluster is named by a Prefect KubernetesClusterConfig block; left out, it is
the cluster of the environment (kubeconfig or in-cluster), named ``default``.
Its identity is the UID of its ``kube-system`` namespace, which a kubeconfig
cannot fake and a reinstall changes: a block whose kubeconfig now points at
another cluster fails the run before any write.

    deployments.py  a cluster's deployments: copies of the project's, with the cluster as parameter and tag
    identity.py     reading a cluster's identity, and judging it against the one recorded
    names.py        what is scoped by cluster: the write budget, run tags, artifact keys, deployments, the identity's record
    run_admission.py  whether a flow-run process may run what the Prefect API asks (issue 35): our flows only
    verdicts.py     one operation across clusters: a verdict per cluster, and their conjunction
"""
