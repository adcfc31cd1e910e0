"""The sandbox commands, run as a user runs them: `python -m afs ...` in a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from afs.config import load_settings
from afs.forks.provider import LocalForkProvider
from afs.sandbox.server import SandboxServer


def afs(*args: str, home: Path | None = None, check: bool = True,
        timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if home is not None:
        env["AFS_HOME"] = str(home)
    result = subprocess.run([sys.executable, "-m", "afs", *args], capture_output=True, text=True,
                            env=env, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"afs {' '.join(args)} -> {result.returncode}\n{result.stderr}")
    return result


@pytest.fixture
def own_home() -> Iterator[Path]:
    """A second sandbox of its own, stopped with pg_ctl whatever happens."""
    home = Path(tempfile.mkdtemp(prefix="afs-o-"))
    try:
        yield home
    finally:
        try:
            SandboxServer(load_settings({"AFS_HOME": str(home)})).destroy()
        finally:
            shutil.rmtree(home, ignore_errors=True)


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
