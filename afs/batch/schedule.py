"""Scheduled batches: `afs schedule add|list|remove`, run by `afs serve`.

    check_cron("0 3 * * *"); zone = check_zone("Europe/Paris")       # InputError naming the field
    next_run("0 3 * * *", "Europe/Paris", after=now)                  # the next due time, in UTC
    schedule = await add_schedule(store, dsn=None, when=Cron("0 3 * * *", "UTC"), options=...)
    await Scheduler(store, run, now=clock).run_forever()              # in afs serve's nursery

Time. A cron expression is read in the schedule's own IANA time zone
(`afs.config.SCHEDULE_TIMEZONE`, UTC, unless `--tz` says otherwise), stored with it;
due times are stored in UTC. Across a daylight saving change: a time the clocks skip
runs when they jump (02:30 on the night Paris goes from 02:00 to 03:00 runs at 03:00);
a time they repeat runs once, the first time, unless the hour field is a wildcard
(`*/30 * * * *` is every half hour of real time).

Runs. A schedule is due when its `next_run_at` has passed. Starting a run takes a
PostgreSQL advisory lock on the schedule (session-level, on the scheduler's store
connection) and, in the same step, moves `next_run_at` to the first due time after
now: so a run still going is never started again, by this process or by another
`afs serve` on the same store, and runs missed while no server was up are one run
(the run row counts how many it stands for). The lock goes with the connection, so a
server that dies releases it; its run row, still `running` with nobody holding the
lock, is marked `interrupted` by the next scheduler that looks. Each run records its
status, error and batch id. The clock is a parameter (`now`), so tests control time.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import psycopg
import structlog
import trio
from croniter import croniter
from psycopg.types.json import Jsonb

from afs.batch.job import BatchOptions, run_batch_here
from afs.batch.statements import parse_duration
from afs.config import SCHEDULE_POLL_S, SCHEDULE_TIMEZONE, Settings
from afs.errors import AfsError, InputError, scrub
from afs.optimize import new_task_id
from afs.sandbox.importer import origin_of
from afs.store import Store
from afs.store.migrations import SCHEDULE_LOCK_KEY, SCHEMA

log = structlog.get_logger(__name__)

CRON_FIELDS = ("minute", "hour", "day of month", "month", "day of week")
KEYWORDS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
MAX_COUNTED = 10_000  # missed due times counted, at most


def utc_now() -> datetime:
    return datetime.now(UTC)


# -- cron and time zones (pure) -------------------------------------------------------------
def check_cron(expression: str) -> str:
    """The expression, normalised; InputError naming --cron and the bad field otherwise."""
    text = " ".join(expression.split())
    example = 'five fields: minute hour day-of-month month day-of-week, e.g. "0 3 * * *"'
    if text.lower() in KEYWORDS:
        return text.lower()
    parts = text.split(" ")
    if len(parts) != len(CRON_FIELDS):
        raise InputError(f"--cron {expression!r}: {len(parts)} field(s), expected {example}")
    if croniter.is_valid(text):
        return text
    for n, name in enumerate(CRON_FIELDS):
        alone = " ".join(part if i == n else "*" for i, part in enumerate(parts))
        if not croniter.is_valid(alone):
            raise InputError(f"--cron {expression!r}: the {name} field {parts[n]!r} is not valid ({example})")
    raise InputError(f"--cron {expression!r} is not a valid cron expression ({example})")


def check_zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InputError(f"--tz {name!r} is not a time zone: use an IANA name such as UTC, "
                         "Europe/Paris or America/New_York") from None


def _repeated(moment: datetime, zone: ZoneInfo) -> bool:
    """Is this the second time the wall clock shows this time (the hour repeated in autumn)?"""
    wall = moment.replace(tzinfo=None)
    first, second = wall.replace(tzinfo=zone, fold=0), wall.replace(tzinfo=zone, fold=1)
    return first.utcoffset() != second.utcoffset() and moment.utcoffset() == second.utcoffset()


def next_run(cron: str, timezone: str, after: datetime) -> datetime:
    """The first due time strictly after `after` (aware), in UTC."""
    zone = check_zone(timezone)
    fixed_hour = not cron.startswith("@hourly") and (cron.startswith("@") or (cron.split()[1] != "*"
                                                      and not cron.split()[1].startswith("*/")))
    times = croniter(cron, after.astimezone(zone))
    while True:
        moment: datetime = times.get_next(datetime)
        if not (fixed_hour and _repeated(moment, zone)):
            return moment.astimezone(UTC)


def due_between(cron: str, timezone: str, start: datetime, end: datetime) -> int:
    """How many due times fall in (start, end] (at most MAX_COUNTED)."""
    count, at = 0, start
    while count < MAX_COUNTED:
        at = next_run(cron, timezone, at)
        if at > end:
            break
        count += 1
    return count


# -- the stored schedules --------------------------------------------------------------------
@dataclass(frozen=True)
class Cron:
    """When a schedule runs, passed whole: a cron expression (five fields, or @daily, …) read in
    an IANA time zone (config's SCHEDULE_TIMEZONE unless one is given: `afs schedule add --tz`)."""

    expression: str
    timezone: str = SCHEDULE_TIMEZONE


@dataclass(frozen=True)
class Schedule:
    id: str
    dsn: str | None  # None: the sandbox's demo database
    origin: str
    cron: str
    timezone: str
    options: BatchOptions
    created_at: datetime
    next_run_at: datetime

    def public(self) -> dict[str, Any]:
        return {"id": self.id, "target": self.origin, "dsn": None if self.dsn is None else scrub(self.dsn),
                "cron": self.cron, "timezone": self.timezone, "options": asdict(self.options),
                "created_at": self.created_at.isoformat(timespec="seconds"),
                "next_run_at": self.next_run_at.astimezone(UTC).isoformat(timespec="seconds"),
                "next_run_local": self.next_run_at.astimezone(ZoneInfo(self.timezone))
                .isoformat(timespec="seconds")}


def options_of(data: Mapping[str, Any]) -> BatchOptions:
    known = {f.name for f in fields(BatchOptions)}
    return BatchOptions(**{k: v for k, v in data.items() if k in known})


_COLUMNS = "id, dsn, origin, cron, timezone, options, created_at, next_run_at"


def _schedule(row: tuple[Any, ...]) -> Schedule:
    return Schedule(row[0], row[1], row[2], row[3], row[4], options_of(row[5]), row[6], row[7])


async def add_schedule(store: Store, *, dsn: str | None, when: Cron, options: BatchOptions, origin: str,
                       now: datetime | None = None) -> Schedule:
    """Check and store a schedule; its first run is the first due time after `now`."""
    cron, timezone = check_cron(when.expression), when.timezone
    check_zone(timezone)
    options.check()
    if options.since is not None and parse_duration(options.since) is None:
        raise InputError(f"--since {options.since!r}: a schedule repeats, so give a duration "
                         "(24h, 7d), not a timestamp")
    if dsn is not None:
        origin = origin_of(dsn)  # InputError when it is not a connection string
    first = next_run(cron, timezone, now or utc_now())
    row = await store.conn.fetchone(
        f"INSERT INTO {SCHEMA}.schedules (id, dsn, origin, cron, timezone, options, next_run_at)"
        f" VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING {_COLUMNS}",
        (new_task_id(), dsn, origin, cron, timezone, Jsonb(asdict(options)), first))
    assert row is not None
    return _schedule(row)


async def schedules(store: Store) -> list[dict[str, Any]]:
    """Every schedule with its last run (status, times, batch id), soonest next run first."""
    rows = await store.conn.fetchall(
        f"SELECT {', '.join('s.' + c for c in _COLUMNS.split(', '))}, r.id, r.status, r.started_at,"
        f" r.finished_at, r.batch_id, r.error, r.missed, r.runner FROM {SCHEMA}.schedules s"
        f" LEFT JOIN LATERAL (SELECT * FROM {SCHEMA}.schedule_runs WHERE schedule_id = s.id"
        " ORDER BY id DESC LIMIT 1) r ON true ORDER BY s.next_run_at, s.id")
    out = []
    for row in rows:
        doc = _schedule(row[:8]).public()
        run_id, status, started, finished, batch_id, error, missed, runner = row[8:]
        doc["last_run"] = None if run_id is None else {
            "id": run_id, "status": status, "started_at": started.isoformat(timespec="seconds"),
            "finished_at": None if finished is None else finished.isoformat(timespec="seconds"),
            "batch_id": batch_id, "error": error, "missed": missed, "runner": runner}
        out.append(doc)
    return out


async def remove_schedule(store: Store, schedule_id: str) -> None:
    row = await store.conn.fetchone(f"DELETE FROM {SCHEMA}.schedules WHERE id = %s RETURNING id",
                                    (schedule_id,))
    if row is None:
        raise InputError(f"no schedule {schedule_id!r} in the store (see `afs schedule list`)")


async def runs(store: Store, schedule_id: str) -> list[dict[str, Any]]:
    rows = await store.conn.fetchall(
        f"SELECT id, due_at, missed, started_at, finished_at, status, runner, batch_id, error"
        f" FROM {SCHEMA}.schedule_runs WHERE schedule_id = %s ORDER BY id", (schedule_id,))
    names = ("id", "due_at", "missed", "started_at", "finished_at", "status", "runner", "batch_id", "error")
    return [dict(zip(names, r, strict=True)) for r in rows]


# -- running them ------------------------------------------------------------------------------
RunBatch = Callable[[Schedule], Awaitable[str]]  # runs the schedule's batch; returns its id


@dataclass(frozen=True)
class Started:
    schedule: Schedule
    run_id: int


class Scheduler:
    """One process's scheduler, on its own store connection (its advisory locks live there)."""

    def __init__(self, store: Store, run: RunBatch, *, now: Callable[[], datetime] = utc_now,
                 name: str | None = None) -> None:
        self.store = store
        self.run = run
        self.now = now
        self.name = name or f"schedule-{socket.gethostname()}-{os.getpid()}-{new_task_id()[:4]}"
        self.running: set[str] = set()  # schedules whose run this process holds

    async def _try_lock(self, schedule_id: str) -> bool:
        return bool(await self.store.conn.fetchval("SELECT pg_try_advisory_lock(%s, hashtext(%s))",
                                                   (SCHEDULE_LOCK_KEY, schedule_id)))

    async def _unlock(self, schedule_id: str) -> None:
        await self.store.conn.fetchval("SELECT pg_advisory_unlock(%s, hashtext(%s))",
                                       (SCHEDULE_LOCK_KEY, schedule_id))

    async def settle_interrupted(self) -> list[int]:
        """Runs left `running` by a process that is gone (nobody holds their lock): interrupted."""
        rows = await self.store.conn.fetchall(
            f"SELECT id, schedule_id FROM {SCHEMA}.schedule_runs WHERE status = 'running'")
        settled = []
        for run_id, schedule_id in rows:
            if schedule_id in self.running or not await self._try_lock(schedule_id):
                continue
            try:
                await self.store.conn.execute(
                    f"UPDATE {SCHEMA}.schedule_runs SET status = 'interrupted', finished_at = %s,"
                    " error = 'the afs serve running it stopped before the batch ended'"
                    " WHERE id = %s AND status = 'running'", (self.now(), run_id))
                settled.append(int(run_id))
            finally:
                await self._unlock(schedule_id)
        return settled

    async def start_due(self) -> list[Started]:
        """Take every due schedule no one is running: lock it, move its next run past now (once,
        however many due times were missed), record the run as started."""
        now = self.now()
        due = await self.store.conn.fetchall(
            f"SELECT id FROM {SCHEMA}.schedules WHERE next_run_at <= %s ORDER BY next_run_at", (now,))
        started = []
        for (schedule_id,) in due:
            if schedule_id in self.running or not await self._try_lock(schedule_id):
                continue  # still going, here or in another process
            try:
                begun = await self._begin(schedule_id, now)
            except BaseException:
                with trio.CancelScope(shield=True):
                    await self._unlock(schedule_id)
                raise
            if begun is None:  # another process ran it between our look and our lock
                await self._unlock(schedule_id)
                continue
            self.running.add(schedule_id)
            started.append(begun)
        return started

    async def _begin(self, schedule_id: str, now: datetime) -> Started | None:
        def begin(cur: Any) -> Started | None:
            cur.execute(f"SELECT {_COLUMNS} FROM {SCHEMA}.schedules WHERE id = %s FOR UPDATE",
                        (schedule_id,))
            row = cur.fetchone()
            if row is None or row[7] > now:
                return None
            schedule = _schedule(row)
            missed = due_between(schedule.cron, schedule.timezone, schedule.next_run_at, now)
            following = next_run(schedule.cron, schedule.timezone, now)
            cur.execute(f"UPDATE {SCHEMA}.schedules SET next_run_at = %s WHERE id = %s",
                        (following, schedule_id))
            cur.execute(f"INSERT INTO {SCHEMA}.schedule_runs (schedule_id, due_at, missed, started_at,"
                        " status, runner) VALUES (%s, %s, %s, %s, 'running', %s) RETURNING id",
                        (schedule_id, schedule.next_run_at, missed, now, self.name))
            return Started(schedule, int(cur.fetchone()[0]))

        def in_transaction(conn: psycopg.Connection[Any]) -> Started | None:
            with conn.transaction(), conn.cursor() as cur:
                return begin(cur)
        return await self.store.conn.run(in_transaction)

    async def finish(self, started: Started) -> str:
        """Run a started schedule's batch and record how it ended; returns the run's status.
        Expected failures (the target unreachable, no pg_stat_statements, …) and bugs alike are
        recorded as the run's error: one schedule's trouble does not stop the server."""
        schedule = started.schedule
        status, batch_id, error = "failed", None, None
        log.info("schedule_run_started", schedule=schedule.id, run=started.run_id, target=schedule.origin)
        try:
            batch_id = await self.run(schedule)
            status = "completed"
        except AfsError as exc:
            error = str(exc)
        except trio.Cancelled:
            status, error = "interrupted", "afs serve stopped during the batch"
            raise
        except Exception as exc:  # a bug: logged with its traceback, recorded, the server goes on
            log.exception("schedule_run_crashed", schedule=schedule.id)
            error = scrub(f"{type(exc).__name__}: {exc}")
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(15):
                try:
                    await self.store.conn.execute(
                        f"UPDATE {SCHEMA}.schedule_runs SET status = %s, finished_at = %s, batch_id = %s,"
                        " error = %s WHERE id = %s", (status, self.now(), batch_id, error, started.run_id))
                finally:
                    self.running.discard(schedule.id)
                    await self._unlock(schedule.id)
            log.info("schedule_run_finished", schedule=schedule.id, run=started.run_id, status=status,
                     batch=batch_id, error=error)
        return status

    async def seconds_to_next(self) -> float:
        soonest = await self.store.conn.fetchval(f"SELECT min(next_run_at) FROM {SCHEMA}.schedules")
        if soonest is None:
            return SCHEDULE_POLL_S
        seconds: float = (soonest - self.now()).total_seconds()
        return max(0.0, min(SCHEDULE_POLL_S, seconds))

    async def run_forever(self, poll_s: float = SCHEDULE_POLL_S,
                          task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start due schedules as they come due, each run in its own task, until cancelled."""
        async with trio.open_nursery() as nursery:
            task_status.started()
            while True:
                wait = poll_s
                try:
                    await self.settle_interrupted()
                    for started in await self.start_due():
                        nursery.start_soon(self.finish, started)
                    wait = min(poll_s, max(0.5, await self.seconds_to_next()))
                except AfsError as exc:  # the store unreachable for a while: look again later
                    log.warning("scheduler_store_failed", error=str(exc))
                await trio.sleep(wait)


def batch_runner(settings: Settings, url: str) -> RunBatch:
    """Runs a schedule's batch in this process, as `afs batch` does (the store at `url`)."""
    async def run(schedule: Schedule) -> str:
        doc = await run_batch_here(settings, url, dsn=schedule.dsn, options=schedule.options,
                                   progress=lambda message: log.debug("schedule_progress", message=message))
        return str(doc["id"])
    return run


async def run_schedules(settings: Settings, url: str,
                        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """`afs serve`'s scheduler: the stored schedules' batches, run in this process."""
    from afs.store import open_store

    async with open_store(url) as store:
        await Scheduler(store, batch_runner(settings, url)).run_forever(task_status=task_status)


def describe(doc: Mapping[str, Any]) -> str:
    """One schedule as `afs schedule list` prints it."""
    last = doc["last_run"]
    if last is None:
        last_text = "never run"
    else:
        last_text = f"last run {last['started_at']} {last['status']}"
        if last["batch_id"]:
            last_text += f" (batch {last['batch_id']})"
        if last["missed"]:
            last_text += f", standing for {last['missed'] + 1} due times"
        if last["error"]:
            last_text += f": {last['error']}"
    top = doc["options"]["top"]
    since = f", since {doc['options']['since']}" if doc["options"].get("since") else ""
    return (f"{doc['id']}  {doc['target']}  \"{doc['cron']}\" {doc['timezone']}  top {top}{since}\n"
            f"    next run {doc['next_run_local']} ({doc['next_run_at']} UTC); {last_text}")
