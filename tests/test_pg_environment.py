"""The user's libpq variables steer the user's database, never AFS's own sandbox.

A Postgres user's shell often has PGPORT, PGHOST, PGSERVICE … set for a server of their own.
AFS takes them out of its process environment at start-up (afs.config.take_libpq_environment)
and writes them into the user's DSNs itself (afs.db.resolve_dsn); the sandbox and its forks
(DSNs marked with afs.db.OWN_SERVER_MARK) never see them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from afs.db import OWN_SERVER_MARK, connect_sync, is_own_server, resolve_dsn
from afs.errors import InputError
from afs.sandbox.server import SandboxServer
from afs.testing import run_afs

# Each one wrong for the sandbox: a port nothing listens on, a host that does not exist, a
# service no file defines, options the server refuses, TLS or GSS demanded on a unix socket…
WRONG = {
    "PGPORT": "5999", "PGHOST": "/nonexistent", "PGHOSTADDR": "10.255.255.1", "PGUSER": "nobody",
    "PGDATABASE": "nodb", "PGSERVICE": "nosuch", "PGSERVICEFILE": "/nonexistent/pg_service.conf",
    "PGOPTIONS": "-c work_mem=bogus", "PGSSLMODE": "require", "PGGSSENCMODE": "require",
    "PGTARGETSESSIONATTRS": "standby", "PGREQUIREAUTH": "scram-sha-256", "PGCHANNELBINDING": "require",
    "PGSSLNEGOTIATION": "direct", "PGREQUIREPEER": "nobody", "PGCLIENTENCODING": "LATIN1",
    "PGPASSWORD": "wrong", "PGPASSFILE": "/nonexistent/pgpass", "PGCONNECT_TIMEOUT": "1",
    "PGTZ": "Asia/Tokyo", "PGDATESTYLE": "SQL, DMY",
}


def _afs(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_afs(*args, env=env, text=True)


def test_the_sandbox_commands_work_with_every_libpq_variable_set_wrong(sandbox: SandboxServer) -> None:
    env = {**os.environ, **WRONG}
    status = _afs("sandbox", "status", "--json", env=env)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["running"] is True
    history = _afs("history", "--json", env=env)
    assert history.returncode == 0, history.stderr
    assert isinstance(json.loads(history.stdout), list)


@pytest.mark.parametrize("name", sorted(WRONG))
def test_an_own_server_connection_ignores_each_variable(sandbox: SandboxServer, name: str) -> None:
    # in this process, as AFS runs: the variable taken out of the environment, the DSN marked
    dsn = sandbox.dsn()
    assert is_own_server(dsn)
    assert resolve_dsn(dsn, {name: WRONG[name]}) == dsn
    with connect_sync(dsn) as conn:
        row = conn.execute("SELECT current_setting('TimeZone'), current_setting('DateStyle')").fetchone()
    assert row is not None and row[1].startswith("ISO")


def test_a_users_dsn_takes_the_variables_in_libpqs_order(tmp_path: Path) -> None:
    # the DSN first, then its service, then the variables
    services = tmp_path / "services.conf"
    services.write_text("# the user's services\n[shop]\nhost=db.example\nport=6432\ndbname=shop\n")
    env = {"PGSERVICEFILE": str(services), "PGPORT": "7777", "PGUSER": "ann", "PGPASSWORD": "pw",
           "PGSSLMODE": "verify-full", "PGTZ": "Asia/Tokyo"}
    resolved = resolve_dsn("service=shop dbname=other", env)
    from psycopg import conninfo

    params = conninfo.conninfo_to_dict(resolved)
    assert params["host"] == "db.example" and params["port"] == "6432"  # the service beats PGPORT
    assert params["dbname"] == "other"  # the DSN beats the service
    assert params["user"] == "ann" and params["password"] == "pw" and params["sslmode"] == "verify-full"
    assert "service" not in params  # expanded here: libpq never reads a service file again
    assert params["options"] == "-c TimeZone=Asia/Tokyo"
    # nothing but the variables: what `psql` with no arguments would reach
    bare = conninfo.conninfo_to_dict(resolve_dsn("", {"PGHOST": "h", "PGPORT": "7777"}))
    assert bare == {"host": "h", "port": "7777"}


def test_a_service_nobody_defines_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="service 'nosuch' is not defined"):
        resolve_dsn("", {"PGSERVICE": "nosuch", "PGSERVICEFILE": str(tmp_path / "none.conf")})


def test_a_users_target_named_only_by_variables_is_reached(sandbox: SandboxServer) -> None:
    host = str(sandbox.settings.socket_dir)
    dsn = resolve_dsn("", {"PGHOST": host, "PGUSER": "postgres", "PGDATABASE": "postgres",
                           "PGTZ": "Asia/Tokyo", "PGDATESTYLE": "ISO, DMY"})
    assert OWN_SERVER_MARK[1] not in dsn
    with connect_sync(dsn) as conn:
        row = conn.execute("SELECT current_database(), current_setting('TimeZone'),"
                           " current_setting('DateStyle')").fetchone()
    assert row == ("postgres", "Asia/Tokyo", "ISO, DMY")


@pytest.mark.parametrize("how", ["AFS_DATABASE_URL", "PG*"])
def test_optimize_takes_the_target_every_command_takes(sandbox: SandboxServer, how: str) -> None:
    # the target named by the environment, as import, apply and rollback read it (before: the
    # demo database, silently): its database `postgres` has no copy in the sandbox yet
    host = str(sandbox.settings.socket_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG") and k != "AFS_DATABASE_URL"}
    if how == "AFS_DATABASE_URL":
        env["AFS_DATABASE_URL"] = f"postgresql://postgres@/postgres?host={host}"
    else:
        env.update(PGHOST=host, PGUSER="postgres", PGDATABASE="postgres")
    done = _afs("optimize", "--provider", "heuristic", "--query", "SELECT id FROM orders WHERE user_id = 1",
                env=env)
    assert done.returncode == 2, done.stderr
    assert f"{host}:5432/postgres is not in the sandbox yet" in done.stderr


def test_an_unknown_table_names_the_database_looked_in(sandbox: SandboxServer) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG") and k != "AFS_DATABASE_URL"}
    done = _afs("optimize", "--provider", "heuristic", "--query", "SELECT * FROM t", env=env)
    assert done.returncode == 2, done.stderr
    assert "unknown table t in the query (looked in database 'afs_demo')" in done.stderr


def test_the_query_from_standard_input_or_a_file(sandbox: SandboxServer, tmp_path: Path) -> None:
    # a query of many lines is not typed on a command line: --query - and --file, checked alike
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG") and k != "AFS_DATABASE_URL"}
    unknown = "SELECT *\n  FROM t\n WHERE id = 1\n"
    piped = subprocess.run([sys.executable, "-m", "afs", "optimize", "--provider", "heuristic",
                            "--query", "-"], input=unknown, capture_output=True, text=True, env=env,
                           timeout=300)
    assert piped.returncode == 2 and "unknown table t in the query" in piped.stderr, piped.stderr
    path = tmp_path / "q.sql"
    path.write_text(unknown)
    filed = _afs("optimize", "--provider", "heuristic", "--file", str(path), env=env)
    assert filed.returncode == 2 and "unknown table t in the query" in filed.stderr, filed.stderr
    path.write_bytes(b"SELECT 1 FROM t WHERE x = '\xff'")
    bad = _afs("optimize", "--provider", "heuristic", "--file", str(path), env=env)
    assert bad.returncode == 2 and "is not UTF-8 text" in bad.stderr and "Traceback" not in bad.stderr
    missing = _afs("optimize", "--provider", "heuristic", "--file", str(tmp_path / "none.sql"), env=env)
    assert missing.returncode == 2 and "cannot read the query" in missing.stderr
    both = _afs("optimize", "--query", "SELECT 1", "--file", str(path), env=env)
    assert both.returncode == 2 and "not allowed with argument" in both.stderr


def test_psqls_flags_name_the_target(sandbox: SandboxServer) -> None:
    # -d/-p/-U and --host as psql has them (-h is --help), written over --dsn or the configured target
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG") and k != "AFS_DATABASE_URL"}
    host = str(sandbox.settings.socket_dir)
    done = _afs("optimize", "--provider", "heuristic", "--host", host, "-p", "5432", "-U", "postgres",
                "-d", "postgres", "--query", "SELECT id FROM orders", env=env)
    assert done.returncode == 2, done.stderr
    assert f"{host}:5432/postgres is not in the sandbox yet" in done.stderr


def test_a_json_error_is_json(sandbox: SandboxServer) -> None:
    # a script that asked for --json reads why on stdout, with the exit code
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG") and k != "AFS_DATABASE_URL"}
    done = _afs("optimize", "--provider", "heuristic", "--json", "--query", "SELECT * FROM t", env=env)
    assert done.returncode == 2
    doc = json.loads(done.stdout)
    assert doc["code"] == 2 and doc["kind"] == "InputError" and "unknown table t" in doc["error"]
    assert "afs: error: unknown table t" in done.stderr
