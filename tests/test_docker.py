"""Forks on a real `postgres:18` container (testcontainers); skipped without a Docker engine.

The same provider code the embedded sandbox uses, against a server reached over
TCP with a password: register a source, fork it, check isolation, delete. And the
docker-compose path end to end: the compose fork server registers a database, and
`afs optimize --dsn` runs its agents there, with no sandbox.
"""

from __future__ import annotations

import gc
import json
import os
import secrets
import shlex
import socket
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from psycopg import conninfo

from afs.db import open_connection
from afs.forks.provider import LocalForkProvider

PG_IMAGE = "postgres:18"
PG_COMMAND = "postgres -c shared_preload_libraries=pg_stat_statements -c compute_query_id=on"


def _ping_docker() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=2)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:  # DockerException, requests/urllib3 errors, no socket, ...: all mean "no"
        return False


def _docker_answers() -> bool:
    """Whether a Docker engine answers a ping (the `docker` package alone proves nothing)."""
    # A failed attempt leaves an unclosed socket in a reference cycle; collect it
    # now, with its ResourceWarning ignored, rather than at some later test's
    # teardown, where `-W error` would turn it into an error.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            return _ping_docker()
        finally:
            gc.collect()


DOCKER = _docker_answers()

pytestmark = [
    pytest.mark.docker,
    pytest.mark.skipif(
        not DOCKER,
        reason="no Docker engine answers (docker.from_env().ping() failed): "
               "the testcontainers and docker compose tests need one",
    ),
]


def _postgres_container_class() -> Any:
    # testcontainers.postgres is deprecated (it warns on import) for
    # testcontainers.community.postgres; import here, on the Docker-only path.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            from testcontainers.community.postgres import PostgresContainer
        except ImportError:
            from testcontainers.postgres import PostgresContainer
    return PostgresContainer


@pytest.fixture(scope="module")
def admin_dsn() -> Iterator[str]:
    """Superuser DSN (libpq URL) of a fresh postgres:18 container; removed afterwards."""
    container_class = _postgres_container_class()
    container = container_class(PG_IMAGE, username="postgres",
                                password="afs-" + secrets.token_hex(8),
                                dbname="postgres", driver=None)
    container.with_command(PG_COMMAND)
    try:
        with warnings.catch_warnings():
            # testcontainers' own deprecations are not ours to fail on
            warnings.simplefilter("ignore", DeprecationWarning)
            container.start()
        yield container.get_connection_url()  # postgresql://postgres:pw@host:port/postgres
    finally:
        container.stop()


def with_dbname(dsn: str, dbname: str) -> str:
    return conninfo.make_conninfo(dsn, dbname=dbname)


async def database_or_role_exists(admin_dsn: str, name: str) -> bool:
    async with open_connection(admin_dsn) as conn:
        return bool(await conn.fetchval(
            "SELECT 1 FROM pg_database WHERE datname = %s UNION ALL"
            " SELECT 1 FROM pg_roles WHERE rolname = %s", (name, name)))


async def test_fork_roundtrip_on_postgres_18(admin_dsn: str) -> None:
    async with open_connection(admin_dsn) as admin:
        assert int(await admin.fetchval("SHOW server_version_num")) >= 180000
        assert "pg_stat_statements" in await admin.fetchval("SHOW shared_preload_libraries")
        await admin.execute("CREATE DATABASE shop")
    shop_dsn = with_dbname(admin_dsn, "shop")
    async with open_connection(shop_dsn) as shop:
        await shop.execute("CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL)")
        await shop.execute(
            "INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, 100) g")
    # the template copy needs `shop` free of other sessions: the one above is closed

    provider = LocalForkProvider(admin_dsn)
    await provider.register_source("shop", origin="docker")
    assert "shop" in {s["name"] for s in (await provider.list_services())["sources"]}

    fork = await provider.fork("shop", ttl_seconds=60)
    try:
        assert fork.parent == "shop"
        async with open_connection(fork.dsn) as conn:
            assert await conn.fetchval("SELECT current_user") == fork.name
            assert await conn.fetchval("SELECT count(*) FROM items") == 100
            # the fork's role owns the copied table: it may write, index, drop
            await conn.execute("DELETE FROM items WHERE id > 10")
            await conn.execute("CREATE INDEX items_name_idx ON items (name)")
            await conn.execute("CREATE TABLE fork_only (x int)")
            assert await conn.fetchval("SELECT count(*) FROM items") == 10
        async with open_connection(shop_dsn) as shop:
            assert await shop.fetchval("SELECT count(*) FROM items") == 100
            assert await shop.fetchval("SELECT to_regclass('items_name_idx')") is None
            assert await shop.fetchval("SELECT to_regclass('fork_only')") is None
    finally:
        result = await provider.delete(fork.name)
    assert result == {"service_id": fork.name, "deleted": True}
    assert not await database_or_role_exists(admin_dsn, fork.name)
    assert fork.name not in {f["name"] for f in (await provider.list_services())["forks"]}


# -- docker compose, end to end: `afs optimize --dsn` with the compose fork server ------------
REPO = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def compose() -> Iterator[tuple[list[str], dict[str, str], str]]:
    """The compose project (db up, afs-forks built): its command prefix, environment, admin DSN."""
    project = "afs-test-" + secrets.token_hex(3)
    port = _free_port()
    password = "afs" + secrets.token_hex(8)
    env = {**os.environ, "AFS_DB_PORT": str(port), "POSTGRES_PASSWORD": password}
    base = ["docker", "compose", "-f", str(REPO / "docker-compose.yml"), "-p", project]
    try:
        subprocess.run([*base, "build", "afs-forks"], check=True, env=env, timeout=1200)
        subprocess.run([*base, "up", "-d", "--wait", "db"], check=True, env=env, timeout=300)
        yield base, env, f"postgresql://postgres:{password}@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*base, "down", "-v"], env=env, timeout=300, check=False)


async def test_compose_optimize_end_to_end(compose: tuple[list[str], dict[str, str], str],
                                           tmp_path: Path) -> None:
    base, env, admin_dsn = compose
    async with open_connection(admin_dsn) as admin:
        await admin.execute("CREATE DATABASE shop")
    shop_dsn = with_dbname(admin_dsn, "shop")
    async with open_connection(shop_dsn) as shop:
        await shop.execute(
            "CREATE TABLE orders AS SELECT g AS id, g % 2000 AS user_id,"
            " (ARRAY['pending', 'paid', 'shipped'])[1 + g % 3] AS status,"
            " now() - g * interval '1 minute' AS created_at, (g % 500)::numeric AS total_amount"
            " FROM generate_series(1, 200000) g")
        await shop.execute("VACUUM ANALYZE orders")
    register = await trio.run_process(
        [*base, "run", "--rm", "-T", "afs-forks", "sh", "-c",
         'afs mcp serve --admin-dsn "$AFS_ADMIN_DSN" --register shop'],
        stdin=b"", capture_stdout=True, capture_stderr=True, check=False, env=env)
    assert register.returncode == 0, register.stderr.decode()

    client_env = {**env, "AFS_HOME": str(tmp_path / "client"),
                  "AFS_FORK_SERVER_COMMAND": shlex.join([*base, "run", "--rm", "-T", "afs-forks"])}
    result = await trio.run_process(
        [sys.executable, "-m", "afs", "optimize", "--dsn", shop_dsn, "--provider", "heuristic",
         "--runs", "3", "--json", "--query",
         "SELECT id, total_amount FROM orders WHERE user_id = 42 AND status = 'pending'"
         " ORDER BY created_at DESC"],
        capture_stdout=True, capture_stderr=True, check=False, env=client_env)
    assert result.returncode == 0, result.stderr.decode()
    report = json.loads(result.stdout)
    assert report["status"] == "completed", report["error"]
    assert not (tmp_path / "client" / "sandbox").exists()  # no sandbox was needed
    assert await LocalForkProvider(admin_dsn).traces() == set()  # every fork was destroyed
