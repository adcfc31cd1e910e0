"""What every benchmark script here shares: the sandbox around the work, Ctrl-C, and a
settled start.

    measured = await with_sandbox(settings, lambda server: measure(...), say)
    if measured is None: ...  # interrupted; everything was cleaned up
    await settle(admin)       # before each timed step: no step pays for the writes of the last

The sandbox is started if needed and stopped at the end only if the script
started it. Ctrl-C (or SIGTERM) becomes a cancellation, so the shielded cleanup
of forks and scratch databases runs as usual.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio

from afs import log as afs_log
from afs.config import Settings, load_settings
from afs.db import Connection
from afs.errors import AfsError
from afs.sandbox.server import SandboxServer

T = TypeVar("T")


async def cancel_on_signal(scope: trio.CancelScope, say: Callable[[str], None],
                           task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Turn the first Ctrl-C (or SIGTERM) into a cancellation of `scope`."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        task_status.started()
        async for _ in signals:
            say("interrupted; cleaning up")
            scope.cancel()
            return


async def with_sandbox(settings: Settings, work: Callable[[SandboxServer], Awaitable[T]],
                       say: Callable[[str], None]) -> T | None:
    """Run `work` with the sandbox up; None when interrupted. AfsErrors pass through."""
    server = SandboxServer(settings)
    scope = trio.CancelScope()
    result: list[T] = []
    error: AfsError | None = None
    async with trio.open_nursery() as nursery:
        await nursery.start(cancel_on_signal, scope, say)
        started = False
        try:
            with scope:
                say(f"starting the sandbox in {settings.home}")
                started = await trio.to_thread.run_sync(server.start)
                result.append(await work(server))
        except AfsError as exc:  # caught here, or the nursery would wrap it in a group
            error = exc
        finally:
            if started:
                say("stopping the sandbox (this script started it)")
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(server.stop)
            nursery.cancel_scope.cancel()
    if scope.cancel_called:  # Ctrl-C also reaches the fork server: its errors are ours
        return None
    if error is not None:
        raise error
    return result[0]


async def settle(admin: Connection) -> None:
    """A checkpoint and a sync (not timed, before a timed step): the writes of the step
    before (index builds, forks made and dropped) are on disk, not in the next one's time."""
    await admin.execute("CHECKPOINT")
    await trio.to_thread.run_sync(os.sync)


EXIT_INTERRUPTED = 130


def main(tag: str, args: argparse.Namespace,
         run: Callable[[argparse.Namespace, Settings], Awaitable[int]]) -> int:
    """A script's entry point: settings, logging to stderr, its exit code; errors in one line."""
    try:
        settings = load_settings()
        afs_log.configure(settings.log_dir)  # structlog to stderr and the log file, not stdout
        exit_code: int = trio.run(run, args, settings)
        return exit_code
    except AfsError as exc:
        print(f"{tag}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"{tag}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
