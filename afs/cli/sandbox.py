"""`afs sandbox …`: the embedded PostgreSQL, its demo data, imports of other databases, and the
demo shop's workload. Seeding, imports and templates go through the fork provider, which
imports the MCP SDK (about a second): those commands import it themselves, so that
`afs sandbox status` and `afs sandbox down` start fast.

    afs sandbox up|status|down|reset|refresh|import|workload|reclaim
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any

import trio

from afs.cli.commands import DSN_PASSWORDS, add_command, add_top
from afs.cli.output import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, emit, progress, progress_done
from afs.cli.shared import start_sandbox
from afs.config import DEMO_WORKLOAD, DemoWorkload, Settings, parse_cow_size
from afs.db import open_connection
from afs.errors import InputError
from afs.sandbox.server import SandboxServer
from afs.sandbox.storage import CowImage, CowUnavailable, fork_method
from afs.sandbox.workload import plant_indexes, run_workload, summary_text


# -- sandbox -----------------------------------------------------------------------
async def _sandbox_status(settings: Settings) -> dict[str, Any]:
    server = SandboxServer(settings)
    state = await trio.to_thread.run_sync(server.status)
    image = CowImage(settings)
    probe = settings.pgdata if settings.pgdata.is_dir() else settings.home
    info: dict[str, Any] = {
        "running": state.running,
        "dsn": server.dsn(settings.demo_database),
        "database": settings.demo_database,
        "size_mb": None,
        "pid": state.pid,
        "data_dir": str(settings.pgdata),
        "forks": None,
        "spares": None,  # ready forks kept for the next fork (where forks clone)
        # stopped: what a start gives (the image is mounted again then)
        "fork_method": ("clone" if image.exists() else await trio.to_thread.run_sync(fork_method, probe)
                        if probe.is_dir() else "copy"),
        "cow_image": str(image.image) if image.exists() else None,
    }
    # what AFS_HOME takes on disk (blocks allocated: a sparse image counts what it holds)
    info["disk_mb"] = round(await trio.to_thread.run_sync(disk_use, settings.home) / 1048576, 1)
    info["home"] = str(settings.home)
    if state.running:
        async with open_connection(server.dsn()) as conn:
            info["fork_method"] = await conn.fetchval("SHOW file_copy_method")
            # None when there is no demo database (a sandbox holding only imports)
            size = await conn.fetchval("SELECT pg_database_size(datname) FROM pg_database"
                                       " WHERE datname = %s", (settings.demo_database,))
            info["size_mb"] = None if size is None else round(size / 1048576, 1)
            if await conn.fetchval("SELECT to_regclass('afs.forks')"):
                counts = await conn.fetchone(
                    "SELECT count(*) FILTER (WHERE state <> 'spare'),"
                    " count(*) FILTER (WHERE state = 'spare') FROM afs.forks")
                info["forks"], info["spares"] = counts or (0, 0)
    return info


def disk_use(root: Path) -> int:
    """Bytes allocated on disk under `root` (its files' blocks; nothing followed out of it)."""
    total, pending = 0, [root]
    while pending:
        try:
            entries = list(os.scandir(pending.pop()))
        except OSError:  # gone meanwhile, or not ours to read
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    pending.append(Path(entry.path))
                else:
                    total += entry.stat(follow_symlinks=False).st_blocks * 512
            except OSError:
                continue
    return total


def _status_text(info: dict[str, Any]) -> str:
    disk = f"disk: {info['disk_mb']} MB in {info['home']} (the sandbox, imports, forks, logs)"
    if not info["running"]:
        return f"sandbox: stopped (data in {info['data_dir']})\n{disk}"
    size = "not seeded" if info["size_mb"] is None else f"{info['size_mb']} MB"
    method = ("clone (copy-on-write, milliseconds)" if info["fork_method"] == "clone"
              else "copy (every byte; `afs sandbox up --cow` as root makes forks clones)")
    image = f" on the XFS image {info['cow_image']}" if info["cow_image"] else ""
    return (f"sandbox: running (pid {info['pid']})\n"
            f"database: {info['database']} ({size})\n"
            f"dsn: {info['dsn']}\n"
            f"forks: {info['forks'] or 0}, made by {method}{image}\n"
            f"{disk}"
            + (f"\nspares: {info['spares']} ready forks kept for the next task (AFS_FORK_SPARES)"
               if info.get("spares") else ""))


async def cmd_sandbox_up(args: argparse.Namespace, settings: Settings) -> int:
    from afs.sandbox.seeding import ensure_demo  # the MCP SDK (about a second): not for status or down

    server = SandboxServer(settings)
    cow_note = None
    if args.cow or settings.cow:
        cow_note = await _use_cow_storage(settings, server, args.cow_size or settings.cow_size_bytes)
    started = await start_sandbox(server, "starting the sandbox server")
    report = await ensure_demo(settings, server, args.scale or settings.scale, progress)
    progress_done()
    info = await _sandbox_status(settings)
    info["started"] = started
    info["seeded_seconds"] = None if report is None else round(report.seconds, 1)
    info["cow_note"] = cow_note
    text = _status_text(info)
    if cow_note:
        text += f"\nnote: {cow_note}"
    if report is not None:
        text += f"\nseeded {report.scale} data in {report.seconds:.1f} s"
    emit(args, info, text)
    return EXIT_OK


async def _use_cow_storage(settings: Settings, server: Any, size_bytes: int) -> str | None:
    """Copy-on-write forks for the sandbox: its filesystem's reflinks, or an XFS image of its own.

    None when forks clone; otherwise what to do about it (the sandbox keeps working, with copies).
    """
    image = CowImage(settings)
    settings.home.mkdir(parents=True, exist_ok=True)
    here = settings.sandbox_dir if settings.sandbox_dir.is_dir() else settings.home
    if not image.exists() and await trio.to_thread.run_sync(fork_method, here) == "clone":
        return None  # XFS, btrfs, ZFS...: forks clone where the sandbox is
    try:
        await trio.to_thread.run_sync(server.move_to_image, size_bytes, progress)
    except CowUnavailable as exc:
        return str(exc)
    return None


async def cmd_sandbox_status(args: argparse.Namespace, settings: Settings) -> int:
    info = await _sandbox_status(settings)
    emit(args, info, _status_text(info))
    return EXIT_OK


async def cmd_sandbox_down(args: argparse.Namespace, settings: Settings) -> int:
    stopped = await trio.to_thread.run_sync(SandboxServer(settings).stop)
    data: dict[str, Any] = {"running": False, "stopped": stopped}
    if args.unmount:
        data["unmounted"] = await trio.to_thread.run_sync(CowImage(settings).unmount)
    emit(args, data, ("sandbox stopped" if stopped else "sandbox was not running")
         + ("; its XFS image is unmounted" if data.get("unmounted") else ""))
    return EXIT_OK


async def cmd_sandbox_reset(args: argparse.Namespace, settings: Settings) -> int:
    from afs.sandbox.seeding import seed_demo  # the MCP SDK (about a second): not for status or down

    server = SandboxServer(settings)
    await trio.to_thread.run_sync(server.start)
    report = await seed_demo(settings, server, args.scale or settings.scale, progress)
    progress_done()
    info = await _sandbox_status(settings)
    info["seeded_seconds"] = round(report.seconds, 1)
    emit(args, info, _status_text(info) + f"\nseeded {report.scale} data in {report.seconds:.1f} s")
    return EXIT_OK


async def cmd_sandbox_refresh(args: argparse.Namespace, settings: Settings) -> int:
    from afs.forks.provider import (  # the MCP SDK (about a second): not for status or down
        LocalForkProvider,
        template_name,
    )

    server = SandboxServer(settings)
    await trio.to_thread.run_sync(server.start)
    source = args.database or settings.demo_database
    progress(f"copying {source} into {template_name(source)}")
    await LocalForkProvider(server.dsn()).refresh_template(source)
    progress_done()
    emit(args, {"database": source, "template": template_name(source), "refreshed": True},
         f"{template_name(source)} is a fresh copy of {source}: new forks see its current state")
    return EXIT_OK


async def cmd_sandbox_import(args: argparse.Namespace, settings: Settings) -> int:
    from afs.sandbox.importer import import_database  # the MCP SDK (about a second): not for status or down

    source = args.source if args.source is not None else settings.target_dsn
    if source is None:
        raise InputError("name the database to import: --from DSN, AFS_DATABASE_URL or PG* variables")
    server = SandboxServer(settings)
    await trio.to_thread.run_sync(server.start)
    progress(f"importing {'the schema of ' if args.schema_only else ''}the database")
    if args.refresh and args.name and args.name != args.refresh:
        raise InputError("--refresh NAME is the copy's name: leave out --as")
    report = await import_database(server, source, args.refresh or args.name, args.schema_only,
                                   progress, refresh=bool(args.refresh))
    progress_done()
    data = {"database": report.database, "origin": report.origin,
            "seconds": round(report.seconds, 1), "schema_only": report.schema_only,
            "dsn": server.dsn(report.database), "skipped": list(report.skipped)}
    skipped = "".join(f"\nskipped (this server refused it): {s}" for s in report.skipped)
    emit(args, data, f"imported {report.origin} as {report.database} in {report.seconds:.1f} s;"
                     f" fork it with: afs fork create --from {report.database}{skipped}")
    return EXIT_OK


async def cmd_sandbox_reclaim(args: argparse.Namespace, settings: Settings) -> int:
    """List the copies in the sandbox and their size; with --imports, --copy or --demo, say what
    goes and how much, ask (or --yes), then drop them. A copy with forks in use stays."""
    from afs.sandbox.reclaim import MB, choose, reclaim, reclaimable  # the fork provider (MCP SDK)

    server = SandboxServer(settings)
    await start_sandbox(server)
    found = await reclaimable(server.dsn(), settings.demo_database)
    progress_done()
    if not (args.imports or args.copies or args.demo):
        lines = [_copy_line(c.public()) for c in found] or ["no imported copies and no demo data"]
        emit(args, {"copies": [c.public() for c in found], "removed": []},
             "\n".join(["in the sandbox (each with its fork template):", *lines,
                        "reclaim: afs sandbox reclaim --imports (every imported copy) | --copy NAME | --demo"
                        " (the demo data; `afs sandbox up` seeds it again) — it says what goes and asks"]))
        return EXIT_OK
    plan = choose(found, imports=args.imports, names=args.copies or (), demo=args.demo)
    kept = [f"kept: {c.name}: {why}" for c, why in plan.kept]
    if not plan.chosen:
        emit(args, {"copies": [c.public() for c in found], "removed": [],
                    "kept": [{"name": c.name, "reason": why} for c, why in plan.kept]},
             "\n".join(["nothing to remove", *kept]))
        return EXIT_OK
    if not args.json:
        print("\n".join(["will remove (the database, its fork template and spare forks; no fork in use):",
                         *(_copy_line(c.public()) for c in plan.chosen),
                         f"in all: {plan.size_bytes / MB:,.1f} MB", *kept]), flush=True)
    if not args.yes:
        if not sys.stdin.isatty():
            raise InputError("removing copies needs a confirmation and there is no terminal to ask: "
                             "pass --yes to confirm from a script")
        print("remove them? [y/N] ", end="", flush=True)
        answer = await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
        if answer.strip().lower() not in ("y", "yes"):
            emit(args, {"removed": []}, "nothing removed")
            return EXIT_FAILED
    before = await trio.to_thread.run_sync(disk_use, settings.home)
    removed, late = await reclaim(server.dsn(), plan.chosen, settings.demo_database)
    after = await trio.to_thread.run_sync(disk_use, settings.home)
    kept += [f"kept: {c.name}: {why}" for c, why in late]
    image = (" (on the sandbox's XFS image: the image file keeps those blocks for new data)"
             if CowImage(settings).exists() else "")
    emit(args, {"removed": [c.public() for c in removed], "freed_mb": round(max(0, before - after) / MB, 1),
                "disk_mb": round(after / MB, 1),
                "kept": [{"name": c.name, "reason": why} for c, why in [*plan.kept, *late]]},
         "\n".join([*(f"removed {c.name} ({c.size_bytes / MB:,.1f} MB)" for c in removed),
                    f"freed {max(0, before - after) / MB:,.1f} MB on disk{image}; {settings.home} now takes "
                    f"{after / MB:,.1f} MB", *kept]))
    return EXIT_OK


def _copy_line(c: dict[str, Any]) -> str:
    what = (f"demo data ({c['origin']})" if c["kind"] == "demo"
            else f"import of {c['origin']}" + (f", imported {c['imported_at']}" if c["imported_at"] else ""))
    forks = f"; {len(c['forks_in_use'])} fork(s) in use: stays while they live" if c["forks_in_use"] else ""
    return f"  {c['name']}: {c['size_mb']:,.1f} MB, {what}{forks}"


async def cmd_sandbox_workload(args: argparse.Namespace, settings: Settings) -> int:
    """The demo shop's workload against the demo database; Ctrl-C stops it with its summary."""
    from afs.sandbox.seeding import ensure_demo  # the MCP SDK (about a second): not for status or down

    if args.duration <= 0 or args.clients < 1:
        raise InputError("--duration must be positive and --clients at least 1")
    server = SandboxServer(settings)
    await start_sandbox(server)
    await ensure_demo(settings, server, settings.scale, progress)
    stop = trio.Event()

    async def on_ctrl_c() -> None:
        with trio.open_signal_receiver(signal.SIGINT) as signals:  # this one, not the CLI's
            async for _ in signals:
                stop.set()  # the workload stops its clients and returns what ran
                return

    planted = await plant_indexes(server.dsn(settings.demo_database), server.dsn(), settings.demo_database)
    if planted:
        progress(f"planted the demo's indexes to review (`afs indexes`): {', '.join(planted)}")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(on_ctrl_c)
        plan = DemoWorkload(duration_s=args.duration, clients=args.clients, seed=args.seed)
        report = await run_workload(server.dsn(settings.demo_database), plan, reset=args.reset,
                                    progress=progress, stop=stop)
        nursery.cancel_scope.cancel()
    progress_done()
    data = {**{k: getattr(report, k) for k in ("database", "clients", "seconds", "statements", "errors",
                                                 "interrupted")},
            "per_second": round(report.per_second, 1), "shapes": list(report.shapes)}
    emit(args, data, summary_text(report))
    return EXIT_INTERRUPTED if report.interrupted else EXIT_OK


# -- parser --------------------------------------------------------------------------
def _size(text: str) -> int:
    try:
        return parse_cow_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_commands(commands: Any) -> None:
    """sandbox up|status|down|reset|workload|reclaim|refresh|import."""
    sub = add_command
    scales = ("small", "demo", "large")
    sandbox = add_top(commands, "sandbox", description="The embedded PostgreSQL 18 sandbox.")
    sandbox_cmds = sandbox.add_subparsers(dest="action", metavar="ACTION", required=True)
    up = sub(sandbox_cmds, "up", "start the sandbox; seed the demo database if it is missing",
             cmd_sandbox_up)
    up.add_argument("--scale", choices=scales, help="demo data size when seeding (default: demo)")
    up.add_argument("--cow", action="store_true",
                    help="copy-on-write forks: if the sandbox's filesystem has no reflinks, put the "
                         "sandbox on a sparse XFS image file in $AFS_HOME, loop-mounted (needs root; "
                         "an existing sandbox is moved; default: AFS_COW or `cow:` in settings.yaml)")
    up.add_argument("--cow-size", type=_size, metavar="SIZE",
                    help="size of that image, e.g. 100G (sparse: it takes space only as data is "
                         "written; default: AFS_COW_SIZE or 100G)")
    sub(sandbox_cmds, "status", "is the sandbox running; its DSN, size and fork method (clone or copy)",
        cmd_sandbox_status)
    down = sub(sandbox_cmds, "down", "stop the sandbox server (pg_ctl stop); its XFS image, if it has "
               "one, stays mounted so `up` needs no root", cmd_sandbox_down)
    down.add_argument("--unmount", action="store_true",
                      help="also unmount the sandbox's XFS image and detach its loop device (root)")
    reset = sub(sandbox_cmds, "reset", "drop and re-seed the demo database", cmd_sandbox_reset)
    reset.add_argument("--scale", choices=scales, help="demo data size (default: demo)")
    workload = sub(sandbox_cmds, "workload", "run the demo shop's own mixed workload against the demo "
                   "database, so pg_stat_statements has something for `afs batch` to rank",
                   cmd_sandbox_workload)
    workload.description = (
        "Runs a mix of the demo shop's statements with real bind parameters (pg_stat_statements "
        "normalises them to $1 … $n) and Zipf-skewed ids: mostly fast lookups by primary key, four "
        "deliberately slow shapes (a filter without an index, a join through an unindexed foreign key, "
        "an aggregate that wants a covering index, a created_at::date cast), and a few writes, each "
        "rolled back so the demo data stays as seeded. Progress each second on stderr, a summary at the "
        "end; Ctrl-C stops early (exit 130, with the summary). Then: `afs batch --top 5`.")
    workload.add_argument("--duration", type=float, default=DEMO_WORKLOAD.duration_s, metavar="S",
                          help=f"seconds to run (default: {DEMO_WORKLOAD.duration_s:g})")
    workload.add_argument("--clients", type=int, default=DEMO_WORKLOAD.clients, metavar="N",
                          help=f"concurrent connections (default: {DEMO_WORKLOAD.clients})")
    workload.add_argument("--seed", type=int, default=DEMO_WORKLOAD.seed,
                          help=f"seed of the values drawn (default: {DEMO_WORKLOAD.seed})")
    workload.add_argument("--reset", action="store_true",
                          help="forget the demo database's pg_stat_statements entries first")
    reclaim = sub(sandbox_cmds, "reclaim", "give disk space back: list the copies (imports, the demo "
                  "data) and their size; remove the ones named, after saying what and how much, and "
                  "asking", cmd_sandbox_reclaim)
    reclaim.description = (
        "Without options: what the sandbox holds, copy by copy (the database and its fork template), "
        "and its size. With --imports, --copy or --demo: what will be removed and how many MB, a "
        "confirmation (or --yes), then each copy dropped with its template and spare forks. A copy "
        "that a fork in use was made from stays (checked again just before it goes): no fork is ever "
        "touched. The demo data comes back with `afs sandbox up`, an import with `afs sandbox import`.")
    reclaim.add_argument("--imports", action="store_true", help="every imported copy")
    reclaim.add_argument("--copy", dest="copies", action="append", metavar="NAME",
                         help="this copy (an import or the demo database; repeatable)")
    reclaim.add_argument("--demo", action="store_true",
                         help="the demo data (`afs sandbox up` seeds it again)")
    reclaim.add_argument("--yes", action="store_true", help="remove without asking (scripts)")
    refresh = sub(sandbox_cmds, "refresh", "copy a source database into its fork template again, "
                  "so new forks see what changed in it (needs no other session on it)",
                  cmd_sandbox_refresh)
    refresh.add_argument("database", nargs="?", help="the source database (default: the demo database)")
    imp = sub(sandbox_cmds, "import", "copy a database into the sandbox (pg_dump | pg_restore)",
              cmd_sandbox_import)
    imp.add_argument("--from", dest="source", metavar="DSN",
                     help="the database to copy (default: AFS_DATABASE_URL or PG* variables). "
                          + DSN_PASSWORDS)
    imp.add_argument("--as", dest="name", metavar="NAME", help="name in the sandbox")
    imp.add_argument("--schema-only", action="store_true", help="copy the schema, not the data")
    imp.add_argument("--refresh", metavar="NAME",
                     help="import the database again as NAME, an import of it already (a stale copy):"
                          " the new copy replaces the old one once it is complete")
