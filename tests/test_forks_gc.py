"""Garbage collection of forks: one fork at a time, at start and while the server runs (issue 9, item 8)."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator

import pytest
import trio

from afs.config import Settings
from afs.db import open_connection
from afs.forks.client import open_fork_client
from afs.forks.naming import fork_name
from afs.forks.provider import LocalForkProvider
from afs.pg.names import quote_ident
from afs.sandbox.server import SandboxServer

pytestmark = pytest.mark.usefixtures("no_leaked_forks")


@pytest.fixture
async def undroppable(provider: LocalForkProvider, sandbox: SandboxServer) -> AsyncIterator[str]:
    """An expired fork whose role cannot be dropped: it holds a privilege in another database."""
    fork = await provider.fork("afs_demo", name=fork_name("aaa-pinned", 1), ttl_seconds=1)
    async with open_connection(sandbox.dsn()) as admin:
        await admin.execute("CREATE TABLE IF NOT EXISTS public.gc_pin (x int)")
        await admin.execute(f"GRANT SELECT ON public.gc_pin TO {quote_ident(fork.name)}")
    try:
        yield fork.name
    finally:
        async with open_connection(sandbox.dsn()) as admin:
            await admin.execute("DROP TABLE public.gc_pin")
        await provider.delete(fork.name)


async def test_one_fork_that_cannot_be_dropped_does_not_stop_the_others(
        provider: LocalForkProvider, undroppable: str) -> None:
    other = await provider.fork("afs_demo", name=fork_name("zzz-expired", 1), ttl_seconds=1)
    await trio.sleep(1.2)
    report = await provider.gc()
    assert other.name in report.removed
    assert undroppable not in report.removed
    assert "cannot be dropped" in report.failed[undroppable]
    assert other.name not in await provider.traces()
    assert undroppable in await provider.traces()  # kept for the next round


async def test_the_fork_server_starts_with_an_undroppable_fork(
        settings: Settings, provider: LocalForkProvider, undroppable: str) -> None:
    await trio.sleep(1.2)
    async with open_fork_client(settings) as client:  # the server collects first, then serves
        services = await client.list_services()
    assert "afs_demo" in {s["name"] for s in services["sources"]}


async def test_cli_gc_reports_what_it_could_not_remove(
        provider: LocalForkProvider, undroppable: str) -> None:
    await trio.sleep(1.2)
    result = await trio.run_process([sys.executable, "-m", "afs", "fork", "gc", "--json"],
                                    capture_stdout=True, check=False)
    import json

    report = json.loads(result.stdout)
    assert result.returncode == 1
    assert undroppable in report["failed"]


async def test_a_running_fork_server_collects_expired_forks(
        settings: Settings, provider: LocalForkProvider) -> None:
    env = {**os.environ, "AFS_FORK_GC_INTERVAL_S": "1"}
    from afs.config import load_settings

    fast = load_settings(env)
    assert fast.fork_gc_interval_s == 1
    os.environ["AFS_FORK_GC_INTERVAL_S"] = "1"  # the server process inherits it
    try:
        async with open_fork_client(fast) as client:
            fork = await client.create("afs_demo", ttl_seconds=1)  # no owner: only the TTL applies
            with trio.fail_after(20):
                # polling another process's work: no trio.Event can tell us
                while fork.name in await provider.traces():  # noqa: ASYNC110
                    await trio.sleep(0.2)
            # and the session is still up
            assert fork.name not in {f["name"] for f in (await client.list_services())["forks"]}
    finally:
        del os.environ["AFS_FORK_GC_INTERVAL_S"]
