"""The sandbox commands, run as a user runs them: `python -m afs ...` in a subprocess."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio

from afs.config import load_settings
from afs.forks.provider import LocalForkProvider
from afs.sandbox.server import SandboxServer
from afs.testing import Child, run_afs


def afs(*args: str, home: Path | None = None, check: bool = True,
        timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return run_afs(*args, home=home, check=check, child=Child(timeout_s=timeout), text=True)


def test_status_json_points_at_the_demo_database(sandbox: SandboxServer) -> None:
    info = json.loads(afs("sandbox", "status", "--json").stdout)
    assert info["running"] is True
    assert info["database"] == "afs_demo"
    assert info["dsn"].startswith("postgresql://") and "/afs_demo?" in info["dsn"]
    assert info["size_mb"] > 10


def test_up_is_idempotent(sandbox: SandboxServer) -> None:
    pid = sandbox.status().pid
    info = json.loads(afs("sandbox", "up", "--json").stdout)
    assert info["running"] and info["started"] is False and info["seeded_seconds"] is None
    assert sandbox.status().pid == pid


def test_killed_half_way_then_up_and_down_still_work(own_home: Path) -> None:
    env = dict(os.environ, AFS_HOME=str(own_home), AFS_SCALE="small")
    with subprocess.Popen([sys.executable, "-m", "afs", "sandbox", "up"], env=env,
                          stderr=subprocess.PIPE, text=True) as first:
        assert first.stderr is not None
        for line in first.stderr:  # kill it in the middle of seeding
            if "step 5/" in line:
                first.send_signal(signal.SIGKILL)
                break
        first.wait()
    assert first.returncode == -signal.SIGKILL
    server = SandboxServer(load_settings({"AFS_HOME": str(own_home)}))
    assert server.status().running  # the server outlives the killed process...

    # ...and up manages it
    info = json.loads(afs("sandbox", "up", "--scale", "small", "--json", home=own_home).stdout)
    assert info["running"] and info["seeded_seconds"] is not None and info["size_mb"] > 10
    import psycopg

    with psycopg.connect(server.dsn("postgres")) as conn:
        names = {r[0] for r in conn.execute("SELECT datname FROM pg_database")}
    assert {"afs_demo", "afs_demo_template"} <= names
    assert "afs_demo_seeding" not in names
    with psycopg.connect(server.dsn("afs_demo")) as conn:
        assert conn.execute("SELECT count(*) FROM orders").fetchone() == (50_000,)

    pid = server.status().pid
    assert pid is not None
    afs("sandbox", "down", home=own_home)
    assert not server.status().running
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists(), "the postmaster is still running"
    down_again = json.loads(afs("sandbox", "down", "--json", home=own_home).stdout)
    assert down_again == {"running": False, "stopped": False}


def test_import_copies_a_database_that_can_be_forked(sandbox: SandboxServer) -> None:
    import psycopg

    source = sandbox.dsn("afs_demo")
    try:
        full = json.loads(afs("sandbox", "import", "--from", source, "--as", "shop_copy",
                              "--json").stdout)
        schema = json.loads(afs("sandbox", "import", "--from", source, "--as", "shop_schema",
                                "--schema-only", "--json").stdout)
        assert full["database"] == "shop_copy" and schema["schema_only"] is True
        with psycopg.connect(sandbox.dsn("shop_copy")) as conn:
            assert conn.execute("SELECT count(*) FROM orders").fetchone() == (50_000,)
        with psycopg.connect(sandbox.dsn("shop_schema")) as conn:
            assert conn.execute("SELECT count(*) FROM orders").fetchone() == (0,)
        fork = json.loads(afs("fork", "create", "--from", "shop_copy", "--json").stdout)
        try:
            assert fork["parent"] == "shop_copy"
            with psycopg.connect(fork["dsn"]) as conn:
                assert conn.execute("SELECT count(*) FROM users").fetchone() == (2_000,)
                conn.execute("CREATE INDEX ON orders (user_id)")  # the fork's role owns it
        finally:
            afs("fork", "destroy", fork["name"])
        again = afs("sandbox", "import", "--from", source, "--as", "shop_copy", check=False)
        assert again.returncode == 2 and "already" in again.stderr
    finally:
        provider = LocalForkProvider(sandbox.dsn())
        for name in ("shop_copy", "shop_schema"):
            trio.run(provider.drop_source, name)


def test_import_from_an_unreachable_database_fails_cleanly(sandbox: SandboxServer) -> None:
    import psycopg

    result = afs("sandbox", "import", "--from",
                 "postgresql://nobody:secret-pw@/nowhere?host=/nonexistent", "--as", "ghost",
                 check=False)
    assert result.returncode == 1
    assert "pg_dump failed" in result.stderr and "secret-pw" not in result.stderr
    assert "pg_dump failed: (no message)" not in result.stderr  # pg_dump's own words follow
    with psycopg.connect(sandbox.dsn("postgres")) as conn:
        left = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'ghost%'").fetchall()
    assert left == []


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["fork", "create", "--ttl", "0"], "--ttl must be a positive"),
        (["fork", "create", "--from", "nope"], "unknown service 'nope'"),
        (["fork", "create", "--name", "Bad Name"], "invalid fork name"),
        (["fork", "destroy", "afs_demo"], "not a fork"),
        (["sandbox", "import", "--from", "postgresql://x@/y", "--as", "Bad-Name"], "invalid database name"),
        (["sandbox", "up", "--scale", "huge"], "invalid choice"),
    ],
)
def test_bad_input_exits_2_with_one_clear_line(sandbox: SandboxServer, args: list[str],
                                               fragment: str) -> None:
    result = afs(*args, check=False)
    assert result.returncode == 2, result.stderr
    assert fragment in result.stderr
    assert "Traceback" not in result.stderr


def test_help_describes_every_command() -> None:
    for args in (["--help"], ["sandbox", "--help"], ["fork", "--help"], ["fork", "create", "--help"]):
        result = afs(*args)
        assert "usage: afs" in result.stdout
    assert "--ttl SECONDS" in afs("fork", "create", "--help").stdout


def test_refresh_brings_source_changes_to_new_forks(sandbox: SandboxServer) -> None:
    import psycopg

    with psycopg.connect(sandbox.dsn("afs_demo"), autocommit=True) as conn:
        conn.execute("CREATE TABLE refresh_probe (x int)")
    try:
        afs("sandbox", "refresh")
        fork = json.loads(afs("fork", "create", "--json").stdout)
        try:
            with psycopg.connect(fork["dsn"]) as conn:
                assert conn.execute("SELECT to_regclass('refresh_probe') IS NOT NULL").fetchone() == (True,)
        finally:
            afs("fork", "destroy", fork["name"])
    finally:
        with psycopg.connect(sandbox.dsn("afs_demo"), autocommit=True) as conn:
            conn.execute("DROP TABLE refresh_probe")
        afs("sandbox", "refresh")
    unknown = afs("sandbox", "refresh", "nope", check=False)
    assert unknown.returncode == 2 and "unknown service 'nope'" in unknown.stderr


# -- a real user's database: what the sandbox's server refuses (issue 9, item 16) -------------
IMPORT_SOURCE_SQL = """
CREATE TABLE t (id int PRIMARY KEY, c int);
ALTER TABLE t ALTER COLUMN c SET (n_distinct = 100);
INSERT INTO t SELECT i, i % 10 FROM generate_series(1, 1000) AS i;
CREATE INDEX t_c ON t (c);
CREATE TABLE u (id int);
INSERT INTO u VALUES (1), (2);
"""


@pytest.fixture
def patched_dump(sandbox: SandboxServer, tmp_path: Path) -> Iterator[Callable[[bytes, bytes], Path]]:
    """A custom-format dump of a small database, with one same-length edit in its SQL: what a
    dump from another server version carries that this server does not know."""
    import psycopg

    from afs.sandbox.importer import dump

    with psycopg.connect(sandbox.dsn("postgres"), autocommit=True) as conn:
        for db in ("afs_imp_src", "afs_imp_dst"):
            conn.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
            conn.execute(f"CREATE DATABASE {db}")
    with psycopg.connect(sandbox.dsn("afs_imp_src"), autocommit=True) as conn:
        conn.execute(IMPORT_SOURCE_SQL)
    original = tmp_path / "source.dump"
    dump(sandbox.dsn("afs_imp_src"), original)

    def patched(old: bytes, new: bytes) -> Path:
        assert len(old) == len(new)
        data = original.read_bytes()
        assert data.count(old) == 1
        path = tmp_path / "patched.dump"
        path.write_bytes(data.replace(old, new))
        return path

    try:
        yield patched
    finally:
        with psycopg.connect(sandbox.dsn("postgres"), autocommit=True) as conn:
            for db in ("afs_imp_src", "afs_imp_dst"):
                conn.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")


def test_restore_skips_a_setting_the_server_refuses_and_keeps_every_row(
        sandbox: SandboxServer, patched_dump: Callable[[bytes, bytes], Path]) -> None:
    """An attribute option PostgreSQL 18 rejects sits in the TABLE entry of the dump: the
    table, its rows and its indexes arrive; the option is skipped and listed."""
    import psycopg

    from afs.sandbox.importer import restore

    skipped = restore(patched_dump(b"n_distinct=", b"n_distinkt="), sandbox.dsn("afs_imp_dst"))
    assert len(skipped) == 1, skipped
    assert "n_distinkt=100" in skipped[0] and 'unrecognized parameter "n_distinkt"' in skipped[0]
    assert skipped[0].startswith("TABLE public t: ALTER TABLE ONLY public.t ALTER COLUMN c")
    with psycopg.connect(sandbox.dsn("afs_imp_dst")) as conn:
        assert conn.execute("SELECT count(*), count(DISTINCT c) FROM t").fetchone() == (1000, 10)
        assert conn.execute("SELECT count(*) FROM u").fetchone() == (2,)
        indexes = {r[0] for r in conn.execute("SELECT indexname FROM pg_indexes WHERE tablename = 't'")}
        assert indexes == {"t_pkey", "t_c"}


def test_restore_fails_when_rows_would_be_lost_and_says_it_was_the_restore(
        sandbox: SandboxServer, patched_dump: Callable[[bytes, bytes], Path]) -> None:
    from afs.errors import SandboxError
    from afs.sandbox.importer import restore

    broken = patched_dump(b"CREATE TABLE public.t (", b"CREATE TABLE publix.t (")
    with pytest.raises(SandboxError) as info:
        restore(broken, sandbox.dsn("afs_imp_dst"))
    message = str(info.value)
    assert message.startswith("pg_restore failed: the data of these could not be restored")
    assert "TABLE DATA public t" in message and 'relation "public.t" does not exist' in message
    assert "pg_dump" not in message


def test_restore_that_cannot_start_reports_its_own_error(tmp_path: Path, sandbox: SandboxServer) -> None:
    from afs.errors import SandboxError
    from afs.sandbox.importer import restore

    not_a_dump = tmp_path / "x.dump"
    not_a_dump.write_text("hello")
    with pytest.raises(SandboxError, match=r"^pg_restore failed: .*input file does not appear"):
        restore(not_a_dump, sandbox.dsn("postgres"))


def test_status_works_without_the_demo_database(own_home: Path) -> None:
    """A sandbox holding only imports (or nothing yet): status says so instead of failing."""
    server = SandboxServer(load_settings({"AFS_HOME": str(own_home)}))
    server.start()
    info = json.loads(afs("sandbox", "status", "--json", home=own_home).stdout)
    assert info["running"] is True and info["size_mb"] is None and info["database"] == "afs_demo"
    text = afs("sandbox", "status", home=own_home).stdout
    assert "afs_demo (not seeded)" in text


def test_status_shows_the_disk_afs_home_takes(sandbox: SandboxServer) -> None:
    info = json.loads(afs("sandbox", "status", "--json").stdout)
    assert info["disk_mb"] > info["size_mb"] > 10  # the demo database and all else in AFS_HOME
    # a second call measures again (logs and statistics grow in between): the line, not the same figure
    line = re.search(r"^disk: ([0-9.]+) MB in (\S+) ", afs("sandbox", "status").stdout, re.MULTILINE)
    assert line is not None and line.group(2) == info["home"]
    assert float(line.group(1)) > info["size_mb"]


def test_a_command_that_starts_the_sandbox_says_it_keeps_running(own_home: Path) -> None:
    # `afs history` needs the task store, which lives in the sandbox: it starts it, and says so
    first = afs("history", home=own_home)
    assert "keeps running" in first.stderr and "afs sandbox down" in first.stderr
    again = afs("history", home=own_home)  # running already: nothing to say
    assert "keeps running" not in again.stderr
    status = afs("sandbox", "status", home=own_home)
    assert status.stdout.startswith("sandbox: running") and "disk: " in status.stdout
