"""The service: stored tasks run by workers, and the HTTP API with live events.

    runner.py  run one claimed task: optimize, lease heartbeats, cancel, result to the store
    worker.py  claim tasks (FOR UPDATE SKIP LOCKED), recover the tasks of dead workers
    api.py     `afs serve`: Starlette on hypercorn under trio, SSE events, bearer token
    client.py  the HTTP client (`afs optimize --server URL`)
"""
