"""Running one stored task: the same `optimize` as ever, its events and result in the store.

    rt = Runtime(settings, store, forks, rules)
    task = await store.claim(worker, rt.lease_s)
    finished = await run_task(rt, task, worker)

While the task runs, its worker renews the lease (`Store.heartbeat`); a cancel
request or a lost lease cancels the work (agents destroy their forks, shielded).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import structlog
import trio
from psycopg import conninfo

from afs.brains.choose import open_squad
from afs.config import LEASING, Settings
from afs.errors import AfsError, ConfigError, InputError
from afs.events import Emitter, Sink, log_sink
from afs.forks.client import ForkClient
from afs.models import TaskResult
from afs.optimize import AgentPool, Crew, TaskRequest, optimize
from afs.router import RuleSet
from afs.sandbox.importer import sandbox_source
from afs.sandbox.server import dsn_for
from afs.store import Store, TaskRecord

log = structlog.get_logger(__name__)

CLEANUP_S = 15.0


@dataclass
class Runtime:
    """What a worker runs tasks with (one per worker: its own store connection and fork session)."""

    settings: Settings
    store: Store
    forks: ForkClient
    rules: RuleSet
    pool: AgentPool = field(default_factory=AgentPool)
    lease_s: float = LEASING.lease_s  # afs.config.Leasing
    # one spending cap shared by the tasks this runtime runs (a batch's: afs.brains.gemini.client.
    # SpendMeter); None: each task's squad has its own (gemini.max_spend_usd)
    meter: Any = None

    @property
    def heartbeat_s(self) -> float:
        return min(self.lease_s / 3, 0.5)


@dataclass(frozen=True)
class Finished:
    task_id: str
    status: str  # a terminal status, or "lost" (another worker owns it now) or "released"
    result: TaskResult | None = None
    error: str | None = None
    bad_input: bool = False  # failed on the task's own input (the CLI exits 2)


def source_dsn(settings: Settings, source: str) -> str:
    """Where a task reads its source database: the sandbox, or AFS_SOURCE_SERVER_URL."""
    if settings.source_server_url:
        return conninfo.make_conninfo(settings.source_server_url, dbname=source)
    return dsn_for(settings, source)


async def _optimize(rt: Runtime, task: TaskRecord, events: Emitter,
                    direct_dsn: str | None = None) -> TaskResult:
    source = task.source or await sandbox_source(rt.forks, rt.settings.demo_database, task.dsn)
    request = TaskRequest(query=task.query, task_type=task.task_type,  # type: ignore[arg-type]
                          priority=task.priority, runs=task.runs, weights=task.weights,
                          parameters=task.parameters)
    async with open_squad(task.provider, rt.settings, rt.settings.environment, meter=rt.meter) as squad:
        return await optimize(rt.settings, request, source=source,
                              source_dsn=direct_dsn or source_dsn(rt.settings, source),
                              crew=Crew(forks=rt.forks, squad=squad, rules=rt.rules, pool=rt.pool),
                              events=events)


@asynccontextmanager
async def relayed_cancellation() -> AsyncIterator[trio.CancelScope]:
    """For work whose sessions (the MCP fork client, the store) must outlive a cancellation.

        async with relayed_cancellation() as work_scope, open_runtime(...) as rt:
            with work_scope:
                await run_worker(rt, ...)

    The body runs shielded; a cancellation from outside (Ctrl-C, a server stopping)
    cancels `work_scope` instead, so the work stops while the sessions it cleans up
    with (destroying forks, giving the task back) are still there.
    """
    work = trio.CancelScope()

    async def relay() -> None:
        try:
            await trio.sleep_forever()
        finally:
            work.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(relay)
        with trio.CancelScope(shield=True):
            yield work
        nursery.cancel_scope.cancel()


async def collect_forks(rt: Runtime, task_id: str) -> list[str]:
    """Destroy whatever forks of the task are still alive (recorded in the store, or named for
    the task on the fork server), and record them as gone; returns the names destroyed."""
    recorded = {f["name"] for f in await rt.store.forks(live=True, task_id=task_id)}
    alive: set[str] | None = None
    try:  # a fork made just before its event reached the store carries the task id in its name
        alive = {f["name"] for f in (await rt.forks.list_services())["forks"]}
    except AfsError as exc:
        log.warning("fork_list_failed", error=str(exc))
    targets = recorded if alive is None else (recorded & alive) | {
        n for n in alive if f"-task{task_id}-" in n}
    destroyed = []
    for name in sorted(targets):
        try:
            await rt.forks.destroy(name)
            destroyed.append(name)
        except AfsError as exc:
            log.warning("fork_destroy_failed", fork=name, error=str(exc))
    vanished = recorded - alive if alive is not None else set()  # closed by their agents
    await rt.store.forks_destroyed(sorted(vanished | set(destroyed)))
    return destroyed


async def _keep_lease(rt: Runtime, task_id: str, worker: str, work: trio.CancelScope,
                      stop: list[str], events: Emitter) -> None:
    while True:
        await trio.sleep(rt.heartbeat_s)
        try:
            state = await rt.store.heartbeat(task_id, worker, rt.lease_s)
        except AfsError as exc:
            log.warning("heartbeat_failed", error=str(exc))
            continue
        if state != "ok":
            stop.append(state)
            if state == "cancel":
                events.emit("task_cancelling")
            work.cancel()
            return


async def run_task(rt: Runtime, task: TaskRecord, worker: str, sinks: tuple[Sink, ...] = (),
                   on_interrupt: Literal["cancel", "release"] = "release",
                   direct_dsn: str | None = None) -> Finished:
    """Run a task this worker has claimed, to its end; the store has everything on return.

    `direct_dsn` overrides where the source is read (in-process runs against another fork
    server read the database itself; the DSN, password included, is never stored).

    Cancelled from outside (Ctrl-C, a server shutting down), the task is given back to the
    queue (`release`) or recorded as cancelled (`cancel`) before the cancellation goes on.
    """
    with structlog.contextvars.bound_contextvars(task_id=task.id, worker=worker):
        finished: Finished | None = None
        try:
            finished = await _run(rt, task, worker, sinks, direct_dsn)
        finally:
            if finished is None:  # cancelled (the Cancelled may come wrapped in a group), or a bug
                with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_S):
                    await _hand_back(rt, task.id, worker, on_interrupt)
        return finished


async def _hand_back(rt: Runtime, task_id: str, worker: str,
                     on_interrupt: Literal["cancel", "release"]) -> None:
    """Give the task back (or record it cancelled). Tried twice: the server-side cancel of the
    statement that was interrupted can land on the next one; if both fail, its lease runs out
    and another worker recovers it."""
    for attempt in (1, 2):
        try:
            if on_interrupt == "release":
                await rt.store.release(task_id, worker, "the worker stopped")
            else:
                await rt.store.finish(task_id, worker, status="cancelled", error="interrupted")
            return
        except AfsError as exc:
            log.warning("task_hand_back_failed", attempt=attempt, error=str(exc))
            await trio.sleep(0.2)


async def _run(rt: Runtime, task: TaskRecord, worker: str, sinks: tuple[Sink, ...],
               direct_dsn: str | None = None) -> Finished:
    result: TaskResult | None = None
    error: str | None = None
    bad_input = False
    stop: list[str] = []
    async with rt.store.recording(worker) as record:
        events = Emitter(task.id, sinks=(log_sink, record, *sinks))
        async with trio.open_nursery() as nursery:
            with trio.CancelScope() as work:
                nursery.start_soon(_keep_lease, rt, task.id, worker, work, stop, events)
                try:
                    result = await _optimize(rt, task, events, direct_dsn)
                except (InputError, ConfigError) as exc:
                    error, bad_input = str(exc), True
                except AfsError as exc:
                    error = str(exc)
                if error is not None:
                    events.emit("task_failed", error=error)
            nursery.cancel_scope.cancel()
    if stop and stop[0] == "lost":
        log.warning("lease_lost")
        return Finished(task.id, "lost", error="the lease was lost: another worker took the task over")
    if stop and stop[0] == "cancel":
        status, result, error = "cancelled", None, "cancelled on request"
    elif result is not None:
        status, error = result.status, result.error
    else:
        status = "failed"
    with trio.move_on_after(CLEANUP_S):
        await collect_forks(rt, task.id)  # the agents closed theirs; this records it, or finishes it
    written = await rt.store.finish(task.id, worker, status=status, result=result, error=error)
    if not written:
        return Finished(task.id, "lost", error="the lease was lost before the result was written")
    return Finished(task.id, status, result, error, bad_input)
