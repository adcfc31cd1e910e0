"""Schedules and the batch's window, on the embedded PostgreSQL and the real store, under real
trio: cron and zone errors, due times across daylight saving changes, missed runs coalesced,
no double start with two schedulers on one store, a scheduled run that makes a batch,
`afs batch --since` from stored snapshots, and `afs batch --server` run by `afs serve`.
Time is a clock passed in (`now=`), never patched."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import psycopg
import pytest
import trio

from afs.batch.job import BatchOptions, snapshot_before, store_snapshot, stored_batch
from afs.batch.schedule import (
    Cron,
    Scheduler,
    Started,
    add_schedule,
    batch_runner,
    check_cron,
    check_zone,
    next_run,
    runs,
    schedules,
)
from afs.batch.statements import (
    Counters,
    Snapshot,
    choose_window,
    parse_since,
    read_counters,
    subtract,
    workload_of,
)
from afs.config import Settings
from afs.db import open_connection
from afs.errors import InputError
from afs.sandbox.server import SandboxServer
from afs.serve import run_service
from afs.store import Store, open_store
from afs.store.migrations import SCHEMA
from afs.testing import run_afs_async

PARIS = "Europe/Paris"
SLOW = ("SELECT o.id, o.total_amount FROM orders o WHERE o.status = 'pending' AND o.user_id = {u}"
        " ORDER BY o.created_at DESC")


class Clock:
    """The scheduler's clock, moved by the test."""

    def __init__(self, at: datetime) -> None:
        self.at = at

    def __call__(self) -> datetime:
        return self.at


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


async def afs(*args: str, store_db: str, **env: str) -> subprocess.CompletedProcess[bytes]:
    return await run_afs_async(*args, AFS_STORE_URL=store_db, **env)


# -- pure: cron, zones, windows ------------------------------------------------------------------
def test_bad_cron_expressions_and_zones_name_the_field() -> None:
    assert check_cron("0  3 * * *") == "0 3 * * *" and check_cron("@Daily") == "@daily"
    assert check_cron("*/15 9-17 * * mon-fri") == "*/15 9-17 * * mon-fri"
    for expression, field in (("0 3 * * 8", "day of week"), ("61 3 * * *", "minute"),
                              ("0 25 * * *", "hour"), ("0 3 32 * *", "day of month"),
                              ("0 3 * 13 *", "month"), ("x 3 * * *", "minute")):
        with pytest.raises(InputError, match=rf"--cron .*the {field} field"):
            check_cron(expression)
    with pytest.raises(InputError, match=r"--cron .*4 field"):
        check_cron("0 3 * *")
    with pytest.raises(InputError, match=r"--cron .*6 field"):
        check_cron("0 0 3 * * *")  # croniter would take seconds; cron does not
    with pytest.raises(InputError, match="--tz 'Mars/Base' is not a time zone"):
        check_zone("Mars/Base")
    assert str(check_zone(PARIS)) == PARIS


def test_due_times_across_daylight_saving_changes_in_an_explicit_zone() -> None:
    # spring: Paris skips 02:00-03:00 on 29 March 2026; the 02:30 run happens at 03:00 (01:00 UTC)
    spring = next_run("30 2 * * *", PARIS, utc(2026, 3, 28, 11))
    assert spring == utc(2026, 3, 29, 1, 0)
    assert next_run("30 2 * * *", PARIS, spring) == utc(2026, 3, 30, 0, 30)  # summer time: UTC+2
    # autumn: 02:00-03:00 happens twice on 25 October 2026; a daily 02:30 runs once, the first time
    autumn = next_run("30 2 * * *", PARIS, utc(2026, 10, 24, 10))
    assert autumn == utc(2026, 10, 25, 0, 30)
    assert next_run("30 2 * * *", PARIS, autumn) == utc(2026, 10, 26, 1, 30)  # winter time: UTC+1
    # every half hour is real time: the repeated hour has its two runs twice
    at, seen = utc(2026, 10, 24, 23, 45), []
    while at < utc(2026, 10, 25, 2, 0):
        at = next_run("*/30 * * * *", PARIS, at)
        seen.append(at)
    assert [t.strftime("%H:%M") for t in seen] == ["00:00", "00:30", "01:00", "01:30", "02:00"]
    # the same expression in UTC and in Paris: 03:00 is 02:00 UTC in winter, 01:00 UTC in summer
    assert next_run("0 3 * * *", "UTC", utc(2026, 1, 10)) == utc(2026, 1, 10, 3)
    assert next_run("0 3 * * *", PARIS, utc(2026, 1, 10)) == utc(2026, 1, 10, 2)
    assert next_run("0 3 * * *", PARIS, utc(2026, 7, 10)) == utc(2026, 7, 10, 1)


def test_since_is_a_duration_or_a_timestamp_and_the_window_says_what_it_covers() -> None:
    now = utc(2026, 11, 23, 12)
    assert parse_since("24h", now) == utc(2026, 11, 22, 12)
    assert parse_since("7d", now) == utc(2026, 11, 16, 12)
    assert parse_since("90m", now) == utc(2026, 11, 23, 10, 30)
    assert parse_since("2026-11-22T03:00Z", now) == utc(2026, 11, 22, 3)
    assert parse_since("2026-11-22 03:00", now) == utc(2026, 11, 22, 3)  # no zone: UTC
    assert parse_since("2026-11-22T04:00+01:00", now) == utc(2026, 11, 22, 3)
    for bad in ("yesterday", "0h", "-3d", "2026-11-24"):
        with pytest.raises(InputError, match="--since"):
            parse_since(bad, now)

    rows = ((1, "SELECT * FROM t1", 100, 1000.0, 10.0, 100), (2, "SELECT * FROM t2", 50, 400.0, 8.0, 50),
            (3, "SELECT * FROM t3", 7, 70.0, 10.0, 7), (4, "SELECT * FROM t4", 10, 10.0, 1.0, 10))
    reset = utc(2026, 11, 1)
    counters = Counters("db", now, reset, rows)
    snap = Snapshot(utc(2026, 11, 22, 11), reset, {1: (40, 600.0, 40), 2: (50, 400.0, 50),
                                                   4: (30, 30.0, 30)})
    assert subtract(rows, snap) == [
        (1, "SELECT * FROM t1", 60, 400.0, 400.0 / 60, 60),  # the difference
        (3, "SELECT * FROM t3", 7, 70.0, 10.0, 7),  # new since the snapshot: all of it
        (4, "SELECT * FROM t4", 10, 10.0, 1.0, 10)]  # went down (evicted, made again): its new entry
    # statement 2 ran no more since: it is not in the window

    window = choose_window(counters, utc(2026, 11, 22, 12), snap)
    assert window.basis == "snapshot" and window.start == snap.taken_at
    assert window.seconds == 25 * 3600 and "2026-11-22T11:00:00+00:00" in window.note
    workload = workload_of(counters, utc(2026, 11, 22, 12), snap, top=5)
    assert [(s.queryid, s.calls) for s in workload.statements] == [(1, 60), (3, 7), (4, 10)]
    assert workload.period_s == 25 * 3600

    no_snapshot = choose_window(counters, utc(2026, 11, 22, 12), None)
    assert no_snapshot.basis == "reset" and no_snapshot.start == reset
    assert "NOT since 2026-11-22T12:00:00+00:00" in no_snapshot.note and "reset" in no_snapshot.note
    older = Snapshot(snap.taken_at, utc(2026, 10, 1), snap.counters)  # before the last reset
    assert choose_window(counters, utc(2026, 11, 22, 12), older).basis == "reset"
    after_reset = choose_window(counters, utc(2026, 10, 20), snap)  # reset after the asked start
    assert after_reset.start == reset and "shorter than asked" in after_reset.note
    assert choose_window(counters, None, snap).note.startswith("since the statistics were last reset")


# -- the scheduler on the real store ---------------------------------------------------------
async def _batch_row(store: Store, batch_id: str) -> str:
    """A finished batch row for runs that stand in for a batch (the scheduling tests)."""
    await store.conn.execute(f"INSERT INTO {SCHEMA}.batches (id, origin, options, finished_at)"
                             " VALUES (%s, 'test', '{}', now())", (batch_id,))
    return batch_id


async def test_missed_runs_coalesce_to_one_run(store_db: str) -> None:
    clock = Clock(utc(2026, 11, 23, 8, 10))
    ran: list[str] = []
    called = trio.Event()
    async with open_store(store_db) as store:
        batch_id = await _batch_row(store, "b0000001")

        async def run(schedule: Any) -> str:
            ran.append(schedule.id)
            called.set()
            return batch_id

        hourly = await add_schedule(store, dsn=None, when=Cron("0 * * * *"), options=BatchOptions(top=1),
                                    origin="sandbox/afs_demo", now=clock())
        assert hourly.next_run_at == utc(2026, 11, 23, 9)
        scheduler = Scheduler(store, run, now=clock)
        assert await scheduler.start_due() == []  # not due yet

        clock.at = utc(2026, 11, 23, 13, 40)  # the server was down for 09:00 … 13:00: five due times
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(scheduler.run_forever, poll_s=0.05))
            await called.wait()
            with trio.fail_after(30):  # the run is recorded (a fixed sleep raced a slow store)
                # polling the store: the scheduler's task records it there
                while [r["status"] for r in await runs(store, hourly.id)] != ["completed"]:  # noqa: ASYNC110
                    await trio.sleep(0.05)
            await trio.sleep(0.5)  # a few more polls: nothing else starts
            nursery.cancel_scope.cancel()
        assert ran == [hourly.id]
        [record] = await runs(store, hourly.id)
        assert record["due_at"] == utc(2026, 11, 23, 9) and record["missed"] == 4
        assert record["status"] == "completed" and record["batch_id"] == batch_id
        [listed] = await schedules(store)
        assert listed["next_run_at"] == "2026-11-23T14:00:00+00:00"
        assert listed["last_run"]["batch_id"] == batch_id and listed["last_run"]["missed"] == 4

        clock.at = utc(2026, 11, 23, 14, 0)  # on time: one run, nothing missed
        [started] = await scheduler.start_due()
        assert await scheduler.finish(started) == "completed"
        assert [(r["due_at"], r["missed"]) for r in await runs(store, hourly.id)][-1] == (
            utc(2026, 11, 23, 14), 0)


async def test_two_schedulers_on_one_store_never_start_a_run_twice(store_db: str) -> None:
    clock = Clock(utc(2026, 11, 23, 2, 59))
    release, running = trio.Event(), trio.Event()
    calls: list[str] = []
    async with open_store(store_db) as one, open_store(store_db) as two:
        batch_id = await _batch_row(one, "b0000002")

        async def slow_run(schedule: Any) -> str:
            calls.append(schedule.id)
            running.set()
            await release.wait()
            return batch_id

        nightly = await add_schedule(one, dsn=None, when=Cron("*/5 * * * *"), options=BatchOptions(top=1),
                                     origin="sandbox/afs_demo", now=clock())
        first, second = Scheduler(one, slow_run, now=clock), Scheduler(two, slow_run, now=clock)
        clock.at = utc(2026, 11, 23, 3, 0, 30)
        found: list[list[Started]] = []

        async def look(scheduler: Scheduler) -> None:
            found.append(await scheduler.start_due())

        async with trio.open_nursery() as nursery:  # both look at the same moment
            nursery.start_soon(look, first)
            nursery.start_soon(look, second)
        [started] = [s for f in found for s in f]
        owner, other = (first, second) if started.schedule.id in first.running else (second, first)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(owner.finish, started)
            await running.wait()
            clock.at = utc(2026, 11, 23, 3, 17)  # due again (3:05, 3:10, 3:15) while it still runs
            assert await other.start_due() == []  # the other process: the lock is held
            assert await owner.start_due() == []  # this process: it knows the run is going
            assert await other.settle_interrupted() == []  # held, so not interrupted
            [record] = await runs(one, nightly.id)
            assert record["status"] == "running" and record["runner"] == owner.name
            release.set()
        assert calls == [nightly.id]
        [later] = await other.start_due()  # ended: the due times missed meanwhile, as one run
        assert later.schedule.id == nightly.id
        await other.finish(later)
        assert [(r["status"], r["missed"]) for r in await runs(one, nightly.id)] == [
            ("completed", 0), ("completed", 2)]
        assert calls == [nightly.id, nightly.id]

    # a server that dies mid-run: its lock goes with its connection; its run is interrupted
    clock.at = utc(2026, 11, 23, 3, 21)
    async with open_store(store_db) as survivor:
        async with open_store(store_db) as doomed:
            [orphan] = await Scheduler(doomed, slow_run, now=clock).start_due()
        settled: list[int] = []
        for _ in range(300):  # the server ends the closed session's backend (and its lock) shortly after
            settled = await Scheduler(survivor, slow_run, now=clock).settle_interrupted()
            if settled:
                break
            await trio.sleep(0.1)
        assert settled == [orphan.run_id]
        assert (await runs(survivor, nightly.id))[-1]["status"] == "interrupted"


# -- real batches ---------------------------------------------------------------------------------
@pytest.fixture
def demo_workload(sandbox: SandboxServer, settings: Settings) -> Iterator[str]:
    """pg_stat_statements in the demo database with a slow statement run 30 times (the
    extension dropped afterwards: the demo database is shared by the session)."""
    dsn = sandbox.dsn(settings.demo_database)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute("SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database"
                     " WHERE datname = current_database()), 0)")
        for u in range(1, 31):
            conn.execute(SLOW.format(u=u).encode())
    try:
        yield dsn
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("DROP EXTENSION IF EXISTS pg_stat_statements")


async def test_since_ranks_by_the_counters_since_a_stored_snapshot(demo_workload: str,
                                                                   store_db: str) -> None:
    async with open_store(store_db) as store, open_connection(demo_workload) as target:
        before = await read_counters(target)
        slow_before = next(r for r in before.rows if r[1].startswith("SELECT o.id, o.total_amount"))
        assert slow_before[2] == 30
        await store_snapshot(store, "here/afs_demo", before, None)
        await target.execute(SLOW.format(u=7))
        for u in range(8, 12):
            await target.execute(SLOW.format(u=u))
        now = await read_counters(target)
        since = before.at + timedelta(microseconds=1)
        assert await snapshot_before(store, "here/afs_demo", before.at - timedelta(seconds=1)) is None
        snap = await snapshot_before(store, "here/afs_demo", since)
        assert snap is not None and snap.counters[slow_before[0]][0] == 30
        windowed = workload_of(now, since, snap, top=3)
        slow = next(s for s in windowed.statements if s.queryid == slow_before[0])
        assert slow.calls == 5 and windowed.window is not None and windowed.window.basis == "snapshot"
        whole = workload_of(now, None, None, top=3)
        assert next(s for s in whole.statements if s.queryid == slow_before[0]).calls == 35


@pytest.mark.usefixtures("no_leaked_forks")
async def test_a_scheduled_run_makes_a_batch_and_the_list_shows_it(settings: Settings, store_db: str,
                                                                   demo_workload: str) -> None:
    clock = Clock(utc(2026, 11, 23, 2, 0))
    async with open_store(store_db) as store:
        options = BatchOptions(top=1, min_calls=5, provider="heuristic", runs=1, since="24h")
        schedule = await add_schedule(store, dsn=None, when=Cron("0 3 * * *", PARIS), options=options,
                                      origin="sandbox/afs_demo", now=clock())
        assert schedule.next_run_at == utc(2026, 11, 23, 2, 0) + timedelta(days=1)  # 03:00 Paris
        clock.at = utc(2026, 11, 24, 2, 0, 5)
        scheduler = Scheduler(store, batch_runner(settings, store_db), now=clock)
        [started] = await scheduler.start_due()
        assert await scheduler.finish(started) == "completed"
        [record] = await runs(store, schedule.id)
        doc, markdown = await stored_batch(store, record["batch_id"])
        assert doc is not None and markdown is not None
        [statement] = doc["statements"]
        assert statement["calls"] == 30 and statement["task_id"]
        assert (await store.get(statement["task_id"])).finished
        # no snapshot from 24 h before (and the statistics were reset by the fixture): the window
        # is since the reset, and the report says that it is not the one asked for
        window = doc["window"]
        assert window["basis"] == "reset" and window["requested"] is not None
        assert "NOT since" in window["note"] or "shorter than asked" in window["note"]
        assert f"Window: {window['note']}" in markdown
        assert doc["options"]["since"] == "24h"

    listed = await afs("schedule", "list", "--json", store_db=store_db)
    assert listed.returncode == 0, listed.stderr.decode()
    [shown] = json.loads(listed.stdout)
    assert shown["id"] == schedule.id and shown["timezone"] == PARIS
    assert shown["last_run"]["batch_id"] == record["batch_id"] and shown["last_run"]["status"] == "completed"
    assert shown["next_run_at"] == "2026-11-25T02:00:00+00:00"
    text = await afs("schedule", "list", store_db=store_db)
    assert f"batch {record['batch_id']}" in text.stdout.decode()


async def test_schedule_commands_refuse_bad_input_with_exit_2(store_db: str) -> None:
    bad_cron = await afs("schedule", "add", "--cron", "0 3 * * 9", store_db=store_db)
    assert bad_cron.returncode == 2 and b"--cron" in bad_cron.stderr and b"day of week" in bad_cron.stderr
    bad_zone = await afs("schedule", "add", "--cron", "0 3 * * *", "--tz", "Europe/Parys", store_db=store_db)
    assert bad_zone.returncode == 2 and b"--tz 'Europe/Parys'" in bad_zone.stderr
    bad_since = await afs("schedule", "add", "--cron", "0 3 * * *", "--since", "2026-11-01",
                          store_db=store_db)
    assert bad_since.returncode == 2 and b"give a duration" in bad_since.stderr
    added = await afs("schedule", "add", "--cron", "0 3 * * *", "--tz", PARIS, "--top", "3", "--json",
                      store_db=store_db)
    assert added.returncode == 0, added.stderr.decode()
    doc = json.loads(added.stdout)
    assert doc["cron"] == "0 3 * * *" and doc["options"]["top"] == 3 and doc["last_run"] is None
    missing = await afs("schedule", "remove", "nosuch", store_db=store_db)
    assert missing.returncode == 2 and b"no schedule 'nosuch'" in missing.stderr
    removed = await afs("schedule", "remove", doc["id"], store_db=store_db)
    assert removed.returncode == 0
    assert json.loads((await afs("schedule", "list", "--json", store_db=store_db)).stdout) == []
    since = await afs("batch", "--since", "last tuesday", store_db=store_db)
    assert since.returncode == 2 and b"--since" in since.stderr


@pytest.mark.usefixtures("no_leaked_forks")
async def test_batch_with_server_runs_its_tasks_on_afs_serve(nursery: trio.Nursery, settings: Settings,
                                                             store_db: str, sandbox: SandboxServer,
                                                             demo_workload: str) -> None:
    configured = settings.with_(store_url=store_db)
    urls: list[str] = await nursery.start(partial(run_service, configured, bind="127.0.0.1:0", workers=1,
                                                  lease_s=5))
    url = next(u for u in urls if u.startswith("http://127.0.0.1"))
    done = await afs("batch", "--server", url, "--top", "1", "--min-calls", "5", "--provider", "heuristic",
                     "--runs", "1", "--json", store_db=store_db)
    assert done.returncode == 0, done.stderr.decode()
    doc = json.loads(done.stdout)
    [statement] = doc["statements"]
    assert statement["status"] in ("completed", "no_improvement") and statement["calls"] == 30
    assert b"finished] task" in done.stderr  # progress while waiting
    async with open_store(store_db) as store:
        events = await store.events(statement["task_id"])
        assert any(e.kind == "task_started" and str(e.data["worker"]).startswith("serve-") for e in events)
        stored, _ = await stored_batch(store, doc["id"])
        assert stored == doc
        task = await store.get(statement["task_id"])  # the filled sets went over HTTP with it
        assert task.parameters is not None and task.parameters.sets[0].query == task.query
        assert [s.label for s in task.parameters.sets] == statement["parameter_sets"]

    other = "afs_store_o_" + os.urandom(4).hex()  # a store of its own: refused before anything runs
    with psycopg.connect(sandbox.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {other}")
    try:
        refused = await afs("batch", "--server", url, "--top", "1", store_db=sandbox.dsn(other))
        assert refused.returncode == 2 and b"another task store" in refused.stderr
    finally:
        with psycopg.connect(sandbox.dsn(), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {other} WITH (FORCE)")
