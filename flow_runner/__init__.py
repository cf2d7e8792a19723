"""`storage-migrator-run`: the flow-run process of every deployment of ours (issue 35).

Whoever holds the Prefect API can rewrite a deployment's entrypoint and pull steps and a run's
parameters, and `python -m prefect.engine` runs them as the API gives them. This runner is
the command of every flow-run process instead (the kubernetes pool's Job, `storage-migrator
worker`'s processes): it reads the flow run and its deployment, asks
`storage_migrator.fleet.run_admission.refusal`, and either marks the run Failed with the one
line that says why, or imports the flow from its own table (never from the API's pull steps
or storage) and runs it with Prefect's engine.

Above `flows` in the layers (it imports them); nothing imports it: the workers start it as a
command (`storage-migrator-run`, or `python -m flow_runner`).

    shipped.py   the flows the image ships (prefect.yaml's entrypoints), this install's directory and cluster
    main.py      the console script: read, decide, then fail the run or run the flow
"""
