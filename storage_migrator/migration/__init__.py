"""Migration: rewriting every stored object of one resource, in chunks, resumably.

Seed 002's migration worker and seed 003's requests (DESIGN 4.5, 4.6): a
``StorageVersionMigration`` names a resource; its run lists it in chunks with
continue tokens (the checkpoint), writes each object back unchanged under one
write budget, and records failures by name, never by content.

    requests.py     StorageVersionMigration objects and their lifecycle
    targets.py      which resource a request names, checked against discovery
    dispatch.py     which pending requests run now (one at a time per resource)
    chunks.py       one chunk: a LIST page, then a no-op write of each item
    chunk_terms.py  what a chunk is asked and answers, and what ends a migration
    lookahead.py    the next page, asked for while this one is written
    failures.py     what is recorded of an object that could not be rewritten
    settling.py     a settling API server, and the one retry policy
    backoff.py      how long to wait before trying again
    pacing.py       what the chunk loop asks before each write; a token bucket
    write_budget.py the write budget's rule: who writes, at what share, who holds a request
    writer_leases.py  the writer Leases on the wire (coordination.k8s.io/v1)
    request_lease.py  a run's hold on its request: its Lease taken, renewed, counted, given back
    write_share.py  a writer's pace at its share, window by window
    engines.py      which engine writes: ours, or kube-controller-manager's (issue 36)
    in_tree_runs.py a run on the in-tree engine: its object, what its state means, our count
"""
