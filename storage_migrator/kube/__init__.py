"""The Kubernetes access layer: one verb per module (STYLE "Do this" 1).

``connection`` builds clients, ``errors`` classifies failures (``answers`` reads
them from an HTTP answer), ``resources`` builds paths, ``transport`` sends
requests, ``discovery`` / ``listing`` / ``reading`` / ``writing`` are the verbs;
``crds`` reads a CustomResourceDefinition and computes the storage version hash;
``in_tree`` reads kube-controller-manager's own migrations (``storagemigration.k8s.io``).
Migrated objects stay raw JSON here.
"""
