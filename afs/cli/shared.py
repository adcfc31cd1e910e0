"""What the command modules share: running a command (settings, logs, trio, Ctrl-C), the
sandbox a command may need (and what to say when it stops under it), the task store, the
target database from the flags, a finished task's report.

Imported once the command line is parsed, never by `afs --help`.
"""

from __future__ import annotations

import argparse
import json
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio
from psycopg import conninfo

from afs import log as afs_log
from afs import report
from afs.cli.output import EXIT_FAILED, EXIT_OK, emit
from afs.config import Settings, load_settings
from afs.db import connect_sync
from afs.errors import AfsError, DatabaseError, ForkError, InputError, SandboxError, scrub, single_leaf
from afs.sandbox.server import SandboxServer
from afs.store import open_store, store_url

Handler = Callable[[argparse.Namespace, Settings], Awaitable[int]]


# -- running a command -----------------------------------------------------------------
def run_command(args: argparse.Namespace) -> int:
    """The command `args` chose, with the settings and the logs, under trio (`afs mcp serve`
    runs its own event loop)."""
    settings = load_settings()
    afs_log.configure(settings.log_dir, verbose=args.verbose)
    if args.command == "mcp":
        exit_code: int = args.handler(args, settings)
    else:
        exit_code = trio.run(run_interruptible, args.handler, args, settings)
    return exit_code


async def run_interruptible(handler: Handler, args: argparse.Namespace, settings: Settings) -> int:
    """Run a command; Ctrl-C cancels it (so shielded cleanup runs) instead of killing it."""
    result: list[int] = []
    interrupted = False

    async def watch(cancel_scope: trio.CancelScope) -> None:
        nonlocal interrupted
        with trio.open_signal_receiver(signal.SIGINT) as signals:
            async for _ in signals:
                interrupted = True
                cancel_scope.cancel()
                return

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch, nursery.cancel_scope)
        result.append(await handler(args, settings))
        nursery.cancel_scope.cancel()
    if interrupted or not result:
        raise KeyboardInterrupt
    return result[0]


def print_finished(args: argparse.Namespace, task_id: str, result: Any, error: str | None,
                   bad_input: bool = False) -> int:
    """A finished task's report (afs.report), or why it failed; its exit code."""
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


# -- the task store and the target -----------------------------------------------------
@asynccontextmanager
async def open_task_store(settings: Settings) -> AsyncIterator[Any]:
    """The task store: AFS_STORE_URL, else the sandbox (started if it is not running)."""
    if settings.store_url is None:
        await trio.to_thread.run_sync(SandboxServer(settings).start)
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

