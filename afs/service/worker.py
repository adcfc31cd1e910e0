"""Workers: take queued tasks from the store, run them, recover the tasks of dead workers.

    async with open_runtime(settings, store_url, leasing=LEASING) as rt:
        await run_worker(rt, "worker-1", poll_s=LEASING.poll_s, stop=stop_event)

Claiming is `FOR UPDATE SKIP LOCKED`, so any number of workers on any number of
machines share one queue. A worker that dies stops renewing its lease; the next
worker that looks (`recover`) collects the task's forks and puts the task back in
the queue, or fails it with the reason once its attempts are spent. A task run by
the command that started it (`afs optimize` killed mid-task) is marked interrupted
instead: nobody asked a worker to run it, so none runs it again unasked.
"""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import structlog
import trio

from afs.config import LEASING, Leasing, Settings
from afs.errors import AfsError
from afs.optimize import AgentPool, new_task_id
from afs.router import load_rules
from afs.sandbox.forks import open_forks
from afs.service.pool import StorePool
from afs.service.runner import Runtime, collect_forks, relayed_cancellation, run_task
from afs.store import open_store

log = structlog.get_logger(__name__)

RECOVER_EVERY_MAX_S = 5.0  # a server without workers looks for expired leases at least this often
RECOVERY_RETRY_S = 30.0  # ... and tries again this late when it cannot reach the store or fork server


def worker_name(label: str = "worker") -> str:
    return f"{label}-{socket.gethostname()}-{os.getpid()}-{new_task_id()[:4]}"


@asynccontextmanager
async def open_runtime(settings: Settings, store_url: str, *, pool: AgentPool | None = None,
                       leasing: Leasing = LEASING) -> AsyncIterator[Runtime]:
    """A store connection and a fork server session, for one worker holding its tasks for
    `leasing.lease_s` (afs.config.Leasing); the agents' capacity is counted across every worker
    on the store unless `pool` says otherwise."""
    rules = load_rules(settings.routing_rules)
    async with open_store(store_url) as store, open_forks(settings) as forks:
        yield Runtime(settings, store, forks, rules, pool=pool or StorePool(store),
                      lease_s=leasing.lease_s)


async def recover(rt: Runtime, worker: str) -> list[tuple[str, str]]:
    """Settle the tasks of workers that stopped renewing their lease: forks collected, then
    re-queued (attempts left) or failed with the reason; a task its own command ran is
    interrupted. Returns (task id, new status)."""
    settled = []
    for task, holder in await rt.store.take_expired(worker, rt.lease_s):
        destroyed = await collect_forks(rt, task.id)
        if task.in_process:
            reason = (f"interrupted: the command that ran it ({holder}) stopped before it finished (it "
                      f"was killed, or hung); {len(destroyed)} fork(s) collected; `afs resume {task.id}`"
                      " runs it again")
        else:
            reason = (f"worker {holder} stopped renewing its lease (its process died or hung);"
                      f" {len(destroyed)} fork(s) collected")
        status = await rt.store.requeue_or_fail(task.id, worker, reason)
        log.warning("task_recovered", task_id=task.id, dead_worker=holder, status=status,
                    forks=destroyed)
        settled.append((task.id, status))
    return settled


async def run_worker(rt: Runtime, name: str, *, poll_s: float, stop: trio.Event | None = None,
                     max_tasks: int | None = None) -> int:
    """Take and run tasks until `stop` is set (or `max_tasks` ran), looking at the queue every
    `poll_s` while it is empty (`Leasing.poll_s`); returns how many ran."""
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


async def run_recoverer(rt: Runtime, name: str, *, every_s: float | None = None,
                        stop: trio.Event | None = None) -> None:
    """Only recovery, every `every_s` (default: half a lease, at most RECOVER_EVERY_MAX_S), until
    `stop`: what `afs serve --workers 0` runs, so a store whose workers are all on other
    machines still gets the tasks of dead workers back (forks collected, re-queued or failed)."""
    every = every_s if every_s is not None else min(rt.lease_s / 2, RECOVER_EVERY_MAX_S)
    stop = stop or trio.Event()
    log.info("recoverer_started", worker=name, every_s=every)
    while not stop.is_set():
        try:
            await recover(rt, name)
        except AfsError as exc:  # the store is away for a moment: look again next time
            log.warning("recovery_failed", error=str(exc))
        with trio.move_on_after(every):
            await stop.wait()


async def run_recovery(settings: Settings, store_url: str, leasing: Leasing) -> None:
    """`afs serve --workers 0`: a store connection and a fork server session for recovery only,
    until cancelled; when either cannot be opened, it says so and tries again later."""
    name = worker_name("serve-recovery")
    while True:
        try:
            async with relayed_cancellation() as work, open_runtime(settings, store_url,
                                                                    leasing=leasing) as rt:
                with work:
                    await run_recoverer(rt, name)
            return
        except AfsError as exc:
            log.warning("recovery_unavailable", error=str(exc), retry_s=RECOVERY_RETRY_S)
        await trio.sleep(RECOVERY_RETRY_S)
