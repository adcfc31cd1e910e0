"""The task store: tasks, their events and everything their reports show, in PostgreSQL.

    async with open_store(url) as store:         # migrations applied on open
        task = await store.submit(TaskSubmission(task_id, query, "afs_demo", None, ...))
        task = await store.claim("worker-1", lease_s=30)      # FOR UPDATE SKIP LOCKED
        async with store.recording() as sink:                  # events, as they happen
            ...Emitter(task.id, sinks=(log_sink, sink))...
        await store.finish(task.id, "worker-1", result)        # result, report, tables

A task's life: queued → running (a worker holds its lease and renews it) →
completed | no_improvement | failed | cancelled. A running task whose lease
expired belongs to a process that died: `take_expired` moves it to
`recovering` (the recoverer's lease), its forks are collected, then
`requeue_or_fail` puts it back in the queue or fails it with the reason. A task
run by the command that started it (`in_process`: `afs optimize`, `afs batch`,
`afs resume`) is not the queue's: when that process dies it is `interrupted`,
never run again unasked (`afs resume` runs it again).
Every write that changes a task is one transaction; a worker's writes are
fenced by its name (a worker that lost its lease writes nothing).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

import psycopg
import structlog
import trio
from psycopg.types.json import Jsonb

from afs.config import Settings
from afs.db import Connection, connect_sync, open_connection, translate
from afs.errors import AfsError, InputError, UnknownTaskError, scrub
from afs.events import Event, Sink
from afs.models import RoutingDecision, StatementParameters, TaskResult
from afs.report import to_json
from afs.store.codec import decode, encode
from afs.store.migrations import AGENTS_LOCK_KEY, EVENTS_CHANNEL, LOCK_KEY, MIGRATIONS, SCHEMA

log = structlog.get_logger(__name__)

TERMINAL = ("completed", "no_improvement", "failed", "cancelled", "interrupted")
RESUMABLE = ("failed", "cancelled", "interrupted")
STATUSES = ("queued", "running", "recovering", *TERMINAL)
_COLUMNS = ("id, status, query, source, dsn, task_type, priority, provider, weights, runs, created_at,"
            " updated_at, started_at, finished_at, worker, lease_expires_at, attempts, max_attempts,"
            " cancel_requested, error, parameters, in_process")
_T_COLUMNS = ", ".join("t." + c.strip() for c in _COLUMNS.split(","))
_QUEUE_ORDER = "CASE priority WHEN 'high' THEN 0 WHEN 'normal' THEN 1 ELSE 2 END, created_at"
Heartbeat = Literal["ok", "cancel", "lost"]


@dataclass(frozen=True)
class TaskSubmission:
    """A task as it is queued (`Store.submit`): its id, the query and where it runs (a sandbox
    database `source`, or the `dsn` whose sandbox copy it finds; stored without its password),
    what was asked (type, priority, provider, consensus weights, runs) and the parameter sets
    every proposal is measured on (the first is `query`'s values; None: the query's own)."""

    task_id: str
    query: str
    source: str | None
    dsn: str | None
    task_type: str
    priority: str
    provider: str
    weights: Mapping[str, float] | None
    runs: int
    parameters: StatementParameters | None = None


@dataclass(frozen=True)
class TaskRecord:
    id: str
    status: str
    query: str
    source: str | None
    dsn: str | None
    task_type: str
    priority: str
    provider: str
    weights: Mapping[str, float] | None
    runs: int
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    worker: str | None
    lease_expires_at: datetime | None
    attempts: int
    max_attempts: int
    cancel_requested: bool
    error: str | None
    parameters: StatementParameters | None = None  # explicit parameter sets (a batch task's)
    in_process: bool = False  # run by the command that started it, not by a worker from the queue

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL

    def public(self) -> dict[str, Any]:
        """The task as the API and `--json` show it (no DSN password: only the sandbox copy is named)."""
        return {
            "id": self.id, "status": self.status, "query": self.query, "source": self.source,
            "dsn": None if self.dsn is None else scrub(self.dsn),
            "type": self.task_type, "priority": self.priority, "provider": self.provider,
            "weights": dict(self.weights) if self.weights else None, "runs": self.runs,
            "created_at": _iso(self.created_at), "updated_at": _iso(self.updated_at),
            "started_at": _iso(self.started_at), "finished_at": _iso(self.finished_at),
            "worker": self.worker, "lease_expires_at": _iso(self.lease_expires_at),
            "attempts": self.attempts, "cancel_requested": self.cancel_requested, "error": self.error,
            "parameters": None if self.parameters is None else encode(self.parameters),
            "in_process": self.in_process,
        }


@dataclass(frozen=True)
class StoredEvent:
    id: int
    task_id: str
    at: datetime
    kind: str
    agent: str | None
    fork: str | None
    duration_s: float | None
    data: Mapping[str, Any]

    def public(self) -> dict[str, Any]:
        return {"id": self.id, "task_id": self.task_id, "at": _iso(self.at), "kind": self.kind,
                "agent": self.agent, "fork": self.fork, "duration_s": self.duration_s,
                "data": dict(self.data)}


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _task(row: Sequence[Any]) -> TaskRecord:
    *columns, parameters, in_process = row
    return TaskRecord(*columns, parameters=None if parameters is None  # type: ignore[misc]
                      else decode(StatementParameters, parameters), in_process=in_process)


Tx = psycopg.Connection[Any]


def _transaction(conn: Tx, fn: Any) -> Any:
    """Run fn(cursor) in one transaction on an autocommit connection."""
    try:
        with conn.transaction(), conn.cursor() as cur:
            return fn(cur)
    except psycopg.Error as exc:
        raise translate(exc) from exc


class EventListener:
    """A connection that LISTENs on the events' channel: `wait_for(task_id)` returns when an
    event of that task was appended (by any process).

    The wait is trio's own (the socket becoming readable), so it is cancelled like any trio
    sleep; the notifications are read without blocking once they are there.
    """

    def __init__(self, raw: psycopg.Connection[Any]) -> None:
        self.raw = raw

    def _drain(self) -> set[str]:
        try:
            return {n.payload for n in self.raw.notifies(timeout=0)}
        except psycopg.Error as exc:
            raise translate(exc) from exc

    async def wait_for(self, task_id: str) -> None:
        """Until an event of `task_id` is notified (the caller bounds it: `move_on_after`);
        DatabaseError when the listening connection is lost."""
        while True:
            try:
                fd = self.raw.fileno()
            except psycopg.Error as exc:  # closed after an error
                raise translate(exc) from exc
            await trio.lowlevel.wait_readable(fd)
            if task_id in self._drain():
                return


class Store:
    """One connection to the store; every method is one short transaction."""

    def __init__(self, conn: Connection, url: str | None = None) -> None:
        self.conn = conn
        self.url = url  # where `listen` opens its own connection

    async def _tx(self, fn: Any) -> Any:
        return await self.conn.run(lambda raw: _transaction(raw, fn))

    # -- schema ------------------------------------------------------------------------
    async def migrate(self) -> list[int]:
        """Apply the migrations this database has not seen; returns their versions."""
        def apply(cur: psycopg.Cursor[Any]) -> list[int]:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (LOCK_KEY,))
            cur.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
            cur.execute(f"CREATE TABLE IF NOT EXISTS {SCHEMA}.migrations (version integer PRIMARY KEY,"
                        " name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())")
            cur.execute(f"SELECT version FROM {SCHEMA}.migrations")
            done = {row[0] for row in cur.fetchall()}
            applied = []
            for migration in MIGRATIONS:
                if migration.version in done:
                    continue
                cur.execute(migration.sql.encode())
                cur.execute(f"INSERT INTO {SCHEMA}.migrations (version, name) VALUES (%s, %s)",
                            (migration.version, migration.name))
                applied.append(migration.version)
            return applied
        result: list[int] = await self._tx(apply)
        return result

    # -- the queue ---------------------------------------------------------------------
    async def submit(self, new: TaskSubmission, *, max_attempts: int = 2, worker: str | None = None,
                     lease_s: float = 30.0) -> TaskRecord:
        """Queue a task; with `worker`, that worker holds it at once: a task run in the process
        that submits it (`in_process`), interrupted rather than re-queued if that process dies.

        A `dsn` is stored without its password: it only finds the database's sandbox copy.
        """
        task_id, query, source, dsn = new.task_id, new.query, new.source, new.dsn
        task_type, priority, provider, weights = new.task_type, new.priority, new.provider, new.weights
        runs, parameters = new.runs, new.parameters

        def insert(cur: psycopg.Cursor[Any]) -> TaskRecord:
            cur.execute(
                f"INSERT INTO {SCHEMA}.tasks (id, status, query, source, dsn, task_type, priority,"
                " provider, weights, runs, max_attempts, worker, lease_expires_at, attempts, started_at,"
                " parameters, in_process) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s,"
                " CASE WHEN %s THEN now() + make_interval(secs => %s) END, %s,"
                f" CASE WHEN %s THEN now() END, %s, %s) RETURNING {_COLUMNS}",
                (task_id, "queued" if worker is None else "running", query, source,
                 None if dsn is None else scrub(dsn), task_type,
                 priority, provider, None if weights is None else Jsonb(dict(weights)), runs,
                 max_attempts, worker, worker is not None, lease_s, int(worker is not None),
                 worker is not None, None if parameters is None else Jsonb(encode(parameters)),
                 worker is not None))
            task = _task(_one(cur))
            _event(cur, Event("task_queued", task.id, data={"priority": priority, "type": task_type}))
            if worker is not None:
                _event(cur, Event("task_started", task.id, data={"worker": worker, "attempt": 1}))
            return task
        task: TaskRecord = await self._tx(insert)
        return task

    async def claim(self, worker: str, lease_s: float, task_id: str | None = None,
                    in_process: bool = False) -> TaskRecord | None:
        """Take the next queued task (or that one), with a lease; None when there is none.
        `in_process`: a command runs it itself (`afs resume`), not a worker of the queue."""
        def take(cur: psycopg.Cursor[Any]) -> TaskRecord | None:
            which = "id = %s AND" if task_id is not None else ""
            params: tuple[Any, ...] = (task_id,) if task_id is not None else ()
            cur.execute(
                f"UPDATE {SCHEMA}.tasks SET status = 'running', worker = %s,"
                " lease_expires_at = now() + make_interval(secs => %s), attempts = attempts + 1,"
                " started_at = coalesce(started_at, now()), updated_at = now(), in_process = %s"
                f" WHERE id = (SELECT id FROM {SCHEMA}.tasks WHERE {which} status = 'queued'"
                f" ORDER BY {_QUEUE_ORDER} LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING {_COLUMNS}",
                (worker, lease_s, in_process, *params))
            row = cur.fetchone()
            if row is None:
                return None
            task = _task(row)
            _event(cur, Event("task_started", task.id, data={"worker": worker, "attempt": task.attempts}))
            return task
        task: TaskRecord | None = await self._tx(take)
        return task

    async def heartbeat(self, task_id: str, worker: str, lease_s: float) -> Heartbeat:
        """Renew the lease: "ok", "cancel" (someone asked to cancel it) or "lost" (not ours any more)."""
        def renew(cur: psycopg.Cursor[Any]) -> Heartbeat:
            cur.execute(
                f"UPDATE {SCHEMA}.tasks SET lease_expires_at = now() + make_interval(secs => %s)"
                " WHERE id = %s AND worker = %s AND status = 'running' RETURNING cancel_requested",
                (lease_s, task_id, worker))
            row = cur.fetchone()
            return "lost" if row is None else "cancel" if row[0] else "ok"
        state: Heartbeat = await self._tx(renew)
        return state

    async def finish(self, task_id: str, worker: str, *, status: str, result: TaskResult | None = None,
                     error: str | None = None) -> bool:
        """Record the end of a task (its result and every table the report reads) in one
        transaction; False when the worker no longer holds the task (nothing is written)."""
        def write(cur: psycopg.Cursor[Any]) -> bool:
            cur.execute(f"SELECT 1 FROM {SCHEMA}.tasks WHERE id = %s AND worker = %s"
                        " AND status IN ('running', 'recovering') FOR UPDATE", (task_id, worker))
            if cur.fetchone() is None:
                return False
            cur.execute(f"DELETE FROM {SCHEMA}.agent_assignments WHERE task_id = %s", (task_id,))
            if result is not None:
                _write_result(cur, result)
            cur.execute(
                f"UPDATE {SCHEMA}.tasks SET status = %s, error = %s, result = %s, report = %s,"
                " finished_at = now(), updated_at = now(), worker = NULL, lease_expires_at = NULL"
                " WHERE id = %s",
                (status, error, None if result is None else Jsonb(encode(result)),
                 None if result is None else Jsonb(to_json(result)), task_id))
            _event(cur, Event("task_finished", task_id, data={"status": status, "error": error}))
            return True
        done: bool = await self._tx(write)
        return done

    async def cancel(self, task_id: str) -> TaskRecord:
        """A queued task is cancelled at once; a running one when its worker next renews its lease."""
        def mark(cur: psycopg.Cursor[Any]) -> TaskRecord:
            cur.execute(f"SELECT status FROM {SCHEMA}.tasks WHERE id = %s FOR UPDATE", (task_id,))
            row = cur.fetchone()
            if row is None:
                raise UnknownTaskError(task_id)
            if row[0] == "queued":
                cur.execute(f"UPDATE {SCHEMA}.tasks SET status = 'cancelled', finished_at = now(),"
                            " updated_at = now(), error = 'cancelled before it started' WHERE id = %s",
                            (task_id,))
                _event(cur, Event("task_finished", task_id, data={"status": "cancelled"}))
            elif row[0] in ("running", "recovering"):
                cur.execute(f"UPDATE {SCHEMA}.tasks SET cancel_requested = true, updated_at = now()"
                            " WHERE id = %s", (task_id,))
                _event(cur, Event("cancel_requested", task_id))
            cur.execute(f"SELECT {_COLUMNS} FROM {SCHEMA}.tasks WHERE id = %s", (task_id,))
            return _task(_one(cur))
        task: TaskRecord = await self._tx(mark)
        return task

    async def take_expired(self, worker: str, lease_s: float) -> list[tuple[TaskRecord, str | None]]:
        """Tasks whose holder stopped renewing its lease, now held by `worker` for recovery
        (with the name of the holder that went quiet)."""
        def take(cur: psycopg.Cursor[Any]) -> list[tuple[TaskRecord, str | None]]:
            cur.execute(
                f"UPDATE {SCHEMA}.tasks t SET status = 'recovering', worker = %s,"
                " lease_expires_at = now() + make_interval(secs => %s), updated_at = now()"
                f" FROM (SELECT id, worker FROM {SCHEMA}.tasks WHERE status IN ('running', 'recovering')"
                " AND lease_expires_at < now() FOR UPDATE SKIP LOCKED) old"
                f" WHERE t.id = old.id RETURNING old.worker, {_T_COLUMNS}",
                (worker, lease_s))
            tasks = []
            for row in cur.fetchall():
                task = _task(row[1:])
                _event(cur, Event("lease_expired", task.id, data={"worker": row[0], "recovered_by": worker}))
                tasks.append((task, row[0]))
            return tasks
        tasks: list[tuple[TaskRecord, str | None]] = await self._tx(take)
        return tasks

    async def requeue_or_fail(self, task_id: str, worker: str, reason: str) -> str:
        """After recovery: back to the queue while attempts remain, else failed with the reason;
        a task run in its own command's process is interrupted (the reason as its error)."""
        def settle(cur: psycopg.Cursor[Any]) -> str:
            cur.execute(
                f"UPDATE {SCHEMA}.tasks t SET status = s.status,"
                " error = CASE WHEN s.status = 'queued' THEN NULL ELSE %s END,"
                " finished_at = CASE WHEN s.status = 'queued' THEN NULL ELSE now() END,"
                " worker = NULL, lease_expires_at = NULL, updated_at = now()"
                " FROM (SELECT id, CASE WHEN cancel_requested THEN 'cancelled'"
                " WHEN in_process THEN 'interrupted' WHEN attempts < max_attempts THEN 'queued'"
                f" ELSE 'failed' END AS status FROM {SCHEMA}.tasks"
                " WHERE id = %s AND worker = %s AND status = 'recovering' FOR UPDATE) s"
                " WHERE t.id = s.id RETURNING t.status",
                (reason, task_id, worker))
            row = cur.fetchone()
            if row is None:
                return "lost"
            cur.execute(f"DELETE FROM {SCHEMA}.agent_assignments WHERE task_id = %s", (task_id,))
            kind = "task_requeued" if row[0] == "queued" else "task_finished"
            _event(cur, Event(kind, task_id, data={"status": row[0], "reason": reason}))
            return str(row[0])
        status: str = await self._tx(settle)
        return status

    async def release(self, task_id: str, worker: str, reason: str) -> bool:
        """Give a task back to the queue (its worker is stopping); the attempt does not count."""
        def back(cur: psycopg.Cursor[Any]) -> bool:
            cur.execute(f"UPDATE {SCHEMA}.tasks SET status = CASE WHEN cancel_requested THEN 'cancelled'"
                        " ELSE 'queued' END, attempts = greatest(attempts - 1, 0), worker = NULL,"
                        " lease_expires_at = NULL, updated_at = now()"
                        " WHERE id = %s AND worker = %s AND status = 'running' RETURNING status",
                        (task_id, worker))
            row = cur.fetchone()
            if row is not None:
                _event(cur, Event("task_requeued" if row[0] == "queued" else "task_finished", task_id,
                                  data={"status": row[0], "reason": reason}))
            return row is not None
        done: bool = await self._tx(back)
        return done

    async def resume(self, task_id: str) -> TaskRecord:
        """Put a finished task that did not complete (failed, cancelled, interrupted) back in the
        queue (the queue's now, until a command claims it to run it itself)."""
        def back(cur: psycopg.Cursor[Any]) -> TaskRecord:
            cur.execute(f"SELECT status FROM {SCHEMA}.tasks WHERE id = %s FOR UPDATE", (task_id,))
            row = cur.fetchone()
            if row is None:
                raise UnknownTaskError(task_id)
            if row[0] not in RESUMABLE:
                raise InputError(f"task {task_id} is {row[0]}: only a failed, cancelled or interrupted"
                                 " task resumes")
            cur.execute(f"UPDATE {SCHEMA}.tasks SET status = 'queued', attempts = 0, error = NULL,"
                        " cancel_requested = false, finished_at = NULL, result = NULL, report = NULL,"
                        " in_process = false,"
                        f" updated_at = now() WHERE id = %s RETURNING {_COLUMNS}", (task_id,))
            task = _task(_one(cur))
            for table in ("consensus_decisions", "agent_executions"):
                cur.execute(f"DELETE FROM {SCHEMA}.{table} WHERE task_id = %s", (task_id,))
            _event(cur, Event("task_requeued", task_id, data={"reason": "resumed"}))
            return task
        task: TaskRecord = await self._tx(back)
        return task

    # -- agents: the router's capacity, across every worker on this store -----------------
    async def acquire_agents(self, task_id: str,
                             choose: Callable[[Mapping[str, int]], RoutingDecision]) -> RoutingDecision:
        """Under one lock for all workers: the load per agent (tasks running with a live lease),
        `choose(load)`, and the chosen agents recorded for the task unless it must wait."""
        def assign(cur: psycopg.Cursor[Any]) -> RoutingDecision:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (AGENTS_LOCK_KEY,))
            cur.execute(f"SELECT a.agent, count(*) FROM {SCHEMA}.agent_assignments a"
                        f" JOIN {SCHEMA}.tasks t ON t.id = a.task_id WHERE t.status = 'running'"
                        " AND t.lease_expires_at > now() AND a.task_id <> %s GROUP BY a.agent",
                        (task_id,))
            routing = choose({str(agent): int(n) for agent, n in cur.fetchall()})
            if not routing.waiting:
                for agent in routing.agents:
                    cur.execute(f"INSERT INTO {SCHEMA}.agent_assignments (task_id, agent) VALUES (%s, %s)"
                                " ON CONFLICT DO NOTHING", (task_id, agent))
            return routing
        routing: RoutingDecision = await self._tx(assign)
        return routing

    async def release_agents(self, task_id: str, agents: Sequence[str]) -> None:
        await self._tx(lambda cur: cur.execute(
            f"DELETE FROM {SCHEMA}.agent_assignments WHERE task_id = %s AND agent = ANY(%s)",
            (task_id, list(agents))))

    async def agent_load(self) -> dict[str, int]:
        rows = await self.conn.fetchall(
            f"SELECT a.agent, count(*) FROM {SCHEMA}.agent_assignments a JOIN {SCHEMA}.tasks t"
            " ON t.id = a.task_id WHERE t.status = 'running' AND t.lease_expires_at > now()"
            " GROUP BY a.agent ORDER BY a.agent")
        return {str(a): int(n) for a, n in rows}

    # -- events ------------------------------------------------------------------------
    async def append_events(self, events: Sequence[Event], worker: str | None = None) -> None:
        def insert(cur: psycopg.Cursor[Any]) -> None:
            for e in events:
                _event(cur, e)
                if e.kind == "fork_created" and e.fork:
                    cur.execute(f"INSERT INTO {SCHEMA}.forks (name, task_id, agent, worker)"
                                " VALUES (%s, %s, %s, %s) ON CONFLICT (name) DO NOTHING",
                                (e.fork, e.task_id, e.agent, worker))
                elif e.agent and (e.kind == "agent_failed"
                                  or (e.kind == "agent_phase" and e.data.get("phase") == "done")):
                    # the agent's fork is closed before it reports the end
                    cur.execute(f"UPDATE {SCHEMA}.forks SET destroyed_at = now() WHERE task_id = %s"
                                " AND agent = %s AND destroyed_at IS NULL", (e.task_id, e.agent))
        await self._tx(insert)

    @asynccontextmanager
    async def listen(self) -> AsyncIterator[EventListener]:
        """A connection of its own that LISTENs for appended events (the trigger of migration
        500 NOTIFYs them at commit), closed on exit. Listen first, then read: an event
        appended in between is read, and its notification only wakes the reader once more."""
        if self.url is None:
            raise AfsError("this store was opened without its URL: it cannot listen")
        url = self.url

        def connect() -> psycopg.Connection[Any]:
            raw = connect_sync(url)
            try:
                raw.execute(f"LISTEN {EVENTS_CHANNEL}")
            except psycopg.Error as exc:
                raw.close()
                raise translate(exc) from exc
            return raw

        raw = await trio.to_thread.run_sync(connect)
        try:
            yield EventListener(raw)
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(raw.close)

    async def _append_retrying(self, events: Sequence[Event], worker: str | None) -> None:
        """Once more after a failure (a server-side cancel meant for an interrupted statement
        can land on the next one); then the events are in the log only."""
        for attempt in (1, 2):
            try:
                await self.append_events(events, worker)
                return
            except AfsError as exc:
                log.warning("events_not_stored", attempt=attempt, events=len(events), error=str(exc))
                await trio.sleep(0.2)

    async def forks_destroyed(self, names: Sequence[str]) -> None:
        await self._tx(lambda cur: cur.execute(
            f"UPDATE {SCHEMA}.forks SET destroyed_at = now() WHERE name = ANY(%s)"
            " AND destroyed_at IS NULL", (list(names),)))

    @asynccontextmanager
    async def recording(self, worker: str | None = None) -> AsyncIterator[Sink]:
        """An event sink that writes each event to the store as it happens (in order, in
        batches when they come faster than one write); everything is written on exit."""
        send, receive = trio.open_memory_channel[Event](float("inf"))

        async def drain() -> None:
            # shielded: it ends when the sender closes, so the events of a cancelled task's
            # cleanup (agents failing, forks closing) are stored too
            with trio.CancelScope(shield=True):
                async with receive:
                    async for first in receive:
                        batch = [first]
                        while True:
                            try:
                                batch.append(receive.receive_nowait())
                            except (trio.WouldBlock, trio.EndOfChannel):
                                break
                        await self._append_retrying(batch, worker)

        def sink(event: Event) -> None:
            # an event emitted after the task ended is in the log only
            with contextlib.suppress(trio.ClosedResourceError, trio.BrokenResourceError):
                send.send_nowait(event)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(drain)
            try:
                yield sink
            finally:
                send.close()

    # -- reading -----------------------------------------------------------------------
    async def get(self, task_id: str) -> TaskRecord:
        rows = await self.conn.fetchall(f"SELECT {_COLUMNS} FROM {SCHEMA}.tasks WHERE id = %s", (task_id,))
        if not rows:
            raise UnknownTaskError(task_id)
        return _task(rows[0])

    async def result(self, task_id: str) -> TaskResult | None:
        data = await self.conn.fetchval(f"SELECT result FROM {SCHEMA}.tasks WHERE id = %s", (task_id,))
        return None if data is None else decode(TaskResult, data)

    async def documents(self, task_id: str) -> tuple[dict[str, Any] | None, Any]:
        """The task's report (afs.report.to_json) and its encoded result, as stored (JSON)."""
        row = await self.conn.fetchone(f"SELECT report, result FROM {SCHEMA}.tasks WHERE id = %s",
                                       (task_id,))
        if row is None:
            raise UnknownTaskError(task_id)
        return row[0], row[1]

    async def report(self, task_id: str) -> dict[str, Any] | None:
        data = await self.conn.fetchval(f"SELECT report FROM {SCHEMA}.tasks WHERE id = %s", (task_id,))
        return None if data is None else dict(data)

    async def tasks(self, limit: int = 20, statuses: Sequence[str] = ()) -> list[TaskRecord]:
        where = "WHERE status = ANY(%s)" if statuses else ""
        params: tuple[Any, ...] = (list(statuses),) if statuses else ()
        rows = await self.conn.fetchall(
            f"SELECT {_COLUMNS} FROM {SCHEMA}.tasks {where} ORDER BY created_at DESC, id LIMIT %s",
            (*params, limit))
        return [_task(r) for r in rows]

    async def winners(self, task_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Each finished task's winner as its report has it (proposal type, average gain in %,
        agent), for the tasks in `task_ids` that have one."""
        rows = await self.conn.fetchall(
            f"SELECT id, report->'winner' FROM {SCHEMA}.tasks"
            " WHERE id = ANY(%s) AND jsonb_typeof(report->'winner') = 'object'", (list(task_ids),))
        return {str(task_id): dict(winner) for task_id, winner in rows}

    async def events(self, task_id: str, after: int = 0, limit: int = 1000) -> list[StoredEvent]:
        rows = await self.conn.fetchall(
            f"SELECT id, task_id, at, kind, agent, fork, duration_s, data FROM {SCHEMA}.events"
            " WHERE task_id = %s AND id > %s ORDER BY id LIMIT %s", (task_id, after, limit))
        return [StoredEvent(*r) for r in rows]

    async def forks(self, live: bool = True, task_id: str | None = None) -> list[dict[str, Any]]:
        conditions = [c for c, on in (("destroyed_at IS NULL", live), ("task_id = %s", task_id)) if on]
        where = ("WHERE " + " AND ".join(conditions)) if conditions else ""
        rows = await self.conn.fetchall(
            f"SELECT name, task_id, agent, worker, created_at, destroyed_at FROM {SCHEMA}.forks {where}"
            " ORDER BY created_at", (task_id,) if task_id else None)
        return [{"name": r[0], "task_id": r[1], "agent": r[2], "worker": r[3],
                 "created_at": _iso(r[4]), "destroyed_at": _iso(r[5])} for r in rows]

    async def identity(self) -> str:
        """This store's own random id (made by its migration 300): two processes with the same
        id share one store."""
        return str(await self.conn.fetchval(f"SELECT id FROM {SCHEMA}.identity"))

    async def counts(self) -> dict[str, int]:
        rows = await self.conn.fetchall(f"SELECT status, count(*) FROM {SCHEMA}.tasks GROUP BY status")
        return {str(s): int(n) for s, n in rows}


def _one(cur: psycopg.Cursor[Any]) -> Sequence[Any]:
    row: Sequence[Any] | None = cur.fetchone()
    assert row is not None
    return row


def _event(cur: psycopg.Cursor[Any], event: Event) -> None:
    """Add the event to the task's log (in the transaction of `cur`)."""
    cur.execute(f"INSERT INTO {SCHEMA}.events (task_id, kind, agent, fork, duration_s, data)"
                " VALUES (%s, %s, %s, %s, %s, %s)",
                (event.task_id, event.kind, event.agent, event.fork, event.duration_s,
                 Jsonb(encode(dict(event.data or {})))))


def _rows_of(result: TaskResult) -> Iterator[tuple[str, tuple[Any, ...]]]:
    """The report's tables, row by row: agents, their candidates, every measurement."""
    tid = result.task_id
    for o in result.outcomes:
        yield "agent_executions", (tid, o.agent, o.status, o.error, o.fork, o.duration_s, o.waited_s,
                                   o.measured_by, Jsonb(encode(o.usage.record() if o.usage else {})))
        candidates = list(o.candidates)
        if not candidates and o.proposal is not None:
            from afs.models import CandidateResult

            candidates = [CandidateResult(proposal=o.proposal, status="measured", rank=1,
                                          validation=o.validation, benchmark=o.benchmark)]
        for c in candidates:
            p = c.proposal
            yield "proposals", (tid, o.agent, c.rank, c.status, p == o.proposal, p.proposal_type,
                                Jsonb(list(p.sql_commands)), Jsonb(list(p.rollback_commands)),
                                Jsonb(dict(p.settings)), p.rewritten_query, p.rationale,
                                c.planner_cost, c.baseline_cost, c.note)
            b = c.benchmark
            if b is None:
                continue
            for m in b.measurements:
                yield "benchmark_results", (tid, o.agent, c.rank, "suite", m.name, m.baseline.median_ms,
                                            m.optimized.median_ms, m.rows, m.equivalent, m.significant,
                                            None, m.note)
            for x in b.parameter_checks:
                yield "benchmark_results", (tid, o.agent, c.rank, "parameters", x.label,
                                            x.baseline.median_ms if x.baseline else None,
                                            x.optimized.median_ms if x.optimized else None,
                                            x.rows, x.equivalent, None, x.slower, x.note)
    d = result.decision
    if d is not None:
        yield "consensus_decisions", (tid, d.winner, Jsonb(list(d.ranking)), Jsonb(list(d.rationale)),
                                      d.confidence, Jsonb(encode(dict(d.scores))))


_INSERTS = {
    "agent_executions": 9, "proposals": 14, "benchmark_results": 12, "consensus_decisions": 6,
}


def _write_result(cur: psycopg.Cursor[Any], result: TaskResult) -> None:
    for table in ("consensus_decisions", "agent_executions"):  # a resumed task's earlier try
        cur.execute(f"DELETE FROM {SCHEMA}.{table} WHERE task_id = %s", (result.task_id,))
    for table, row in _rows_of(result):
        marks = ", ".join(["%s"] * _INSERTS[table])
        cur.execute(f"INSERT INTO {SCHEMA}.{table} VALUES ({marks})", row)


def store_url(settings: Settings) -> str:
    """AFS_STORE_URL, else the sandbox server's `postgres` database (the caller starts it)."""
    if settings.store_url:
        return settings.store_url
    from afs.sandbox.server import dsn_for

    return dsn_for(settings, "postgres")


@asynccontextmanager
async def open_store(url: str) -> AsyncIterator[Store]:
    """Connect to the store and bring its schema up to date."""
    async with open_connection(url) as conn:
        store = Store(conn, url)
        await store.migrate()
        yield store
