"""`afs sandbox reclaim` (issue 27 item 10): it lists the copies in the sandbox and their size,
says what it will remove and how much before it does, asks (no terminal: --yes or exit 2), never
touches a fork in use (the copy it was made from stays), and frees the space."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import psycopg
import pytest
import trio

from afs.forks.provider import LocalForkProvider, template_name
from afs.sandbox.importer import import_database
from afs.sandbox.server import SandboxServer
from afs.testing import run_afs


def databases(sandbox: SandboxServer) -> set[str]:
    with psycopg.connect(sandbox.dsn()) as conn:
        return {str(r[0]) for r in conn.execute("SELECT datname FROM pg_database").fetchall()}


@pytest.fixture
def copy(sandbox: SandboxServer, provider: LocalForkProvider) -> Iterator[str]:
    """An imported copy of a small database (dropped afterwards if the test left it)."""
    shop, name = "afs_reclaim_s_" + os.urandom(3).hex(), "afs_reclaim_c_" + os.urandom(3).hex()
    with psycopg.connect(sandbox.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {shop}")
    with psycopg.connect(sandbox.dsn(shop), autocommit=True) as conn:
        conn.execute("CREATE TABLE t AS SELECT g AS id, repeat('x', 200) AS pad"
                     " FROM generate_series(1, 20000) g")
    try:
        trio.run(import_database, sandbox, sandbox.dsn(shop), name)
        yield name
    finally:
        trio.run(provider.drop_source, name)
        with psycopg.connect(sandbox.dsn(), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {shop} WITH (FORCE)")


@pytest.mark.usefixtures("no_leaked_forks")
def test_reclaim_says_what_and_how_much_asks_and_never_touches_a_fork_in_use(
        copy: str, sandbox: SandboxServer, provider: LocalForkProvider) -> None:
    listed = run_afs("sandbox", "reclaim", "--json", text=True, check=True)
    [found] = [c for c in json.loads(listed.stdout)["copies"] if c["name"] == copy]
    assert found["kind"] == "import" and found["size_mb"] > 1 and found["forks_in_use"] == []
    assert json.loads(listed.stdout)["removed"] == [] and copy in databases(sandbox)  # a list removes nothing

    # no terminal to ask and no --yes: it says what would go, and refuses
    unasked = run_afs("sandbox", "reclaim", "--copy", copy, text=True)
    assert unasked.returncode == 2 and "--yes" in unasked.stderr
    assert f"  {copy}: {found['size_mb']:,.1f} MB, import of" in unasked.stdout
    assert "in all:" in unasked.stdout
    assert copy in databases(sandbox)
    missing = run_afs("sandbox", "reclaim", "--copy", "nosuch", "--yes", text=True)
    assert missing.returncode == 2 and "no copy named nosuch" in missing.stderr

    # a fork of it in use: the copy stays, and the fork with it
    fork = trio.run(provider.fork, copy)
    try:
        busy = run_afs("sandbox", "reclaim", "--copy", copy, "--yes", "--json", text=True, check=True)
        doc = json.loads(busy.stdout)
        assert doc["removed"] == [] and doc["kept"][0]["name"] == copy
        assert fork.name in doc["kept"][0]["reason"]
        assert {copy, template_name(copy), fork.name} <= databases(sandbox)
    finally:
        trio.run(provider.delete, fork.name)

    done = run_afs("sandbox", "reclaim", "--copy", copy, "--yes", text=True, check=True)
    assert f"removed {copy} ({found['size_mb']:,.1f} MB)" in done.stdout and "freed " in done.stdout
    assert not {copy, template_name(copy)} & databases(sandbox)
