"""Operations: what an operator reads and installs beside the flows.

DESIGN 4.10 and issues 12 and 14: ``storage-migrator status`` (one line per
resource), the Prometheus metrics computed at scrape time from the ledger and
the cluster, and the RBAC a migrator needs for exactly the resources it migrates.

    overview.py  one line per resource: what is stored, how its migration does
    metrics.py   the metrics collector
    rbac.py      the ClusterRole (and kube-system Role) a migrator needs
    flow_run_jobs.py  what a flow-run Job of the install is, and the admission policy refusing any other (issue 35)
"""
