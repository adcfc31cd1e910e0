"""Spares: where forks clone, the fork server keeps ready forks of each source it has
forked, and a fork of that source claims one in one transaction instead of copying.

The clone path needs an XFS image (root, loop devices, mkfs.xfs): `afs sandbox up --cow`
in a home of this module's own; where forks copy (the session's sandbox), no spare is made.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from mcp import Client

from afs.config import load_settings
from afs.db import open_connection
from afs.errors import DatabaseError
from afs.forks.client import Fork, ForkClient
from afs.forks.provider import LocalForkProvider
from afs.forks.server import build_server, keep_spares
from afs.sandbox.server import SandboxServer
from afs.sandbox.storage import CowImage, CowUnavailable

SOURCE = "afs_demo"


@pytest.fixture(scope="module")
def cow_dsn() -> Iterator[str]:
    """The admin DSN of a sandbox of its own on an XFS image (small demo data)."""
    home = Path(tempfile.mkdtemp(prefix="afs-sp-"))
    try:
        try:
            CowImage(load_settings({"AFS_HOME": str(home)})).check_can_mount()
        except CowUnavailable as exc:
            pytest.skip(f"spares need forks that clone (root, loop devices, mkfs.xfs): {exc}")
        env = dict(os.environ, AFS_HOME=str(home), AFS_SCALE="small")
        result = subprocess.run([sys.executable, "-m", "afs", "sandbox", "up", "--cow", "--cow-size",
                                 "1G", "--json"], capture_output=True, text=True, env=env, timeout=300)
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["fork_method"] == "clone"
        yield SandboxServer(load_settings({"AFS_HOME": str(home)})).dsn("postgres")
    finally:
        try:
            SandboxServer(load_settings({"AFS_HOME": str(home)})).destroy()
        finally:
            shutil.rmtree(home, ignore_errors=True)


async def spare_names(provider: LocalForkProvider) -> set[str]:
    async with open_connection(provider.admin_dsn) as conn:
        rows = await conn.fetchall("SELECT name FROM afs.forks WHERE state = 'spare'")
    return {r[0] for r in rows}


async def remove_everything(provider: LocalForkProvider) -> None:
    for name in await provider.traces():
        await provider.delete(name)


async def test_a_fork_claims_a_spare_that_is_a_whole_fork_of_its_own(cow_dsn: str) -> None:
    provider = LocalForkProvider(cow_dsn, spares=2)
    try:
        first = await provider.fork(SOURCE, ttl_seconds=600)  # none yet: made by cloning
        assert await spare_names(provider) == set()
        made = await provider.top_up_spares()
        assert len(made) == 2 and await spare_names(provider) == set(made)
        assert await provider.top_up_spares() == []  # topped up already
        listed = {f["name"] for f in (await provider.list_services())["forks"]}
        assert listed == {first.name}  # spares are not forks anyone sees

        fork = await provider.fork(SOURCE, name="afs-fork-claimed", ttl_seconds=120, owner_pid=os.getpid())
        left = await spare_names(provider)
        assert len(left) == 1 and left < set(made)
        claimed = (set(made) - left).pop()
        traces = await provider.traces()
        assert claimed not in traces and "afs-fork-claimed" in traces  # database and role renamed
        assert fork.ttl_seconds == 120 and fork.owner is not None and str(os.getpid()) in fork.owner

        # the fork's own role logs in with the new password, owns the tables, has its limits
        async with open_connection(fork.dsn) as conn:
            assert await conn.fetchval("SELECT current_user") == "afs-fork-claimed"
            assert await conn.fetchval("SELECT count(*) FROM users") > 0
            await conn.execute("CREATE INDEX spare_t_idx ON orders (user_id)")
            assert await conn.fetchval("SELECT current_setting('afs.max_growth_mb')::int") \
                == provider.limits.max_growth_mb
        old_dsn = fork.dsn.replace("afs-fork-claimed", claimed)
        with pytest.raises(DatabaseError):
            async with open_connection(old_dsn):
                pass
        # a change in one fork is nowhere else: not in the next claimed spare
        other = await provider.fork(SOURCE, ttl_seconds=60)
        async with open_connection(other.dsn) as conn:
            assert not await conn.fetchval("SELECT 1 FROM pg_indexes WHERE indexname = 'spare_t_idx'")
        assert await spare_names(provider) == set()
        assert (await provider.delete(fork.name))["deleted"]
    finally:
        await remove_everything(provider)


async def test_spares_of_an_older_template_are_never_claimed_and_are_collected(cow_dsn: str) -> None:
    provider = LocalForkProvider(cow_dsn, spares=1)
    try:
        await provider.delete((await provider.fork(SOURCE, ttl_seconds=60)).name)
        [spare] = await provider.top_up_spares()
        async with open_connection(cow_dsn) as conn:  # the source changed and was re-copied
            await conn.execute("UPDATE afs.sources SET refreshed_at = now() WHERE name = %s", (SOURCE,))
        fork = await provider.fork(SOURCE, ttl_seconds=60)
        assert spare in await spare_names(provider)  # not claimed: it holds the old data
        report = await provider.gc()
        assert spare in report.removed and spare not in await provider.traces()
        await provider.delete(fork.name)

        [spare] = await provider.top_up_spares()
        await provider.refresh_template(SOURCE)  # a real refresh removes them at once
        assert spare not in await provider.traces()
    finally:
        await remove_everything(provider)


async def test_the_fork_server_tops_up_the_spares_after_a_fork(cow_dsn: str) -> None:
    provider = LocalForkProvider(cow_dsn, spares=3)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(keep_spares, provider)
            async with Client(build_server(provider)) as session:
                client = ForkClient(session)
                squad = [await client.create(SOURCE, ttl_seconds=60) for _ in range(1)]
                with trio.fail_after(60):
                    while len(await spare_names(provider)) < 3:  # noqa: ASYNC110 (another task)
                        await trio.sleep(0.05)
                # a squad of three at once: all three claimed, and topped up again afterwards
                ready = await spare_names(provider)
                async with trio.open_nursery() as claims:
                    for _ in range(3):
                        claims.start_soon(_append, client, squad)
                assert len(squad) == 4 and len({f.name for f in squad}) == 4
                assert ready.isdisjoint(await provider.traces())  # claimed, renamed
                with trio.fail_after(60):
                    while len(await spare_names(provider)) < 3:  # noqa: ASYNC110 (another task)
                        await trio.sleep(0.05)
                for fork in squad:
                    assert await client.destroy(fork.name)
            nursery.cancel_scope.cancel()
        assert await spare_names(provider) and not (await provider.list_services())["forks"]
    finally:
        await remove_everything(provider)


async def test_spares_are_made_once_the_forks_asked_for_are_done(cow_dsn: str) -> None:
    provider = LocalForkProvider(cow_dsn, spares=2)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(keep_spares, provider)
            seed = await provider.fork(SOURCE, ttl_seconds=60)  # the source is forked here now
            with trio.fail_after(60):
                while len(await spare_names(provider)) < 2:  # noqa: ASYNC110 (another task)
                    await trio.sleep(0.05)
            # a fork made (a spare claimed, which asks for a top-up) and deleted at once: the
            # top-up waits for both, so no CREATE DATABASE of a spare slows the delete down
            before = await spare_names(provider)
            async with open_connection(provider.admin_dsn) as conn:  # open before: the clock at once
                claimed = await provider.fork(SOURCE, ttl_seconds=60)
                assert (await provider.delete(claimed.name))["deleted"]
                deleted_at = await conn.fetchval("SELECT clock_timestamp()")
                with trio.fail_after(60):
                    while len(await spare_names(provider)) < 2:  # noqa: ASYNC110 (another task)
                        await trio.sleep(0.05)
                new = sorted(await spare_names(provider) - before)
                made = await conn.fetchval("SELECT min(created_at) FROM afs.forks WHERE name = ANY(%s)",
                                           (new,))
            assert new and made > deleted_at
            await provider.delete(seed.name)
            nursery.cancel_scope.cancel()
    finally:
        await remove_everything(provider)


async def _append(client: ForkClient, squad: list[Fork]) -> None:
    squad.append(await client.create(SOURCE, ttl_seconds=60))


async def test_where_forks_copy_no_spare_is_made(provider: LocalForkProvider) -> None:
    async with open_connection(provider.admin_dsn) as conn:
        if await conn.fetchval("SHOW file_copy_method") == "clone":
            pytest.skip("the session's sandbox clones here")
    copying = LocalForkProvider(provider.admin_dsn, spares=2)
    fork = await copying.fork(SOURCE, ttl_seconds=60)
    try:
        assert await copying.top_up_spares() == []
        assert await spare_names(copying) == set()
    finally:
        await copying.delete(fork.name)
