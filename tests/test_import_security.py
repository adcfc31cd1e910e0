"""An imported database's code runs with the rights of the copy's own role, never the sandbox
superuser's; the sandbox's server sees none of AFS's environment; no password on a child's
command line (issue 23, items 2 and 8).

The planted source: a NOSUPERUSER role owns a table whose index expression, CHECK constraint
and materialized view call its own IMMUTABLE function, which calls a VOLATILE one that tries
`RESET ROLE` (what a session opened as the superuser with `SET ROLE` would allow) and then
`COPY … TO PROGRAM 'touch <marker>'`. It is dormant in the source database and wakes in any
other, so the source can be made by its ordinary owner. A marker file appears only when the
code ran with superuser rights; the positive control at the end shows that it does then.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import psycopg
import pytest

from afs.config import load_settings
from afs.errors import SandboxError
from afs.forks.provider import LocalForkProvider
from afs.pg.names import quote_ident
from afs.sandbox.importer import dump, dump_command, import_database, import_owner, restore_command
from afs.sandbox.server import SandboxServer, dsn_for

# act(tag): as a superuser it leaves the file <markers>/<tag>-<build|analyze>; else it fails
# (caught: the import goes on, the object is built without the superuser's rights)
PLANTED_SQL = """
CREATE FUNCTION public.act(tag text) RETURNS void VOLATILE LANGUAGE plpgsql AS $f$
BEGIN
  IF current_database() = {source} THEN RETURN; END IF;  -- dormant in the source
  BEGIN
    EXECUTE 'RESET ROLE';  -- back to the session's user, where SET ROLE was used
  EXCEPTION WHEN OTHERS THEN NULL; END;
  BEGIN
    -- leaves the database's settings planted for the superuser's later sessions
    EXECUTE format('ALTER DATABASE %I SET search_path = public, pg_catalog', current_database());
  EXCEPTION WHEN OTHERS THEN NULL; END;
  {copy}
END $f$;
CREATE FUNCTION public.plant(x int, tag text) RETURNS int IMMUTABLE LANGUAGE plpgsql
  AS $f$ BEGIN PERFORM public.act(tag); RETURN x; END $f$;
-- for a superuser session whose search_path puts public first
CREATE FUNCTION public.pg_stat_reset() RETURNS void LANGUAGE plpgsql
  AS $f$ BEGIN PERFORM public.act('pg_stat_reset'); END $f$;
-- exact matches for calls a superuser's catalog query may make (the catalog's take text and
-- regclass): quote_ident(nspname) in a fork's hand-over, pg_relation_size(c.oid) anywhere
CREATE FUNCTION public.quote_ident(name) RETURNS text LANGUAGE plpgsql
  AS $f$ BEGIN PERFORM public.act('quote_ident'); RETURN pg_catalog.quote_ident($1::text); END $f$;
CREATE FUNCTION public.pg_relation_size(oid) RETURNS bigint LANGUAGE plpgsql AS $f$
  BEGIN PERFORM public.act('pg_relation_size'); RETURN pg_catalog.pg_relation_size($1::regclass); END $f$;
CREATE TABLE public.t (id int CHECK (public.plant(id, 'check') IS NOT NULL));
INSERT INTO public.t SELECT generate_series(1, 50);
CREATE INDEX t_planted ON public.t (public.plant(id, 'index'));
CREATE MATERIALIZED VIEW public.mv AS SELECT public.plant(id, 'matview') AS p FROM public.t;
"""
CAUGHT_COPY = """BEGIN
    EXECUTE format('COPY (SELECT 1) TO PROGRAM %L', 'touch {markers}/' || tag || '-'
                   || CASE WHEN current_query() ~* '^\\s*analyze' THEN 'analyze' ELSE 'build' END);
  EXCEPTION WHEN OTHERS THEN NULL; END;"""
# the same without the exception handler: the planted statement fails without the rights
UNCAUGHT_COPY = "EXECUTE format('COPY (SELECT 1) TO PROGRAM %L', 'touch {markers}/' || tag);"


@pytest.fixture
def markers() -> Iterator[Path]:
    """A directory the server's user may write to (it runs as another user when AFS is root)."""
    path = Path(tempfile.mkdtemp(prefix="afs-markers-"))
    path.chmod(0o777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def planted_source(sandbox: SandboxServer,
                   markers: Path) -> Iterator[Callable[[str], str]]:
    """make(copy_sql): a source database owned by a NOSUPERUSER role, with PLANTED_SQL made by
    that role (and pg_trgm, a trusted extension, as databases have); returns its name."""
    made: list[str] = []

    def make(copy_sql: str) -> str:
        name = "afs_sec_src_" + secrets.token_hex(3)
        made.append(name)
        owner = quote_ident(name + "_owner")
        with psycopg.connect(sandbox.dsn(), autocommit=True) as conn:
            conn.execute(f"CREATE ROLE {owner} NOSUPERUSER NOLOGIN")
            conn.execute(f"CREATE DATABASE {name} OWNER {owner}")
        with psycopg.connect(sandbox.dsn(name), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_trgm")
            conn.execute(f"SET ROLE {owner}")
            sql = PLANTED_SQL.replace("{source}", f"'{name}'").replace("{copy}", copy_sql)
            conn.execute(sql.replace("{markers}", str(markers)).encode())
        return name

    try:
        yield make
    finally:
        with psycopg.connect(sandbox.dsn(), autocommit=True) as conn:
            for name in made:
                conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
                conn.execute(f"DROP ROLE IF EXISTS {quote_ident(name + '_owner')}")


def ran(markers: Path) -> list[str]:
    """The marker files left: each names the planted code that ran with superuser rights."""
    return sorted(p.name for p in markers.iterdir())


def import_traces(sandbox: SandboxServer, name: str) -> list[str]:
    """What an import named `name` left on the server: databases and its role."""
    with psycopg.connect(sandbox.dsn()) as conn:
        rows = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE %s"
                            " UNION ALL SELECT rolname FROM pg_roles WHERE rolname = %s",
                            (name + "%", import_owner(name))).fetchall()
    return sorted(r[0] for r in rows)


@pytest.mark.usefixtures("no_leaked_forks")
async def test_planted_code_runs_as_the_copys_own_role_at_import_and_at_forking(
        sandbox: SandboxServer, provider: LocalForkProvider, markers: Path,
        planted_source: Callable[[str], str]) -> None:
    source = planted_source(CAUGHT_COPY)
    copy = source.replace("src", "copy")
    report = await import_database(sandbox, sandbox.dsn(source), name=copy)
    try:
        assert ran(markers) == [], "ran as a superuser"
        role = import_owner(copy)
        with psycopg.connect(sandbox.dsn(copy)) as conn:
            # everything arrived, owned by the copy's role (an extension's own objects aside)
            assert conn.execute("SELECT count(*) FROM t").fetchone() == (50,)
            assert conn.execute("SELECT count(*) FROM mv").fetchone() == (50,)
            assert conn.execute("SELECT to_regclass('t_planted') IS NOT NULL").fetchone() == (True,)
            # analysed (by the role), the planted index's expression too
            assert conn.execute("SELECT count(*) FROM pg_stats WHERE tablename IN ('t', 't_planted')"
                                ).fetchone() == (2,)
            owners = conn.execute(
                "SELECT DISTINCT pg_get_userbyid(relowner) FROM pg_class c JOIN pg_namespace n"
                " ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND NOT EXISTS (SELECT 1"
                " FROM pg_depend d WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid"
                " AND d.deptype = 'e')").fetchall()
            assert owners == [(role,)]
            # the role owns the schema; the database is the superuser's (its owner could set
            # defaults for every session in it); the role can no longer log in
            assert conn.execute(
                "SELECT pg_get_userbyid(datdba), pg_get_userbyid(n.nspowner), r.rolsuper,"
                " r.rolcanlogin, r.rolpassword IS NULL, r.rolcreatedb, r.rolcreaterole"
                " FROM pg_database d, pg_namespace n, pg_authid r WHERE d.datname = current_database()"
                " AND n.nspname = 'public' AND r.rolname = %s", (role,)
            ).fetchone() == ("postgres", role, False, False, True, False, False)
            # the search_path the planted code tried to set for later sessions never was
            assert conn.execute("SELECT count(*) FROM pg_db_role_setting s JOIN pg_database d"
                                " ON d.oid = s.setdatabase, unnest(s.setconfig) c"
                                " WHERE d.datname = current_database() AND c LIKE 'search_path=%%'"
                                ).fetchone() == (0,)
        assert report.skipped == ()
        fork = await provider.fork(copy, ttl_seconds=120)  # the hand-over reads the catalog
        try:
            with psycopg.connect(fork.dsn) as conn:
                assert conn.execute("SELECT count(*) FROM t WHERE plant(id, 'x') > 0").fetchone() == (50,)
        finally:
            await provider.delete(fork.name)
        assert ran(markers) == []
        # the positive control: the same code, run by a superuser, leaves its marker
        with psycopg.connect(sandbox.dsn(copy)) as conn:
            conn.execute("SELECT public.act('control')")
        assert ran(markers) == ["control-build"]
    finally:
        await provider.drop_source(copy)
    assert import_traces(sandbox, copy) == []  # dropping the source drops its role


async def test_a_planted_index_that_needs_a_superuser_is_skipped_and_listed(
        sandbox: SandboxServer, provider: LocalForkProvider, markers: Path,
        planted_source: Callable[[str], str]) -> None:
    """Without the exception handler the planted statements fail. The CHECK constraint is
    dropped from the source first: with it, the rows could not arrive (next test)."""
    source = planted_source(UNCAUGHT_COPY)
    with psycopg.connect(sandbox.dsn(source), autocommit=True) as conn:
        conn.execute("ALTER TABLE t DROP CONSTRAINT t_id_check")
    copy = source.replace("src", "copy")
    report = await import_database(sandbox, sandbox.dsn(source), name=copy)
    try:
        assert ran(markers) == []
        refused = [s for s in report.skipped if "t_planted" in s or "public mv" in s]
        assert len(refused) == 2, report.skipped
        assert all("permission denied to COPY to or from an external program" in s for s in refused)
        with psycopg.connect(sandbox.dsn(copy)) as conn:
            assert conn.execute("SELECT count(*) FROM t").fetchone() == (50,)
            assert conn.execute("SELECT to_regclass('t_planted')").fetchone() == (None,)
    finally:
        await provider.drop_source(copy)


async def test_a_planted_check_that_needs_a_superuser_fails_the_import_cleanly(
        sandbox: SandboxServer, markers: Path, planted_source: Callable[[str], str]) -> None:
    source = planted_source(UNCAUGHT_COPY)
    copy = source.replace("src", "copy")
    with pytest.raises(SandboxError, match="the data of these could not be restored") as info:
        await import_database(sandbox, sandbox.dsn(source), name=copy)
    assert "TABLE DATA public t" in str(info.value)
    assert ran(markers) == []
    assert import_traces(sandbox, copy) == []  # neither the scratch database nor the role


# -- the server's environment ------------------------------------------------------------------
def test_the_sandbox_server_starts_with_none_of_afss_environment(
        own_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sentinels = {"AFS_SERVICE_TOKEN": "sentinel-token-4711", "GOOGLE_API_KEY": "sentinel-key-4711",
                 "AFS_DATABASE_URL": "postgresql://u:sentinel-pw-4711@db/x"}
    for key, value in sentinels.items():
        monkeypatch.setenv(key, value)
    server = SandboxServer(load_settings({"AFS_HOME": str(own_home)}))
    for _ in range(2):  # a first start and a restart
        server.start()
        pid = server.status().pid
        assert pid is not None
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        assert b"4711" not in environ
        names = {entry.split(b"=", 1)[0].decode() for entry in environ.split(b"\0") if entry}
        # pg_ctl adds PGDATA, PGSYSCONFDIR and PG_GRANDPARENT_PID, its shell PWD
        assert names <= {"PATH", "LANG", "LANGUAGE", "TZ", "TZDIR", "TMPDIR", "LD_LIBRARY_PATH",
                         "PGDATA", "PGSYSCONFDIR", "PG_GRANDPARENT_PID", "PWD"} | {
                             n for n in names if n.startswith("LC_")}, names
        with psycopg.connect(server.dsn()) as conn:  # what SQL can read of it
            read = conn.execute("SELECT pg_read_binary_file('/proc/self/environ')").fetchone()
        assert read is not None and b"4711" not in read[0] and b"AFS_" not in read[0]
        server.stop()


# -- no password on a command line --------------------------------------------------------------
def test_child_commands_carry_no_password_and_the_environment_does() -> None:
    for dsn in ("postgresql://alice:s3cr%2Ft-pw@db.example:6543/shop?sslmode=require",
                "host=db.example port=6543 dbname=shop user=alice password='s3cr/t-pw'"):
        argv, env = dump_command(dsn, Path("/x/source.dump"), schema_only=False)
        assert not any("s3cr" in arg for arg in argv), argv
        assert env["PGPASSWORD"] == "s3cr/t-pw"
        [dbname] = [a.removeprefix("--dbname=") for a in argv if a.startswith("--dbname=")]
        params = psycopg.conninfo.conninfo_to_dict(dbname)
        assert params == {"host": "db.example", "port": "6543", "dbname": "shop", "user": "alice",
                          **({"sslmode": "require"} if "sslmode" in dsn else {})}
    settings = load_settings({"AFS_HOME": "/tmp/afs-x"})
    argv, env = restore_command(Path("/x/source.dump"),
                                dsn_for(settings, "copy", user="afs_import_copy", password="pw-123"))
    assert not any("pw-123" in arg for arg in argv) and env["PGPASSWORD"] == "pw-123"


def test_a_running_pg_dump_shows_no_password_in_its_command_line(tmp_path: Path) -> None:
    """A real pg_dump, held at its connection by a listener that never answers: its
    /proc/<pid>/cmdline (what `ps` shows every local user) is read while it waits."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    failed: list[BaseException] = []

    def run() -> None:
        try:
            dump(f"postgresql://alice:hunter2-pw@127.0.0.1:{port}/shop", tmp_path / "x.dump")
        except SandboxError as exc:
            failed.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        children: list[psutil.Process] = []
        while not children and time.monotonic() < deadline:
            children = [c for c in psutil.Process().children(recursive=True) if c.name() == "pg_dump"]
            time.sleep(0.05)
        assert children, "pg_dump did not start"
        cmdline = Path(f"/proc/{children[0].pid}/cmdline").read_bytes()
        environ = Path(f"/proc/{children[0].pid}/environ").read_bytes()
        assert b"--dbname=" in cmdline and b"hunter2" not in cmdline
        assert b"PGPASSWORD=hunter2-pw" in environ.split(b"\0")
        assert oct(Path(f"/proc/{children[0].pid}/environ").stat().st_mode & 0o777) == "0o400"
    finally:
        listener.close()  # pg_dump's connection is refused: it exits
        thread.join(30)
    assert failed and "pg_dump failed" in str(failed[0]) and "hunter2" not in str(failed[0])
    assert os.environ.get("PGPASSWORD") != "hunter2-pw"


# -- extensions only a superuser may create ----------------------------------------------------
async def test_an_untrusted_extension_the_sandbox_knows_is_made_for_the_copy(
        sandbox: SandboxServer, provider: LocalForkProvider) -> None:
    """pgvector is not trusted (its columns would be lost to a role that may not create it):
    the sandbox makes it in the empty copy, in the dump's schema; what else the dump says
    about it is left out, so nothing is listed as skipped."""
    source, copy = "afs_sec_vsrc_" + secrets.token_hex(3), "afs_sec_vcopy_" + secrets.token_hex(3)
    with psycopg.connect(sandbox.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {source}")
    try:
        with psycopg.connect(sandbox.dsn(source), autocommit=True) as conn:
            conn.execute("CREATE SCHEMA extensions; CREATE EXTENSION vector WITH SCHEMA extensions;"
                         "CREATE EXTENSION pg_trgm; CREATE TABLE items (id int, v extensions.vector(3));"
                         "INSERT INTO items VALUES (1, '[1,2,3]'), (2, '[0,0,1]');"
                         "CREATE INDEX items_name ON items USING gin ((id::text) gin_trgm_ops)")
        report = await import_database(sandbox, sandbox.dsn(source), name=copy)
        try:
            assert report.skipped == ()
            with psycopg.connect(sandbox.dsn(copy)) as conn:
                assert conn.execute("SELECT count(*) FROM items").fetchone() == (2,)
                assert conn.execute(
                    "SELECT e.extname, n.nspname, pg_get_userbyid(n.nspowner) FROM pg_extension e"
                    " JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname <> 'plpgsql'"
                    " ORDER BY 1").fetchall() == [("pg_trgm", "public", import_owner(copy)),
                                                  ("vector", "extensions", import_owner(copy))]
        finally:
            await provider.drop_source(copy)
    finally:
        with psycopg.connect(sandbox.dsn(), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {source} WITH (FORCE)")


def test_the_copys_role_has_a_name_postgresql_keeps_whole() -> None:
    assert import_owner("shop") == "afs_import_shop"
    long_a, long_b = "a" * 60 + "x", "a" * 60 + "y"  # the same first 63 bytes with the prefix
    assert len(import_owner(long_a)) <= 63 and len(import_owner(long_b)) <= 63
    assert import_owner(long_a) != import_owner(long_b)
