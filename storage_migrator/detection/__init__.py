"""Detection: when a resource needs a migration, and what may still be in etcd.

Seed 000's storage migration triggering controller (DESIGN 4.3, 4.7, 4.8): poll
discovery every 10 minutes, compare each resource's storage version hash with its
StorageState, create or cancel migrations, refine ``persistedStorageVersionHashes``
when one completes, and delete finished requests after a while (seed 003).
``initialize`` is the same poll's first look (issue 24).

    observation.py   what one poll reads of the cluster, read in one place
    tracking.py      which discovered resources have a storage of their own
    planner.py       the pure decision for every resource (seed 000's rules, HA)
    status_draft.py  one StorageState's new status, rule by rule (record, settle, refine)
    rules.py         detection's labels, annotations, knobs and retry back-off
    actions.py       the typed actions of one poll, and the plan that orders them
    poll.py          everything one poll decides, as one function
    initializer.py   the first look at every resource
    changes.py       what a poll changed, as typed records for events
    states.py        reading and writing StorageState objects
    retention.py     which finished requests the poll deletes
    ordering.py      which migration came after a switch: by resourceVersion (issue 36)
    in_tree.py       storagemigration.k8s.io migrations anyone made: held requests, news (issue 36)
"""
