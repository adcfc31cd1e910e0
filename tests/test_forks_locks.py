"""Locks between processes (issue 9, item 9): the benchmark slot, template refresh, seeding."""

from __future__ import annotations

import os
import secrets
import signal
import sys
import textwrap
from pathlib import Path

import pytest
import trio
from mcp import Client

from afs.brains import Squad, StrategistBrain
from afs.config import Settings
from afs.db import open_connection
from afs.events import Emitter, Event, log_sink
from afs.forks.client import ForkClient
from afs.forks.provider import LocalForkProvider
from afs.forks.server import build_server
from afs.locks import connection_lock_path, hold_file_lock, is_locked, server_lock
from afs.optimize import Crew, TaskRequest, optimize
from afs.router import load_rules
from afs.sandbox.seeding import ensure_demo
from afs.sandbox.server import SandboxServer

pytestmark = pytest.mark.usefixtures("no_leaked_forks")


async def test_a_file_lock_spans_processes_and_dies_with_its_holder(tmp_path: Path) -> None:
    path = tmp_path / "x.lock"
    script = textwrap.dedent(f"""
        import sys, trio
        from pathlib import Path
        from afs.locks import hold_file_lock
        async def main():
            async with hold_file_lock(Path({str(path)!r})):
                print("held", flush=True)
                await trio.sleep(600)
        trio.run(main)
    """)
    holder = await trio.lowlevel.open_process([sys.executable, "-c", script], stdout=-1)
    try:
        assert holder.stdout is not None
        with trio.fail_after(30):
            assert (await holder.stdout.receive_some(10)).startswith(b"held")
        assert is_locked(path)
        with trio.move_on_after(0.3) as waited:
            async with hold_file_lock(path):
                pytest.fail("acquired a lock another process holds")
        assert waited.cancelled_caught
    finally:
        holder.send_signal(signal.SIGKILL)
        await holder.wait()
    with trio.fail_after(2):  # the kernel released it with the killed process
        async with hold_file_lock(path):
            pass
    assert not is_locked(path)


async def test_no_benchmark_runs_while_another_process_measures_on_the_server(
        settings: Settings, sandbox: SandboxServer, provider: LocalForkProvider) -> None:
    """Whoever holds the server's benchmark lock (another `afs optimize`) keeps agents waiting."""
    query = ("SELECT o.id, o.total_amount FROM orders o WHERE o.status = 'pending'"
             " AND o.user_id = 42 ORDER BY o.created_at DESC")
    brain = StrategistBrain()
    squad = Squad(brain_for=lambda _agent: brain, provider="heuristic", agents=("gemini25flash",))
    async with open_connection(sandbox.dsn()) as conn:
        path = connection_lock_path(conn, "benchmark")
        async with Client(build_server(provider)) as mcp_client:
            forks = ForkClient(mcp_client)
            results = []
            waiting = trio.Event()

            def on_event(event: Event) -> None:
                if (event.kind, event.data.get("phase")) == ("agent_phase", "waiting for the benchmark slot"):
                    waiting.set()

            events = Emitter("lock" + os.urandom(2).hex(), sinks=(log_sink, on_event))
            async with trio.open_nursery() as nursery, server_lock(conn, "benchmark"):
                assert is_locked(path)

                async def run() -> None:
                    results.append(await optimize(
                        settings, TaskRequest(query=query, runs=3), source="afs_demo",
                        source_dsn=sandbox.dsn("afs_demo"),
                        crew=Crew(forks=forks, squad=squad, rules=load_rules(None)), events=events))

                nursery.start_soon(run)
                # the lock is held from the moment the agent waits for the slot (a fixed sleep
                # from the start left a slow machine's fork and analysis too little of it)
                with trio.fail_after(120):
                    await waiting.wait()
                await trio.sleep(3)
                assert not results  # still waiting for the slot
    (outcome,) = results[0].outcomes
    assert outcome.status == "ok", outcome.error
    assert outcome.waited_s >= 3


async def test_concurrent_template_refreshes_and_forks(provider: LocalForkProvider) -> None:
    forks: list[str] = []

    async def fork_one() -> None:
        fork = await provider.fork("afs_demo", ttl_seconds=120)
        forks.append(fork.name)

    try:
        async with trio.open_nursery() as nursery:
            for _ in range(2):
                nursery.start_soon(provider.refresh_template, "afs_demo")
                nursery.start_soon(fork_one)
    finally:
        for name in forks:
            await provider.delete(name)
    assert len(forks) == 2


async def test_two_processes_never_seed_at_once(settings: Settings, sandbox: SandboxServer,
                                                provider: LocalForkProvider) -> None:
    other = settings.with_(demo_database="afs_demo_" + secrets.token_hex(3))
    reports = []

    async def up() -> None:
        reports.append(await ensure_demo(other, sandbox, "small"))

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(up)
            nursery.start_soon(up)
        assert sorted(r is None for r in reports) == [False, True]  # one seeded, one found it
    finally:
        await provider.drop_source(other.demo_database)
