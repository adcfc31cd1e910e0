"""The task store: every task, its events and its result, in PostgreSQL.

    store.py       Store (the queue, leases, events, results), open_store
    migrations.py  the schema `afs_store`, as numbered migrations applied on open
    codec.py       typed results to JSON and back (pure)

The store lives in the sandbox server's `postgres` database by default, or in
the team's own database named by AFS_STORE_URL (`store_url` in settings.yaml).
"""

from afs.store.store import TERMINAL, Store, StoredEvent, TaskRecord, TaskSubmission, open_store, store_url

__all__ = ["TERMINAL", "Store", "StoredEvent", "TaskRecord", "TaskSubmission", "open_store", "store_url"]
