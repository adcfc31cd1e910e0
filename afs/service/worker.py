"""Workers: take queued tasks from the store, run them, recover the tasks of dead workers.

    async with open_runtime(settings, store_url) as rt:
        await run_worker(rt, "worker-1", stop=stop_event)

Claiming is `FOR UPDATE SKIP LOCKED`, so any number of workers on any number of
machines share one queue. A worker that dies stops renewing its lease; the next
worker that looks (`recover`) collects the task's forks and puts the task back in
the queue, or fails it with the reason once its attempts are spent.
"""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import structlog
import trio

from afs.config import Settings
from afs.forks.client import open_fork_client
from afs.optimize import AgentPool, new_task_id
from afs.router import load_rules
from afs.service.pool import StorePool
from afs.service.runner import DEFAULT_LEASE_S, Runtime, collect_forks, run_task
from afs.store import open_store

log = structlog.get_logger(__name__)

DEFAULT_POLL_S = 0.5


def worker_name(label: str = "worker") -> str:
    return f"{label}-{socket.gethostname()}-{os.getpid()}-{new_task_id()[:4]}"


@asynccontextmanager
async def open_runtime(settings: Settings, store_url: str, *, pool: AgentPool | None = None,
                       lease_s: float = DEFAULT_LEASE_S) -> AsyncIterator[Runtime]:
    """A store connection and a fork server session, for one worker; the agents' capacity is
    counted across every worker on the store unless `pool` says otherwise."""
    rules = load_rules(settings.routing_rules)
    async with open_store(store_url) as store, open_fork_client(settings) as forks:
        yield Runtime(settings, store, forks, rules, pool=pool or StorePool(store), lease_s=lease_s)


async def recover(rt: Runtime, worker: str) -> list[tuple[str, str]]:
    """Settle the tasks of workers that stopped renewing their lease: forks collected, then
    re-queued (attempts left) or failed with the reason. Returns (task id, new status)."""
    settled = []
    for task, holder in await rt.store.take_expired(worker, rt.lease_s):
        destroyed = await collect_forks(rt, task.id)
        reason = (f"worker {holder} stopped renewing its lease (its process died or hung);"
                  f" {len(destroyed)} fork(s) collected")
        status = await rt.store.requeue_or_fail(task.id, worker, reason)
        log.warning("task_recovered", task_id=task.id, dead_worker=holder, status=status,
                    forks=destroyed)
        settled.append((task.id, status))
    return settled


async def run_worker(rt: Runtime, name: str, *, stop: trio.Event | None = None,
                     poll_s: float = DEFAULT_POLL_S, max_tasks: int | None = None) -> int:
    """Take and run tasks until `stop` is set (or `max_tasks` ran); returns how many ran."""
    stop = stop or trio.Event()
    ran = 0
    log.info("worker_started", worker=name)
    while not stop.is_set() and (max_tasks is None or ran < max_tasks):
        await recover(rt, name)
        task = await rt.store.claim(name, rt.lease_s)
        if task is None:
            with trio.move_on_after(poll_s):
                await stop.wait()
            continue
        await run_task(rt, task, name)
        ran += 1
    return ran
