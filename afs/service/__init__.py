"""The service: stored tasks run by workers, and the HTTP API with live events.

    runner.py  run one claimed task: optimize, lease heartbeats, cancel, result to the store
    worker.py  claim tasks (FOR UPDATE SKIP LOCKED), recover the tasks of dead workers
    api.py     the task API of `afs serve` (Starlette, SSE events, bearer token); afs.serve
               assembles it with the apply route, the monitor, workers and schedules
    pool.py    the agents' load across every worker on one store (the router's capacity)
    client.py  the HTTP client (`afs optimize --server URL`)
"""
