"""What the command modules share: the sandbox a command may need (and what to say when it
stops under it), the task store, the target database from the flags, a finished task's report.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio
from psycopg import conninfo

from afs.cli.output import EXIT_FAILED, EXIT_OK, SANDBOX_KEEPS_RUNNING, emit, progress, say
from afs.config import Settings
from afs.db import connect_sync
from afs.errors import AfsError, DatabaseError, ForkError, InputError, SandboxError, scrub, single_leaf
from afs.sandbox.server import SandboxServer
from afs.store import open_store, store_url


def print_finished(args: argparse.Namespace, task_id: str, result: Any, error: str | None,
                   bad_input: bool = False) -> int:
    """A finished task's report (afs.report), or why it failed; its exit code."""
    from afs import report  # the SQL parsers: only once a task has finished (not for history)

    if result is None:
        if bad_input:
            raise InputError(error or "bad input")
        emit(args, {"task_id": task_id, "status": "failed", "error": error},
             f"AFS task {task_id}: failed: {error}")
        return EXIT_FAILED
    if args.json:
        print(json.dumps(report.to_json(result), default=str))
    else:
        print(report.render_text(result))
    return EXIT_FAILED if result.status == "failed" else EXIT_OK


# -- the sandbox under a command --------------------------------------------------
SANDBOX_STOPPED = "the sandbox stopped during the task; start it with `afs sandbox up` and run again"


async def sandbox_answers(settings: Settings) -> bool:
    """Whether the sandbox server runs and takes connections (not stopped, not stopping)."""
    def probe() -> bool:
        server = SandboxServer(settings)
        if not server.status().running:
            return False
        try:
            connect_sync(server.dsn()).close()
        except AfsError:
            return False
        return True

    return await trio.to_thread.run_sync(probe)


@asynccontextmanager
async def sandbox_stop_reported(settings: Settings, used: bool = True,
                                message: str = SANDBOX_STOPPED) -> AsyncIterator[None]:
    """Work that needs the sandbox (`used`): when it fails because the sandbox stopped meanwhile
    (`afs sandbox down`, a crash), SandboxError says so and what to do (`message`), instead of
    the message of the first connection that was lost ("the connection is closed [in: SELECT …]")."""
    try:
        yield
    except Exception as exc:
        leaf = single_leaf(exc)
        if not used or not isinstance(leaf, (DatabaseError, ForkError)) or await sandbox_answers(settings):
            raise
        raise SandboxError(message) from exc


async def start_sandbox(server: SandboxServer, what: str = "starting the sandbox") -> bool:
    """Start the sandbox unless it runs; when this started it, say that it keeps running and how
    to stop it (a command that starts a server says so). Returns whether it started it."""
    progress(what)
    started: bool = await trio.to_thread.run_sync(server.start)
    if started:
        say(SANDBOX_KEEPS_RUNNING)
    return started


# -- the task store and the target -----------------------------------------------------
@asynccontextmanager
async def open_task_store(settings: Settings) -> AsyncIterator[Any]:
    """The task store: AFS_STORE_URL, else the sandbox (started if it is not running)."""
    if settings.store_url is None:  # started only if stopped, and then said so
        await start_sandbox(SandboxServer(settings), "starting the sandbox (it holds the task store)")
    async with open_store(store_url(settings)) as store:
        yield store


def add_libpq_flags(parser: argparse.ArgumentParser) -> None:
    """psql's -d/-p/-U (and --host: -h is --help here) for the target, over --dsn or the
    configured target."""
    parser.add_argument("-d", "--dbname", metavar="NAME", help="the target's database, as psql -d")
    parser.add_argument("--host", metavar="HOST", help="the target's host or socket directory, as psql -h")
    parser.add_argument("-p", "--port", metavar="PORT", help="the target's port, as psql -p")
    parser.add_argument("-U", "--username", metavar="USER", help="the target's user, as psql -U")


def target_from_flags(args: argparse.Namespace, settings: Settings) -> str | None:
    """--dsn (else the configured target), with psql's flags written over it; None: nothing given."""
    dsn = args.dsn if args.dsn is not None else settings.target_dsn
    given = {key: value for key, value in (("dbname", args.dbname), ("host", args.host),
                                           ("port", args.port), ("user", args.username)) if value}
    if not given:
        return dsn
    try:
        return conninfo.make_conninfo(dsn or "", **given)
    except Exception as exc:  # psycopg.ProgrammingError: a DSN that does not parse
        raise InputError(f"the target does not parse: {scrub(str(exc))}") from None

