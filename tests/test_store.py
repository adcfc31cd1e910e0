"""The task store on the real embedded PostgreSQL: migrations, the queue, leases, events,
results that rebuild the same report, and a task run through the store end to end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from afs.config import Leasing, Settings
from afs.db import open_connection
from afs.errors import DatabaseError, InputError, UnknownTaskError
from afs.events import Event
from afs.forks.client import ForkClient
from afs.forks.provider import LocalForkProvider
from afs.models import RoutingDecision, TaskResult
from afs.optimize import new_task_id
from afs.report import render_text, to_json
from afs.router import load_rules
from afs.sandbox.server import SandboxServer
from afs.service.pool import StorePool
from afs.service.runner import Runtime, run_task
from afs.service.worker import open_runtime, recover
from afs.store import Store, TaskSubmission, open_store
from afs.store.codec import decode, encode
from afs.store.migrations import MIGRATIONS

QUERY = ("SELECT o.id, o.total_amount FROM orders o WHERE o.status = 'pending'"
         " AND o.user_id = 42 ORDER BY o.created_at DESC")


@pytest.fixture
async def store(store_db: str) -> AsyncIterator[Store]:
    async with open_store(store_db) as opened:
        yield opened


async def submit(store: Store, priority: str = "normal", **extra: object) -> str:
    task = await store.submit(TaskSubmission(task_id=new_task_id(), query=QUERY, source="afs_demo", dsn=None,
                                      task_type="query_optimization", priority=priority, provider="heuristic",
                                      weights=None, runs=2), **extra)  # type: ignore[arg-type]
    return task.id


async def test_migrations_apply_once_and_are_recorded(store_db: str) -> None:
    async with open_store(store_db) as first:
        rows = await first.conn.fetchall("SELECT version, name FROM afs_store.migrations ORDER BY version")
        assert [r[0] for r in rows] == [m.version for m in MIGRATIONS]
        async with open_store(store_db) as second:  # a second process starting: nothing to do
            assert await second.migrate() == []
        tables = {r[0] for r in await first.conn.fetchall(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'afs_store'")}
    assert tables >= {"tasks", "events", "agent_executions", "proposals", "benchmark_results",
                      "consensus_decisions", "forks", "migrations"}


async def test_the_queue_goes_by_priority_then_age_and_skips_locked_rows(store: Store,
                                                                         store_db: str) -> None:
    low = await submit(store, "low")
    normal = await submit(store, "normal")
    high = await submit(store, "high")
    async with open_store(store_db) as other:
        claimed: list[str] = []

        async def take(s: Store, name: str) -> None:
            task = await s.claim(name, lease_s=30)
            assert task is not None and task.status == "running" and task.worker == name
            claimed.append(task.id)

        async with trio.open_nursery() as nursery:  # two workers at once take two different tasks
            nursery.start_soon(take, store, "w1")
            nursery.start_soon(take, other, "w2")
    assert sorted(claimed) == sorted([high, normal])
    last = await store.claim("w3", lease_s=30)
    assert last is not None and last.id == low and last.attempts == 1
    assert await store.claim("w3", lease_s=30) is None


async def test_heartbeat_cancel_and_a_lost_lease(store: Store) -> None:
    task_id = await submit(store)
    await store.claim("w1", lease_s=30, task_id=task_id)
    assert await store.heartbeat(task_id, "w1", 30) == "ok"
    assert await store.heartbeat(task_id, "someone-else", 30) == "lost"
    cancelled = await store.cancel(task_id)
    assert cancelled.status == "running" and cancelled.cancel_requested
    assert await store.heartbeat(task_id, "w1", 30) == "cancel"
    queued = await submit(store)
    assert (await store.cancel(queued)).status == "cancelled"  # not started: cancelled at once
    with pytest.raises(UnknownTaskError):
        await store.cancel("nosuchid")


async def test_an_expired_lease_is_recovered_requeued_then_failed_with_the_reason(store: Store) -> None:
    task_id = await submit(store, max_attempts=2)
    for attempt in (1, 2):
        task = await store.claim("dead", lease_s=0.1, task_id=task_id)
        assert task is not None and task.attempts == attempt
        await trio.sleep(0.3)
        ((taken, holder),) = await store.take_expired("rescuer", lease_s=30)
        assert taken.id == task_id and taken.status == "recovering" and holder == "dead"
        assert await store.take_expired("rescuer2", lease_s=30) == []  # held by the rescuer now
        status = await store.requeue_or_fail(task_id, "rescuer", "worker dead stopped renewing its lease")
        assert status == ("queued" if attempt == 1 else "failed")
    final = await store.get(task_id)
    assert final.status == "failed" and "stopped renewing its lease" in (final.error or "")
    kinds = [e.kind for e in await store.events(task_id)]
    assert kinds.count("lease_expired") == 2 and "task_requeued" in kinds and kinds[-1] == "task_finished"
    resumed = await store.resume(task_id)
    assert resumed.status == "queued" and resumed.attempts == 0
    with pytest.raises(InputError):
        await store.resume(task_id)  # queued: nothing to resume


async def test_events_are_append_only_and_in_order(store: Store) -> None:
    task_id = await submit(store)
    await store.append_events([Event(f"step_{i}", task_id, agent="gemini25pro", data={"i": i})
                               for i in range(5)])
    events = await store.events(task_id)
    assert [e.kind for e in events] == ["task_queued", *(f"step_{i}" for i in range(5))]
    assert [e.id for e in events] == sorted(e.id for e in events)
    assert [e.kind for e in await store.events(task_id, after=events[2].id)] == ["step_2", "step_3",
                                                                                  "step_4"]
    with pytest.raises(DatabaseError, match="append-only"):
        await store.conn.execute("UPDATE afs_store.events SET kind = 'x' WHERE task_id = %s", (task_id,))
    with pytest.raises(DatabaseError, match="append-only"):
        await store.conn.execute("DELETE FROM afs_store.events WHERE task_id = %s", (task_id,))


@pytest.mark.usefixtures("no_leaked_forks")
async def test_a_task_run_through_the_store_rebuilds_the_same_report(
        settings: Settings, store: Store, forks: ForkClient) -> None:
    rt = Runtime(settings, store, forks, load_rules(None), lease_s=5)
    task_id = await submit(store, "high")  # all three agents
    task = await store.claim("w1", rt.lease_s)
    assert task is not None
    seen: list[str] = []
    finished = await run_task(rt, task, "w1", sinks=(lambda e: seen.append(e.kind),))
    assert finished.status == "completed" and finished.result is not None
    result = finished.result

    stored = await store.result(task_id)
    assert stored == result  # every field, typed, back from JSON
    assert to_json(stored) == to_json(result) and render_text(stored) == render_text(result)
    assert await store.report(task_id) == json.loads(json.dumps(to_json(result), default=str))
    record = await store.get(task_id)
    assert record.status == "completed" and record.worker is None and record.finished_at is not None

    # the report's tables, row for row
    agents = await store.conn.fetchall(
        "SELECT agent, status, fork FROM afs_store.agent_executions WHERE task_id = %s ORDER BY agent",
        (task_id,))
    assert sorted((o.agent, o.status, o.fork) for o in result.outcomes) == [tuple(a) for a in agents]
    candidates = sum(len(o.candidates) for o in result.outcomes)
    assert await store.conn.fetchval("SELECT count(*) FROM afs_store.proposals WHERE task_id = %s",
                                     (task_id,)) == candidates
    measured = sum(len(c.benchmark.measurements) + len(c.benchmark.parameter_checks)
                   for o in result.outcomes for c in o.candidates if c.benchmark)
    assert measured > 0 and await store.conn.fetchval(
        "SELECT count(*) FROM afs_store.benchmark_results WHERE task_id = %s", (task_id,)) == measured
    assert result.decision is not None
    assert await store.conn.fetchval("SELECT winner FROM afs_store.consensus_decisions WHERE task_id = %s",
                                     (task_id,)) == result.decision.winner

    # every event the task emitted is in the store, in order, and the forks are recorded as gone
    stored_kinds = [e.kind for e in await store.events(task_id)]
    assert [k for k in stored_kinds if k not in ("task_queued", "task_started", "task_finished")] == seen
    assert stored_kinds[-1] == "task_finished"
    owned = await store.forks(live=False, task_id=task_id)
    assert {f["name"] for f in owned} == {o.fork for o in result.outcomes if o.fork}
    assert all(f["destroyed_at"] for f in owned) and await store.forks(live=True) == []


def test_the_codec_rejects_what_does_not_fit() -> None:
    with pytest.raises(ValueError, match="status"):
        decode(TaskResult, {"task_id": "x", "status": "weird", "query": "q", "source": "s",
                            "routing": {"agents": [], "rationale": []}, "outcomes": [],
                            "decision": None, "provider": "p", "provider_note": "", "duration_s": 1})
    with pytest.raises(ValueError, match="missing"):
        decode(TaskResult, {"task_id": "x"})
    assert encode({"a": (1, 2)}) == {"a": [1, 2]}


@pytest.mark.usefixtures("no_leaked_forks")
async def test_recovery_collects_the_forks_of_a_dead_task(settings: Settings, store: Store,
                                                          forks: ForkClient, sandbox: object) -> None:
    task_id = await submit(store, max_attempts=1)
    await store.claim("dead", lease_s=0.1, task_id=task_id)
    # what a worker killed mid-task leaves: a fork (named for its task), recorded or not
    left = await forks.create("afs_demo", name=f"afs-fork-gemini25pro-task{task_id}-1", ttl_seconds=600)
    await trio.sleep(0.3)
    rt = Runtime(settings, store, forks, load_rules(None), lease_s=5)
    assert await recover(rt, "rescuer") == [(task_id, "failed")]
    names = {f["name"] for f in (await forks.list_services())["forks"]}
    assert left.name not in names
    task = await store.get(task_id)
    assert task.status == "failed" and "1 fork(s) collected" in (task.error or "")
    async with open_connection(store.conn.raw.info.dsn) as conn:  # another session sees it committed
        assert await conn.fetchval("SELECT status FROM afs_store.tasks WHERE id = %s", (task_id,)) == "failed"


ALL_AGENTS = ("gemini25pro", "gemini25flash", "gemini20flash")


def take_all(load: object) -> RoutingDecision:
    return RoutingDecision(agents=ALL_AGENTS, rationale=("test",))


@pytest.mark.usefixtures("no_leaked_forks")
async def test_agent_capacity_is_shared_by_every_worker_on_the_store(
        settings: Settings, store: Store, store_db: str, forks: ForkClient) -> None:
    async with open_store(store_db) as other:  # another worker, on another connection
        held = []
        for _ in range(3):  # three tasks elsewhere hold every agent: the hard limit (3)
            task_id = await submit(other)
            await other.claim("elsewhere", lease_s=60, task_id=task_id)
            assert not (await other.acquire_agents(task_id, take_all)).waiting
            held.append(task_id)
        stale = await submit(other)  # a dead worker's task: its lease ran out, it does not count
        await other.claim("dead", lease_s=0.1, task_id=stale)
        await other.acquire_agents(stale, take_all)
        await trio.sleep(0.3)
        assert await store.agent_load() == dict.fromkeys(sorted(ALL_AGENTS), 3)

        rt = Runtime(settings, store, forks, load_rules(None), pool=StorePool(store), lease_s=10)
        mine = await submit(store)
        task = await store.claim("w1", rt.lease_s, task_id=mine)
        assert task is not None
        finished: list[str] = []

        async def work() -> None:
            finished.append((await run_task(rt, task, "w1")).status)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(work)
            with trio.fail_after(30):
                # polling the store: the waiting is only visible there (and in the API)
                while "waiting_for_agents" not in [e.kind for e in await store.events(mine)]:  # noqa: ASYNC110
                    await trio.sleep(0.05)
            await trio.sleep(1.0)
            assert "agents_assigned" not in [e.kind for e in await store.events(mine)]
            await other.finish(held[0], "elsewhere", status="failed", error="done elsewhere")
        assert finished == ["completed"] or finished == ["no_improvement"]
        kinds = [e.kind for e in await store.events(mine)]
        assert kinds.index("waiting_for_agents") < kinds.index("agents_assigned")
        assert await store.agent_load() == dict.fromkeys(sorted(ALL_AGENTS), 2)  # mine released


async def test_a_task_its_command_ran_is_interrupted_when_the_command_dies(
        settings: Settings, store: Store, forks: ForkClient, sandbox: object) -> None:
    """`afs optimize` runs its task itself (submit with a worker): when it is killed, the next
    worker or `afs serve` collects its forks and marks it interrupted; nobody runs it again."""
    task_id = await submit(store, worker="optimize-host-1-ab12", lease_s=0.1)
    assert (await store.get(task_id)).in_process
    left = await forks.create("afs_demo", name=f"afs-fork-gemini25pro-task{task_id}-1", ttl_seconds=600)
    queued = await submit(store)  # the queue's own task is still the queue's
    await store.claim("dead-worker", lease_s=0.1, task_id=queued)
    await trio.sleep(0.3)
    rt = Runtime(settings, store, forks, load_rules(None), lease_s=5)
    assert sorted(await recover(rt, "serve-1")) == sorted([(task_id, "interrupted"), (queued, "queued")])
    assert left.name not in {f["name"] for f in (await forks.list_services())["forks"]}
    task = await store.get(task_id)
    assert task.status == "interrupted" and task.finished and task.finished_at is not None
    assert f"afs resume {task_id}" in (task.error or "") and "1 fork(s) collected" in (task.error or "")
    taken = await store.claim("serve-1", lease_s=5)
    assert taken is not None and taken.id == queued  # only the queue's task runs again
    assert await store.claim("serve-1", lease_s=5) is None
    assert (await store.events(task_id))[-1].kind == "task_finished"
    again = await store.resume(task_id)  # asked for: it runs again, by whoever claims it
    assert again.status == "queued" and not again.in_process
    resumed = await store.claim("resume-host-2-cd34", lease_s=5, task_id=task_id, in_process=True)
    assert resumed is not None and resumed.in_process


@pytest.mark.usefixtures("no_leaked_forks")
async def test_afs_optimize_killed_mid_task_leaves_it_interrupted(settings: Settings, store: Store,
                                                                  store_db: str) -> None:
    env = {**os.environ, "AFS_STORE_URL": store_db}
    optimize = await trio.lowlevel.open_process(
        [sys.executable, "-m", "afs", "optimize", "--provider", "heuristic", "--runs", "3", "--json",
         "--query", QUERY], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        with trio.fail_after(90):
            # another process's progress: polled in the store, no trio.Event can tell us
            while not (tasks := await store.tasks()) or not await store.forks(task_id=tasks[0].id):  # noqa: ASYNC110
                await trio.sleep(0.05)
        optimize.send_signal(signal.SIGKILL)
        await optimize.wait()
    finally:
        if optimize.returncode is None:
            optimize.kill()
            await optimize.wait()
    (task,) = await store.tasks()
    assert task.status == "running" and task.in_process
    # its lease runs out (30 s): here at once
    await store.conn.execute("UPDATE afs_store.tasks SET lease_expires_at = now() - interval '1 second'"
                             " WHERE id = %s", (task.id,))
    # what `afs serve` and workers run
    async with open_runtime(settings, store_db, leasing=Leasing(lease_s=5)) as rt:
        assert await recover(rt, "serve-1") == [(task.id, "interrupted")]
        assert await rt.store.claim("serve-1", rt.lease_s) is None
    history = await trio.run_process([sys.executable, "-m", "afs", "history", "--status", "interrupted",
                                      "--json"], capture_stdout=True, capture_stderr=True, check=False,
                                     env=env)
    assert history.returncode == 0, history.stderr.decode()
    assert [(t["id"], t["status"]) for t in json.loads(history.stdout)] == [(task.id, "interrupted")]


async def test_the_sandbox_stopping_mid_task_is_said_so(sandbox: SandboxServer, provider: LocalForkProvider,
                                                        tmp_path: Path) -> None:
    """Not "the connection is closed [in: SELECT … afs_store.forks …]": what stopped, what to do."""
    stderr = tmp_path / "stderr"
    with stderr.open("wb") as sink:
        optimize = await trio.lowlevel.open_process(
            [sys.executable, "-m", "afs", "optimize", "--provider", "heuristic", "--runs", "3", "--json",
             "--query", QUERY], stdout=subprocess.DEVNULL, stderr=sink)
    try:
        with trio.fail_after(90):
            while not await provider.traces():  # noqa: ASYNC110  (a fork: the task is under way)
                await trio.sleep(0.02)
        await trio.to_thread.run_sync(sandbox.stop)
        with trio.fail_after(90):
            await optimize.wait()
    finally:
        if optimize.returncode is None:
            optimize.kill()
            await optimize.wait()
        await trio.to_thread.run_sync(sandbox.start)
        await provider.gc()  # the forks of the task (their owner is gone)
    said = stderr.read_text()
    assert optimize.returncode == 1, said
    assert "Traceback" not in said and "[in: " not in said.splitlines()[-1]
    assert said.splitlines()[-1] == ("afs: error: the sandbox stopped during the task; start it with "
                                     "`afs sandbox up` and run again"), said[-2000:]


async def test_a_worker_whose_sandbox_stops_says_so(sandbox: SandboxServer, store_db: str,
                                                    tmp_path: Path) -> None:
    stderr = tmp_path / "stderr"
    with stderr.open("wb") as sink:
        worker = await trio.lowlevel.open_process(
            [sys.executable, "-m", "afs", "worker", "--poll", "0.1"], stdout=subprocess.DEVNULL,
            stderr=sink, env={**os.environ, "AFS_STORE_URL": store_db})
    try:
        with trio.fail_after(60):
            while "taking tasks" not in await trio.Path(stderr).read_text():  # noqa: ASYNC110
                await trio.sleep(0.05)
        await trio.to_thread.run_sync(sandbox.stop)
        with trio.fail_after(60):
            await worker.wait()
    finally:
        if worker.returncode is None:
            worker.kill()
            await worker.wait()
        await trio.to_thread.run_sync(sandbox.start)
    said = stderr.read_text()
    assert worker.returncode == 1 and "Traceback" not in said, said[-2000:]
    assert said.splitlines()[-1] == ("afs: error: the sandbox stopped under the worker; start it with "
                                     "`afs sandbox up` and the worker again"), said[-2000:]
