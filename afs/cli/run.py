"""Running the command the command line chose: the settings, the logs, then its handler under
trio, where Ctrl-C cancels it (so that shielded cleanup runs) instead of killing it.
Imported once the command line is parsed, never by `afs --help`.
"""

from __future__ import annotations

import argparse
import signal
from collections.abc import Awaitable, Callable

import trio

from afs import log as afs_log
from afs.config import Settings, load_settings

Handler = Callable[[argparse.Namespace, Settings], Awaitable[int]]


def run_command(args: argparse.Namespace) -> int:
    """The command `args` chose, with the settings and the logs, under trio (`afs mcp serve`
    runs its own event loop)."""
    settings = load_settings()
    # a long-running command shows its warnings on a terminal too (afs.log)
    afs_log.configure(settings.log_dir, verbose=args.verbose,
                      keep_warnings=args.command in ("serve", "worker", "mcp"))
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
