"""What a command prints, and how it ends: results on stdout (one JSON document with `--json`),
progress on stderr, an error as a message and an exit code.

    emit(args, data, text)        the result: JSON for scripts, text for people
    progress(message)             one line of progress on stderr (redrawn in place on a terminal)
    failed(args, message, code)   an error: why on stderr; with --json also {error, code, kind} on stdout
    reader_left()                 the reader of stdout went away (`afs show T | head`): quietly, like cat

Exit codes: 0 success, 1 failure, 2 bad input or usage, 130 interrupted (AfsError.exit_code).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def emit(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(data, default=str) if getattr(args, "json", False) else text)


def progress(message: str) -> None:
    if sys.stderr.isatty():
        print(f"\r\033[K{message}", end="", file=sys.stderr, flush=True)
    else:
        print(message, file=sys.stderr, flush=True)


# said once by a command that had to start the sandbox (afs.cli.shared.start_sandbox)
SANDBOX_KEEPS_RUNNING = ("the sandbox started and keeps running after this command (it holds the task"
                         " store and the forks): `afs sandbox down` stops it, `afs sandbox status`"
                         " shows its disk use")


def say(message: str) -> None:
    """A line for the person at the terminal (stderr), after any progress line."""
    progress_done()
    print(message, file=sys.stderr, flush=True)


def progress_done() -> None:
    if sys.stderr.isatty():
        print("\r\033[K", end="", file=sys.stderr, flush=True)


def failed(args: argparse.Namespace, message: str, code: int, kind: str,
           prefix: str = "afs: error: ") -> int:
    """Say why on stderr; with --json, also as JSON on stdout, where a script reads: {"error",
    "code" (the exit code), "kind" (the error's class)}."""
    progress_done()
    print(prefix + message, file=sys.stderr)
    if sys.stderr.isatty():  # the warnings before it are in the log file, not on the terminal
        from afs.log import held_back

        count, where = held_back()
        if count and where is not None:
            print(f"afs: {count} warning(s) before it are in {where} (-v prints them here)", file=sys.stderr)
    if getattr(args, "json", False):
        with contextlib.suppress(BrokenPipeError):
            print(json.dumps({"error": message, "code": code, "kind": kind}), flush=True)
    return code


def reader_left() -> int:
    """The reader of our output went away (`afs show T | head`): stop quietly, like cat."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())  # the interpreter's final flush must not fail again
    return 128 + signal.SIGPIPE
