"""The peer column of quality.py: postgres-mcp's index tuning, asked about each case.

postgres-mcp (from PyPI) recommends indexes with HypoPG's hypothetical indexes, so it runs
against Debian's PostgreSQL with its HypoPG package, in a private cluster of its own:

    setup      benchmarks/peer_setup.sh: as root, `apt-get update` once and Debian's
               postgresql-NN + postgresql-NN-hypopg; postgres-mcp in a virtualenv of its own
               (Python >= 3.12; never in AFS's environment). Its last line says "ok VENV BINDIR"
               or "cannot run: <reason>".
    cluster    initdb in a temporary directory, started with `pg_ctl start` on a unix socket of
               its own (no TCP), stopped by `pg_ctl stop` at the end, also on failure and Ctrl-C
               (as root, the server runs as Debian's `postgres` user, which initdb requires)
    per case   the case is loaded there as in the sandbox (schema, data, VACUUM ANALYZE), with
               `CREATE EXTENSION hypopg`; benchmarks/peer_postgres_mcp.py, run by the peer's
               Python, asks `analyze_query_indexes`' advisor for its advice on the query; the
               database is dropped. quality.py then applies the advised indexes in the same fork
               of the AFS sandbox where baseline, AFS's winner and the oracle are measured.

Anything that keeps the peer from running (no root for apt, no Python 3.12, a case that does
not load on the older server, the advisor's own error) becomes "cannot run: <reason>" for the
run or for that case: the quality run itself never fails because of the peer.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from afs.db import open_connection
from afs.errors import AfsError

HERE = Path(__file__).resolve().parent
SETUP = HERE / "peer_setup.sh"
ADVISOR = HERE / "peer_postgres_mcp.py"
SETUP_TIMEOUT_S = 1200  # apt-get and pip, once per machine
START_TIMEOUT_S = 120
ADVICE_TIMEOUT_S = 300  # the advisor's own budget is 30 s of search; the what-if EXPLAINs come on top
LOAD_TIMEOUT_MS = 1_800_000
PORT = 5432  # on a unix socket in a private directory: no clash with any other server
SYSTEM_USER = "postgres"  # Debian's server user (initdb refuses to run as root)
NAME = "postgres-mcp"


@dataclass(frozen=True)
class Advice:
    """The peer's answer for one case: its DDL (None: it could not run), and what to show."""

    ddl: tuple[str, ...] | None
    note: str

    @property
    def ran(self) -> bool:
        return self.ddl is not None


def cannot(reason: str) -> Advice:
    return Advice(None, "cannot run: " + reason)


def _as_root() -> bool:
    return os.geteuid() == 0


def _server_user() -> dict[str, Any]:
    """subprocess options that run the server's tools as Debian's postgres user, when root."""
    if not _as_root():
        return {}
    import pwd

    entry = pwd.getpwnam(SYSTEM_USER)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


async def _run(args: Sequence[str], timeout_s: float, **options: Any) -> tuple[int, str]:
    """Run a command; (exit code, its output: stdout, then the last lines of stderr)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env.setdefault("LC_ALL", "C.UTF-8")
    with trio.fail_after(timeout_s):
        done = await trio.run_process(list(args), check=False, capture_stdout=True, capture_stderr=True,
                                      env=env, **options)
    err = done.stderr.decode(errors="replace").strip().splitlines()
    return done.returncode, done.stdout.decode(errors="replace") + "\n".join(err[-3:])


class Peer:
    """The peer for one quality run: `status` ("ok" or "cannot run: …") and `advise`."""

    def __init__(self, status: str, venv: Path | None = None, bindir: Path | None = None) -> None:
        self.status = status
        self.venv, self.bindir = venv, bindir
        self.workdir: Path | None = None

    @property
    def ready(self) -> bool:
        return self.workdir is not None

    @property
    def socket_dir(self) -> Path:
        assert self.workdir is not None
        return self.workdir / "run"

    def dsn(self, database: str) -> str:
        return f"postgresql://{SYSTEM_USER}@/{database}?host={self.socket_dir}&port={PORT}"

    # -- the cluster --------------------------------------------------------------------------
    async def start(self) -> None:
        assert self.bindir is not None
        self.workdir = Path(tempfile.mkdtemp(prefix="afs-peer-"))
        data, run = self.workdir / "data", self.workdir / "run"
        run.mkdir()
        if _as_root():
            import pwd

            entry = pwd.getpwnam(SYSTEM_USER)
            self.workdir.chmod(0o755)
            for path in (self.workdir, run):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        code, out = await _run([str(self.bindir / "initdb"), "-D", str(data), "-U", SYSTEM_USER,
                                "--auth=trust", "--encoding=UTF8", "--locale=C.UTF-8"],
                               START_TIMEOUT_S, **_server_user())
        if code != 0:
            raise AfsError(f"initdb failed: {out.strip()[-300:]}")
        options = (f"-p {PORT} -k {run} -c listen_addresses='' -c fsync=off"
                   " -c max_wal_size=4GB")
        code, out = await _run([str(self.bindir / "pg_ctl"), "start", "-w", "-D", str(data), "-l",
                                str(self.workdir / "postgres.log"), "-o", options],
                               START_TIMEOUT_S, **_server_user())
        if code != 0:
            raise AfsError(f"pg_ctl start failed: {out.strip()[-300:]}")

    async def stop(self) -> None:
        if self.workdir is None or self.bindir is None:
            return
        with trio.CancelScope(shield=True):
            data = self.workdir / "data"
            if (data / "postmaster.pid").exists():
                await _run([str(self.bindir / "pg_ctl"), "stop", "-w", "-m", "fast", "-D", str(data)],
                           START_TIMEOUT_S, **_server_user())
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    # -- one case ----------------------------------------------------------------------------
    async def advise(self, name: str, statements: Sequence[str], query: str) -> Advice:
        """Load the case into a database of the peer's cluster and ask postgres-mcp for indexes."""
        if not self.ready:
            return Advice(None, self.status)
        database = "peer_" + name
        admin = self.dsn("postgres")
        try:
            async with open_connection(admin, LOAD_TIMEOUT_MS) as conn:
                await conn.execute(f'DROP DATABASE IF EXISTS "{database}"')
                await conn.execute(f'CREATE DATABASE "{database}"')
            try:
                async with open_connection(self.dsn(database), LOAD_TIMEOUT_MS) as conn:
                    for statement in statements:
                        await conn.execute(statement)
                    await conn.execute("CREATE EXTENSION IF NOT EXISTS hypopg")
                return await self._ask(database, query)
            finally:
                with trio.CancelScope(shield=True):
                    async with open_connection(admin, LOAD_TIMEOUT_MS) as conn:
                        await conn.execute(f'DROP DATABASE IF EXISTS "{database}"')
        except AfsError as exc:
            return cannot(f"the case does not load on the peer's server: {str(exc).splitlines()[0][:160]}")

    async def _ask(self, database: str, query: str) -> Advice:
        assert self.venv is not None
        args = [str(self.venv / "bin" / "python"), str(ADVISOR), self.dsn(database), query]
        for attempt in range(2):
            try:
                code, out = await _run(args, ADVICE_TIMEOUT_S)
            except trio.TooSlowError:
                return cannot(f"{NAME} gave no advice within {ADVICE_TIMEOUT_S} s")
            answer = _last_json(out)
            if answer is None:
                return cannot(f"{NAME} failed (exit {code}): {out.strip()[-200:]}")
            error = answer.get("error")
            if error and "analyze" in str(error).lower() and attempt == 0:
                await trio.sleep(2)  # the cumulative statistics reach pg_stat_user_tables late
                continue
            if error:
                return cannot(f"{NAME}: {str(error).splitlines()[0][:160]}")
            indexes = tuple(str(s) for s in answer.get("indexes") or ())
            return Advice(indexes, f"{len(indexes)} index(es)" if indexes else "no index advised")
        return cannot(f"{NAME}: no answer")


def _last_json(text: str) -> dict[str, Any] | None:
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                return None
            return value if isinstance(value, dict) else None
    return None


def default_venv() -> Path:
    return Path(os.environ.get("AFS_PEER_VENV") or Path.home() / ".cache" / "afs-peer" / "venv")


async def setup(say: Any) -> Peer:
    """Run peer_setup.sh: a ready-to-start Peer, or one whose status says why it cannot run."""
    if shutil.which("bash") is None:
        return Peer("cannot run: no bash for benchmarks/peer_setup.sh")
    say(f"peer: setting up {NAME} (benchmarks/peer_setup.sh; apt-get and pip the first time)")
    try:
        code, out = await _run(["bash", str(SETUP), str(default_venv())], SETUP_TIMEOUT_S)
    except trio.TooSlowError:
        return Peer(f"cannot run: peer_setup.sh took over {SETUP_TIMEOUT_S} s")
    except OSError as exc:
        return Peer(f"cannot run: {exc}")
    lines = [line for line in out.splitlines() if line.startswith(("ok ", "cannot run:"))]
    if not lines:
        return Peer(f"cannot run: peer_setup.sh exited {code}: {out.strip()[-200:]}")
    last = lines[-1]
    if not last.startswith("ok "):
        return Peer(last)
    _, venv, bindir = last.split(" ", 2)
    return Peer("ok", Path(venv), Path(bindir))


@asynccontextmanager
async def peer_session(enabled: bool, say: Any) -> AsyncIterator[Peer]:
    """The peer for a quality run: set up and started, stopped at the end (by pg_ctl stop)."""
    if not enabled:
        yield Peer("cannot run: not asked for (--no-peer)")
        return
    peer = await setup(say)
    if peer.status == "ok":
        try:
            await peer.start()
            say(f"peer: {NAME} ready, Debian's PostgreSQL in {peer.workdir}")
        except (AfsError, OSError, trio.TooSlowError) as exc:
            peer.status = f"cannot run: its PostgreSQL did not start: {str(exc)[:200]}"
            await peer.stop()
    try:
        yield peer
    finally:
        await peer.stop()


if __name__ == "__main__":  # a smoke test: `python benchmarks/peer.py`
    async def _smoke() -> None:
        async with peer_session(True, lambda m: print(m, file=sys.stderr)) as peer:
            print(peer.status)
            print(await peer.advise("smoke", (
                "CREATE TABLE t (id integer PRIMARY KEY, a integer NOT NULL, b text)",
                "INSERT INTO t SELECT i, i % 1000, 'x' || i FROM generate_series(1, 200000) i",
                "VACUUM ANALYZE t"), "SELECT * FROM t WHERE a = 7"))

    trio.run(_smoke)
