"""Secrets stay secret (issue 23, items 7-9): passwords scrubbed in every form libpq accepts,
never on a child's command line, the fork server over HTTP guarded by a token always.

The scrubbing tests are property-style: many passwords full of the characters that end a
value somewhere (spaces, quotes, backslashes, `@ / : % & = ? #`), each written in every form
libpq reads, checked against libpq's own parser (psycopg.conninfo) before and after.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import secrets
import signal
import stat
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import httpx
import psycopg
import pytest
import trio
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from afs.cli.forks import psql_invocation
from afs.config import load_settings
from afs.errors import MASK, AfsError, ConfigError, DatabaseError, scrub
from afs.forks.client import open_fork_client
from afs.forks.provider import LocalForkProvider
from afs.forks.token import ensure_token, read_token
from afs.sandbox.server import SandboxServer
from afs.testing import Child, run_afs

SPECIAL = ["", " ", "'", "\\", "\\'", "@", "/", ":", "%", "%40", "&", "=", "?", "#", " x=y ", "é",
           "'; host=evil", "\"", "\t"]


def passwords() -> list[tuple[str, str, str]]:
    """(password, its first distinctive part, its last): both parts must vanish."""
    found = []
    for special in SPECIAL:
        head, tail = "H" + secrets.token_hex(5), "T" + secrets.token_hex(5)
        found.append((f"{head}{special}{tail}", head, tail))
    return found


SPECIAL_IDS = [f"special-{n}" for n in range(len(SPECIAL))]  # the same in every pytest worker


def _unquoted(value: str) -> str:
    """libpq's unquoted value: a backslash escapes the next character (white space, quotes)."""
    return "".join("\\" + c if c in " \t\\'" else c for c in value)


def _quoted(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def forms(password: str, key: str = "password") -> list[str]:
    """One password written every way libpq accepts it."""
    encoded = quote(password, safe="")
    found = [
        f"host=db.example port=5433 user=app {key}={_unquoted(password)} dbname=shop",
        f"host=db.example user=app {key} = {_quoted(password)} dbname=shop",
        f"{key}={_quoted(password)}",
        make_conninfo("", host="db.example", user="app", dbname="shop", **{key: password}),
        f"postgresql://app@db.example:5433/shop?{key}={encoded}",
        f"postgres://db.example/shop?sslmode=prefer&{quote(key, safe='').replace('o', '%6F')}={encoded}",
    ]
    if key == "password":
        found += [f"postgresql://app:{encoded}@db.example:5433/shop",
                  f"postgres://app:{encoded}@db.example/shop?sslmode=prefer",
                  f"postgresql://app:{encoded}@[::1]:5433,db2.example/shop?target_session_attrs=any"]
    return found


CASES = [(form, head, tail, key)
         for (password, head, tail), key in itertools.product(passwords(), ("password", "sslpassword",
                                                                             "oauth_client_secret"))
         for form in forms(password, key)]


# the ids are the cases' places, not their random passwords: every pytest worker collects the same tests
@pytest.mark.parametrize(("dsn", "head", "tail", "key"), CASES,
                         ids=[f"{c[3]}-{n}" for n, c in enumerate(CASES)])
def test_scrub_leaves_no_password_in_any_form_libpq_reads(dsn: str, head: str, tail: str, key: str) -> None:
    parsed = conninfo_to_dict(dsn)
    assert head in str(parsed[key]) and tail in str(parsed[key])  # the form is what libpq reads
    shown = scrub(dsn)
    assert head not in shown and tail not in shown, shown
    # the driver reads the scrubbed text as the same connection string, the secret masked
    assert conninfo_to_dict(shown) == {**parsed, key: MASK}
    # in free text (an error message quoting it), in quotes, and through AfsError
    for text in (f"connection to {dsn} failed: FATAL: no", f"bad DSN '{dsn}' (see --help)",
                 json.dumps({"dsn": dsn, key: parsed[key]}), repr({key: parsed[key], "dsn": dsn}),
                 f"{dsn}\n{dsn}"):
        for out in (scrub(text), str(AfsError(text))):
            assert head not in out and tail not in out, out


@pytest.mark.parametrize(("password", "head", "tail"), passwords(), ids=SPECIAL_IDS)
def test_scrub_hides_passwords_in_uris_of_any_scheme_spelling(password: str, head: str, tail: str) -> None:
    encoded = quote(password, safe="")
    for scheme in ("postgresql", "postgres", "POSTGRESQL", "PostgreS", "pgsql", "jdbc:postgresql"):
        for text in (f"{scheme}://app:{encoded}@db/shop", f"at {scheme}://app:{encoded}@db:1/shop failed",
                     f"{scheme}://app:{password}@db/shop"):
            shown = scrub(text)
            assert tail not in shown and encoded not in shown, shown


def test_libpq_complaints_about_a_dsn_do_not_quote_its_password() -> None:
    """libpq's parser errors quote what it could not read: the userinfo, or the whole URI."""
    secret = "Sx" + secrets.token_hex(6)
    for bad in (f"postgresql://app:{secret} pw@db/shop", f"POSTGRESQL://app:{secret}@db/shop",
                f"host=db password='{secret}", f"postgresql://db/shop?password={secret}%zz",
                f"postgresql://app:{secret}@db/shop?nonsense=1", f"host=db {secret}"):
        with pytest.raises(psycopg.ProgrammingError) as caught:
            conninfo_to_dict(bad)
        assert secret not in scrub(str(caught.value)), str(caught.value)
        assert secret not in str(DatabaseError(str(caught.value)))


def test_scrub_keeps_what_holds_no_password() -> None:
    for text in ("postgresql://app@db:5433/shop?sslmode=require", "host=/tmp/afs port=5432 dbname=x",
                 'password authentication failed for user "bob"', "refused SQL (writes): DELETE FROM t",
                 "", "postgresql://bob:***@host/db"):
        assert scrub(text) == text
    assert scrub("postgresql://bob:hunter2@host/db") == "postgresql://bob:***@host/db"  # a URI stays one


# -- passwords never on a command line --------------------------------------------------------
def afs_cli(home: Path | None, *args: str | bytes, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return run_afs(*args, home=home, child=Child(stdin=stdin, timeout_s=120))


@pytest.mark.parametrize(("password", "head", "tail"), passwords(), ids=SPECIAL_IDS)
def test_psql_is_given_the_password_in_its_environment(password: str, head: str, tail: str) -> None:
    for dsn in forms(password):
        argv, env = psql_invocation("/usr/bin/psql", dsn, {"PATH": "/usr/bin"})
        assert head not in " ".join(argv) and tail not in " ".join(argv)
        assert env == {"PATH": "/usr/bin", "PGPASSWORD": password}
        wanted = conninfo_to_dict(dsn)
        del wanted["password"]
        assert conninfo_to_dict(argv[1]) == wanted


@pytest.mark.usefixtures("no_leaked_forks")
async def test_afs_fork_psql_logs_in_with_no_password_on_its_command_line(
        provider: LocalForkProvider) -> None:
    fork = await provider.fork("afs_demo", ttl_seconds=120)
    try:
        password = str(conninfo_to_dict(fork.dsn)["password"])
        # psql runs the shell: its parent ($PPID) is psql itself, whose command line it prints
        script = b"\\! tr '\\0' ' ' < /proc/$PPID/cmdline; echo\nSELECT 'as ' || current_user;\n"
        result = await trio.to_thread.run_sync(lambda: afs_cli(None, "fork", "psql", fork.name, stdin=script))
        out = result.stdout.decode()
        assert result.returncode == 0, result.stderr.decode()
        assert "psql" in out and f"dbname={fork.name}" in out  # its command line, printed
        assert f"as {fork.name}" in out  # logged in, as the fork's role
        assert password not in out
    finally:
        await provider.delete(fork.name)


# -- the command line takes text -------------------------------------------------------------
@pytest.mark.parametrize(("argv", "option"), [
    ([b"optimize", b"--query", b"SELECT \xff"], "--query"),
    ([b"optimize", b"--query", b"SELECT '\xed\xa0\x80'"], "--query"),  # a surrogate, UTF-8-encoded
    ([b"history", b"--status", b"\xff"], "--status"),
    ([b"fork", b"destroy", b"afs-fork-\xc3"], "name"),
    ([b"sandbox", b"import", b"--from", b"host=x dbname=\xff"], "--from"),
])
def test_an_argument_that_is_not_utf8_is_refused_with_exit_2(tmp_path: Path, argv: list[bytes],
                                                              option: str) -> None:
    result = afs_cli(tmp_path, *argv)
    stderr = result.stderr.decode(errors="replace")
    assert result.returncode == 2, stderr
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1].startswith(f"afs: error: {option} is not valid UTF-8"), stderr
    assert not (tmp_path / "sandbox").exists()  # refused before anything started


# -- the fork server over HTTP: a token always -------------------------------------------------
def test_a_token_is_made_once_private_to_its_user(tmp_path: Path) -> None:
    path = tmp_path / "home" / "fork-server.token"
    old = os.umask(0)  # even a umask that lets everyone read new files
    try:
        token = ensure_token(path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(token) >= 40 and ensure_token(path) == token == read_token(path)
    assert os.listdir(path.parent) == [path.name]  # no draft left behind
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="other users may read it"):
        read_token(path)
    assert read_token(tmp_path / "none") is None


async def _start_fork_server(sandbox: SandboxServer, home: Path) -> tuple[trio.Process, str]:
    """`afs mcp serve --http 127.0.0.1:0` with no token configured, its admin DSN from the
    environment (AFS_ADMIN_DSN, not --admin-dsn); its process and URL."""
    env = {k: v for k, v in os.environ.items() if k != "AFS_FORK_SERVER_TOKEN"}
    env.update(AFS_HOME=str(home), AFS_FORK_SPARES="0", AFS_ADMIN_DSN=sandbox.dsn())
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "afs", "mcp", "serve", "--http", "127.0.0.1:0"], stderr=subprocess.PIPE,
        env=env)
    assert process.stderr is not None
    said = b""
    with trio.fail_after(60):
        while (found := re.search(rb"http://127\.0\.0\.1:\d+/mcp", said)) is None:
            chunk = await process.stderr.receive_some()
            assert chunk, said.decode()
            said += chunk
    return process, found.group().decode()


async def _stop(process: trio.Process) -> None:
    if process.returncode is None:
        process.send_signal(signal.SIGINT)
        with trio.move_on_after(15):
            await process.wait()
    if process.returncode is None:
        process.kill()
        await process.wait()


@pytest.mark.usefixtures("no_leaked_forks")
async def test_the_fork_server_over_http_wants_its_token_on_loopback_too(
        sandbox: SandboxServer, tmp_path: Path) -> None:
    home = tmp_path / "server"
    process, url = await _start_fork_server(sandbox, home)
    try:
        cmdline = await trio.Path(f"/proc/{process.pid}/cmdline").read_text()
        assert sandbox.dsn() not in cmdline and "mcp" in cmdline
        hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "a local process", "version": "1"}}}
        async with httpx.AsyncClient(timeout=10) as http:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic eDp5"}):
                response = await http.post(url, json=hello, headers={
                    "Accept": "application/json, text/event-stream", **headers})
                assert response.status_code == 401, (headers, response.text)
        token_file = load_settings({"AFS_HOME": str(home)}).fork_server_token_file
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        # AFS's own client on this machine reads the token from AFS_HOME
        client_settings = load_settings({"AFS_HOME": str(home), "AFS_FORK_SERVER_URL": url})
        async with open_fork_client(client_settings) as client:
            assert "afs_demo" in {s["name"] for s in (await client.list_services())["sources"]}
            async with client.open_fork("afs_demo") as fork:
                assert fork.name in {f["name"] for f in (await client.list_services())["forks"]}
        # one without it is told what to set, before it connects
        with pytest.raises(ConfigError, match="AFS_FORK_SERVER_TOKEN"):
            async with open_fork_client(load_settings({"AFS_HOME": str(tmp_path / "elsewhere"),
                                                       "AFS_FORK_SERVER_URL": url})):
                pass
    finally:
        await _stop(process)
