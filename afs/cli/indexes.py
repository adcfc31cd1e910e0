"""`afs indexes`: the index review alone (afs.batch.indexes): unused, duplicate and redundant
indexes of the target, each verified in a fork of its copy in the sandbox.
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
from typing import Any

from afs.batch.indexes import Verifying, review_indexes, sandbox_copy
from afs.batch.statements import parse_duration
from afs.cli.commands import DSN_PASSWORDS, add_top
from afs.cli.output import EXIT_OK, emit, progress, progress_done
from afs.cli.shared import sandbox_stop_reported, start_sandbox
from afs.config import Settings
from afs.db import open_connection
from afs.errors import InputError
from afs.sandbox.forks import open_forks
from afs.sandbox.importer import sandbox_source
from afs.sandbox.seeding import ensure_demo
from afs.sandbox.server import SandboxServer, dsn_for


def min_window(text: str | None, default: float) -> float:
    """--min-window as seconds (InputError for anything but a duration); `default` without it
    (Settings.unused_index_window_s)."""
    if text is None:
        return default
    duration = parse_duration(text)
    if duration is None:
        raise InputError(f"--min-window: expected a duration (7d, 24h, 90m, 0s), got {text!r}")
    return duration.total_seconds()


async def cmd_indexes(args: argparse.Namespace, settings: Settings) -> int:
    window = min_window(args.min_window, settings.unused_index_window_s)
    dsn = args.dsn if args.dsn is not None else settings.target_dsn
    server = SandboxServer(settings)
    await start_sandbox(server)
    if dsn is None:
        await ensure_demo(settings, server, settings.scale, progress)
    target = dsn if dsn is not None else dsn_for(settings, settings.demo_database)
    async with sandbox_stop_reported(settings), open_forks(settings) as forks:
        source = await sandbox_copy(forks, settings, dsn) or await sandbox_source(
            forks, settings.demo_database, dsn)  # none: the usual message (import it first)
        async with open_connection(target) as conn, contextlib.AsyncExitStack() as stack:
            replicas = [await stack.enter_async_context(open_connection(r)) for r in args.replica or ()]
            doc = await review_indexes(Verifying(conn, forks, source, settings, progress),
                                       min_window_s=window, replicas=replicas)
    progress_done()
    emit(args, doc, render_review(doc))
    return EXIT_OK


def render_review(doc: dict[str, Any]) -> str:
    """The review as text: one paragraph an index, then what AFS cannot see."""
    out = [f"# Index review: {doc['database']}", "", f"Window: {doc['window']['note']}.", ""]
    if not doc["advice"]:
        out.append("No unused, duplicate or redundant index found.")
    for a in doc["advice"]:
        per_day = a["write_ms_saved_per_day"]
        out.append(f"- {a['verdict'].upper()} {a['index']} on {a['table']} ({a['kind']}, "
                   f"{a['storage_mb']:.1f} MB): {a['reason']}")
        out.append(f"  writes: {a['write_ms_saved_per_call']:.4f} ms saved a call"
                   + ("" if per_day is None else f", {per_day / 1000:.1f} s a day at the observed rate")
                   + ("" if a.get("write_significant") else " (within the noise)"))
        for statement in a["reads_slower"]:
            out.append(f"  slower without it: `{' '.join(statement.split())[:160]}`")
        if a["verdict"] == "drop":
            out.append(f"  apply: `{a['sql']}`  rollback: `{a['rollback']}`")
            out.append(f"  through afs: afs apply --drop-index {shlex.quote(a['index'])} --dsn DSN")
    out += ["", "What AFS cannot see:"] + [f"- {u}" for u in doc["unseen"]]
    return "\n".join(out)


def add_commands(commands: Any) -> None:
    """indexes."""
    command = add_top(commands, "indexes", cmd_indexes)
    command.epilog = ("Reads the target's catalog, pg_stat_user_indexes, pg_stat_database and "
                      "pg_stat_statements; verifies each candidate in a fork of its copy in the sandbox "
                      "(`afs sandbox import`). Nothing is changed on the target: each drop comes with "
                      "its rollback (CONCURRENTLY); apply one with `afs apply --drop-index SCHEMA.NAME "
                      "--dsn DSN` (verified again, approved, audited; undone by `afs rollback --audit "
                      "ID`). Never proposed: indexes behind constraints, unique indexes, the "
                      "replica identity, system catalogs' indexes.")
    command.add_argument("--dsn", metavar="DSN",
                         help="the target database; default: the configured target, else the demo "
                              "database. " + DSN_PASSWORDS)
    command.add_argument("--replica", metavar="DSN", action="append",
                         help="a standby whose index scans count too (repeat for several): an index only "
                              "a replica's reads use is then not unused. " + DSN_PASSWORDS)
    command.add_argument("--min-window", metavar="DURATION",
                         help="an index with no scan is called unused only when the statistics cover at "
                              "least this long (default 7d, the setting AFS_UNUSED_INDEX_WINDOW_S; 0s to "
                              "judge on any window)")
