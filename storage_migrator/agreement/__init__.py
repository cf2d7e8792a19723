"""Agreement: whether every API server would write what the migration is about.

Seed 000's HA extension (per-reporter hashes) and seed 001's StorageVersion API
(DESIGN 4.4): a migration starts only when every API server encodes a resource
in one version, and aborts when they stop agreeing. Issue 19 adds the same gate
for a key rotation: every API server runs one encryption configuration.

    reporters.py         who reports which storage version hash (seed 000, HA)
    storage_versions.py  the sources of agreement and the verdict: go, abort, rerun
    apiservers.py        hearing every API server: the best source the cluster offers
    server_configs.py    which encryption configuration every API server runs
    storageversion_api.py   reading StorageVersion objects (seed 001, as shipped)
    identity_leases.py      reading the API servers' identity Leases: who is alive
    server_metrics.py       reading one server's encryption configuration from /metrics
"""
