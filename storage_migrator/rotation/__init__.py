"""Rotation: moving every encrypted object to a new encryption key, and proving it.

Seed 003 (OpenShift's storage migration for etcd encryption key rotation): other
components create requests named for the key (``secrets.v1-key.1``), read their
conditions, and treat a succeeded request as the record that the migration
happened. Issue 19 gates every write on every API server's configuration
(:mod:`storage_migrator.agreement.server_configs`).

    decisions.py    request names, what to do with each request
    proofs.py       which verification pass proves it under the configuration the servers run now (issue 39)
    verdict.py      whether it is proven, and what a person reads
    unreadable.py   what a refused read says about objects lost with a removed key (issue 39)
    runbook.py      the whole runbook as phases, and when a phase is reached
    etcd_values.py  what an etcd value says about how it is stored
    etcd_scan.py    a read-only count of the values under a prefix (verify-etcd)
"""
