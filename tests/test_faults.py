"""Fault injection (issue 9, item 10): whatever kills or cuts off a task, the next `afs`
command leaves no fork, no fork role and no catalog row, and the source is unchanged.

Each case runs the real `afs optimize` (offline strategists, small scale) in its own
process, injects one fault, then runs `afs fork gc` and looks at the server: databases,
roles and catalog rows named afs-fork-… (not only forks in state 'ready').
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import psutil
import pytest
import trio

from afs.db import open_connection
from afs.forks.provider import LocalForkProvider
from afs.locks import connection_lock_path, is_locked
from afs.sandbox.server import SandboxServer
from afs.testing import run_afs_async

QUERY = ("SELECT o.id, o.total_amount FROM orders o WHERE o.status = 'pending'"
         " AND o.user_id = 42 ORDER BY o.created_at DESC")
WAIT_S = 90  # for one optimize at small scale on a loaded two-core machine


async def fingerprint(sandbox: SandboxServer) -> list[tuple[Any, ...]]:
    """The source's objects and its tables' exact row counts."""
    async with open_connection(sandbox.dsn("afs_demo")) as conn:
        objects = await conn.fetchall(
            "SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = 'public' ORDER BY 1")
        counts = [(table, await conn.fetchval(f'SELECT count(*) FROM "{table}"'))
                  for table, kind in objects if kind == "r"]
    return [*objects, *counts]


@pytest.fixture
def clean_after(provider: LocalForkProvider, sandbox: SandboxServer) -> Iterator[None]:
    """After the fault: `afs fork gc` succeeds, nothing of a fork is left, the source is as it was.

    (Sync: pytest-trio would not run an async fixture named only in `usefixtures`.)
    """
    before = trio.run(provider.traces)
    source = trio.run(fingerprint, sandbox)
    yield
    gc = subprocess.run([sys.executable, "-m", "afs", "fork", "gc", "--json"], capture_output=True,
                        check=False, timeout=WAIT_S)
    assert gc.returncode == 0, gc.stderr.decode()
    assert json.loads(gc.stdout)["failed"] == {}
    leaked = trio.run(provider.traces) - before
    for name in leaked:
        trio.run(provider.delete, name)
    assert not leaked, f"left behind: {sorted(leaked)}"
    assert trio.run(fingerprint, sandbox) == source


async def afs(*args: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    return await run_afs_async(*args, env={**os.environ, **(env or {})})


async def start_optimize(env: Mapping[str, str] | None = None) -> trio.Process:
    return await trio.lowlevel.open_process(
        [sys.executable, "-m", "afs", "optimize", "--provider", "heuristic", "--runs", "3", "--json",
         "--query", QUERY],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **(env or {})})


async def wait_until(condition: Callable[[], Any], what: str) -> None:
    with trio.fail_after(WAIT_S):
        # another process's progress: polled, no trio.Event can tell us
        while not await condition():  # noqa: ASYNC110
            await trio.sleep(0.02)


async def stop(process: trio.Process) -> None:
    if process.returncode is None:
        process.kill()
    await process.wait()


def fork_servers(process: trio.Process) -> list[psutil.Process]:
    return [p for p in psutil.Process(process.pid).children(recursive=True)
            if "mcp" in p.cmdline() and "serve" in p.cmdline()]


async def a_fork_exists(provider: LocalForkProvider) -> bool:
    return bool(await provider.traces())


pytestmark = pytest.mark.usefixtures("clean_after")


def stdio_server(sandbox: SandboxServer) -> dict[str, str]:
    """The environment of an `afs optimize` whose fork server is `afs mcp serve` over stdio,
    a process of its own (by default the sandbox's fork server runs inside the command)."""
    command = [sys.executable, "-m", "afs", "mcp", "serve", "--admin-dsn", sandbox.dsn()]
    return {"AFS_FORK_SERVER_COMMAND": shlex.join(command)}


@pytest.mark.parametrize("server", ["in-process", "stdio"])
async def test_sigkill_of_optimize_mid_benchmark(provider: LocalForkProvider,
                                                 sandbox: SandboxServer, server: str) -> None:
    async with open_connection(sandbox.dsn()) as conn:
        bench_lock = connection_lock_path(conn, "benchmark")
    optimize = await start_optimize(stdio_server(sandbox) if server == "stdio" else None)
    try:
        async def measuring() -> bool:
            return is_locked(bench_lock)

        # a fork first, then the benchmark (checked in that order: once measuring, the task
        # may be done and its forks gone before a second look at the server)
        await wait_until(lambda: a_fork_exists(provider), "a fork")
        await wait_until(measuring, "the benchmark")
        servers = fork_servers(optimize)
        assert bool(servers) is (server == "stdio")
        optimize.send_signal(signal.SIGKILL)
        await optimize.wait()
        # the orphaned fork server sees its stdin close and exits on its own; the forks of
        # the dead command are collected by the next one (`clean_after` runs `afs fork gc`)
        await trio.to_thread.run_sync(lambda: psutil.wait_procs(servers, timeout=30))
        assert not [s for s in servers if s.is_running()]
    finally:
        await stop(optimize)


async def test_sigkill_of_the_fork_server(provider: LocalForkProvider, sandbox: SandboxServer) -> None:
    optimize = await start_optimize(stdio_server(sandbox))
    try:
        await wait_until(lambda: a_fork_exists(provider), "a fork")
        servers = fork_servers(optimize)
        assert servers
        for server in servers:
            server.kill()
        # the task ends, whatever its agents made of it (a fork made before the kill may even
        # finish its work); it does not hang on a dead server
        with trio.fail_after(WAIT_S):
            await optimize.wait()
        assert optimize.returncode in (0, 1)
    finally:
        await stop(optimize)


async def test_sandbox_down_mid_task(provider: LocalForkProvider, sandbox: SandboxServer) -> None:
    optimize = await start_optimize()
    try:
        await wait_until(lambda: a_fork_exists(provider), "a fork")
        down = await afs("sandbox", "down")
        assert down.returncode == 0, down.stderr.decode()
        with trio.fail_after(WAIT_S):
            await optimize.wait()
        assert optimize.returncode != 0
    finally:
        await stop(optimize)
        await trio.to_thread.run_sync(sandbox.start)  # for the checks (gc would start it too)


@pytest.mark.parametrize("phase", ["agent", "task"])
async def test_a_time_limit_cuts_the_task_off(provider: LocalForkProvider, phase: str) -> None:
    # a query that runs for seconds at any scale (a join on a low-cardinality column): a task on
    # QUERY can finish within 1 s on an idle machine, and then nothing is cut off
    slow = "SELECT count(*) FROM orders a JOIN orders b ON a.status = b.status"
    result = await afs("optimize", "--provider", "heuristic", "--runs", "3", "--json", "--query", slow,
                       env={f"AFS_TIMEOUT_{phase.upper()}_S": "1"})
    report = json.loads(result.stdout)
    assert report["status"] == "failed", report
    assert "time limit" in report["error"] or "timed out" in json.dumps(report["proposals"])
    # the task closed its own forks: nothing for gc to do
    assert await provider.traces() == set()


async def test_ctrl_c(provider: LocalForkProvider) -> None:
    optimize = await start_optimize()
    try:
        await wait_until(lambda: a_fork_exists(provider), "a fork")
        optimize.send_signal(signal.SIGINT)
        with trio.fail_after(WAIT_S):
            await optimize.wait()
        assert optimize.returncode == 130
        assert await provider.traces() == set()  # closed its forks itself, before exiting
    finally:
        await stop(optimize)
