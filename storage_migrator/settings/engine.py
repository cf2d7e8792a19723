"""The settings of which engine writes: ours, or the cluster's own migrator (issue 36, DESIGN 4.5 "Engines")."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

#: What an operator may ask for; `auto` resolves to one of the other two per run (docs/migrations.md).
EngineSetting = Literal["client", "in-tree", "auto"]


class EngineSettings(BaseModel):
    """Which engine rewrites the objects, and how long the in-tree one is waited for."""

    engine: EngineSetting = Field(
        default="client",
        description=(
            "Which engine rewrites the objects of a migration. `client`: this project's chunked "
            "no-op patches, paced by its write budget (seed 002). `in-tree`: kube-controller-manager's "
            "own migrator (`storagemigration.k8s.io`, v1 since Kubernetes 1.37, v1beta1 behind the "
            "StorageVersionMigrator gate in 1.35 and 1.36), driven and proven by this project; the "
            "workers then need no patch or update on any migrated resource (`storage-migrator rbac "
            "--engine in-tree`). `auto`: in-tree where the cluster serves the API and its controller is "
            "seen working (it picks up the migration's in-tree object within in_tree_pickup_seconds), "
            "and the resource is one it can migrate; else client, saying why. Default client: an upgrade "
            "of this project changes nothing, and the in-tree controller is not bound by the write budget "
            "(docs/migrations.md, 'Engines'). In pull mode the cluster's install sets it (the ConfigMap "
            "storage-migrator-cluster); a run cannot ask for another."
        ),
    )
    in_tree_pickup_seconds: float = Field(
        default=60.0,
        gt=0,
        description=(
            "How long a new in-tree migration may wait for kube-controller-manager to record its "
            "status.resourceVersion (which it does as soon as it sees one, before any write) before the "
            "controller counts as not working: `auto` then deletes it and uses the client engine, "
            "`in-tree` deletes it and fails the request naming the fix. Default 60 seconds: a working "
            "controller records it within seconds; the API can be served while its gate is off."
        ),
    )
    in_tree_recheck_seconds: float = Field(
        default=600.0,
        ge=0,
        description=(
            "After `auto` saw the in-tree controller not working (a request of ours records it), how long "
            "later runs use the client engine at once instead of waiting in_tree_pickup_seconds again. "
            "Default 600 seconds, one detection period: an `initialize` of many resources waits once, "
            "and a controller turned on is used within ten minutes. 0: always try again."
        ),
    )
    in_tree_poll_seconds: float = Field(
        default=5.0,
        gt=0,
        description=(
            "How often a run on the in-tree engine reads its in-tree migration and checks again that the "
            "API servers agree (storage version, and for a key's migration their encryption configuration): one "
            "task run of a few reads. Default 5 seconds: a gate lost mid-run stops the in-tree migration within "
            "it (the client engine checks between chunks, 50 s apart at 10 writes/s), and a run of hours costs "
            "our process little (docs/benchmarks.md, 'The two engines')."
        ),
    )
    in_tree_timeout_seconds: float = Field(
        default=86_400.0,
        gt=0,
        description=(
            "Longest a run waits for its in-tree migration to end, in seconds; then it deletes it and fails "
            "the request (kube-controller-manager stopped, or its controller switched off, mid-run). "
            "Default a day: at kube-controller-manager's default client limits the controller writes about "
            "50 objects a second, 4 million a day."
        ),
    )
