"""The `afs` command line.

    afs optimize --query SQL                    measure how to make a query faster, in forks
    afs sandbox up|status|down|reset|import     the embedded PostgreSQL and its demo data
    afs sandbox workload                        the demo shop's workload, for `afs batch` to rank
    afs fork create|list|destroy|gc|psql|roundtrip   disposable forks, through the MCP server
    afs mcp serve                               the fork provider as an MCP server (stdio)
    afs history|show|events|resume              tasks in the store: list, report, events, run again
    afs worker | afs serve                      take queued tasks; the HTTP API with live events
    afs batch [show ID | list]                  the target's costliest statements, optimized in turn
    afs schedule add|list|remove                batches on a cron schedule, run by `afs serve`
    afs apply|rollback|audit                    apply a task's winner after approval; undo it; the log

Exit codes: 0 success, 1 failure, 2 bad input or usage, 130 interrupted.
Results go to stdout (`--json` for scripts); progress and logs go to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import trio

from afs import log as afs_log
from afs.config import Settings, default_fork_server_command, load_settings
from afs.errors import (
    AfsError,
    ConfigError,
    DatabaseError,
    ForkError,
    InputError,
    SandboxError,
    scrub,
    single_leaf,
)

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
# every option that takes a DSN says so in its help
DSN_PASSWORDS = ("Keep the password out of the DSN (a command line is visible to every local user in "
                 "`ps`): libpq reads it from PGPASSWORD, ~/.pgpass, or a service file "
                 "(service=NAME, in ~/.pg_service.conf).")


# -- output helpers --------------------------------------------------------------
def emit(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(data, default=str) if getattr(args, "json", False) else text)


def progress(message: str) -> None:
    if sys.stderr.isatty():
        print(f"\r\033[K{message}", end="", file=sys.stderr, flush=True)
    else:
        print(message, file=sys.stderr, flush=True)


def progress_done() -> None:
    if sys.stderr.isatty():
        print("\r\033[K", end="", file=sys.stderr, flush=True)


async def run_interruptible(handler: Callable[[argparse.Namespace, Settings], Awaitable[int]],
                            args: argparse.Namespace, settings: Settings) -> int:
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


# -- sandbox -----------------------------------------------------------------------
SANDBOX_STOPPED = "the sandbox stopped during the task; start it with `afs sandbox up` and run again"


async def _sandbox_answers(settings: Settings) -> bool:
    """Whether the sandbox server runs and takes connections (not stopped, not stopping)."""
    from afs.db import connect_sync
    from afs.sandbox.server import SandboxServer

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
        if not used or not isinstance(leaf, (DatabaseError, ForkError)) or await _sandbox_answers(settings):
            raise
        raise SandboxError(message) from exc


async def _sandbox_status(settings: Settings) -> dict[str, Any]:
    from afs.db import open_connection
    from afs.sandbox.server import SandboxServer
    from afs.sandbox.storage import CowImage, fork_method

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


def _status_text(info: dict[str, Any]) -> str:
    if not info["running"]:
        return f"sandbox: stopped (data in {info['data_dir']})"
    size = "not seeded" if info["size_mb"] is None else f"{info['size_mb']} MB"
    method = ("clone (copy-on-write, milliseconds)" if info["fork_method"] == "clone"
              else "copy (every byte; `afs sandbox up --cow` as root makes forks clones)")
    image = f" on the XFS image {info['cow_image']}" if info["cow_image"] else ""
    return (f"sandbox: running (pid {info['pid']})\n"
            f"database: {info['database']} ({size})\n"
            f"dsn: {info['dsn']}\n"
            f"forks: {info['forks'] or 0}, made by {method}{image}"
            + (f"\nspares: {info['spares']} ready forks kept for the next task (AFS_FORK_SPARES)"
               if info.get("spares") else ""))


async def cmd_sandbox_up(args: argparse.Namespace, settings: Settings) -> int:
    from afs.sandbox.seeding import ensure_demo
    from afs.sandbox.server import SandboxServer

    server = SandboxServer(settings)
    cow_note = None
    if args.cow or settings.cow:
        cow_note = await _use_cow_storage(settings, server, args.cow_size or settings.cow_size_bytes)
    progress("starting the sandbox server")
    started = await trio.to_thread.run_sync(server.start)
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
    from afs.sandbox.storage import CowImage, CowUnavailable, fork_method

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
    from afs.sandbox.server import SandboxServer
    from afs.sandbox.storage import CowImage

    stopped = await trio.to_thread.run_sync(SandboxServer(settings).stop)
    data: dict[str, Any] = {"running": False, "stopped": stopped}
    if args.unmount:
        data["unmounted"] = await trio.to_thread.run_sync(CowImage(settings).unmount)
    emit(args, data, ("sandbox stopped" if stopped else "sandbox was not running")
         + ("; its XFS image is unmounted" if data.get("unmounted") else ""))
    return EXIT_OK


async def cmd_sandbox_reset(args: argparse.Namespace, settings: Settings) -> int:
    from afs.sandbox.seeding import seed_demo
    from afs.sandbox.server import SandboxServer

    server = SandboxServer(settings)
    await trio.to_thread.run_sync(server.start)
    report = await seed_demo(settings, server, args.scale or settings.scale, progress)
    progress_done()
    info = await _sandbox_status(settings)
    info["seeded_seconds"] = round(report.seconds, 1)
    emit(args, info, _status_text(info) + f"\nseeded {report.scale} data in {report.seconds:.1f} s")
    return EXIT_OK


async def cmd_sandbox_refresh(args: argparse.Namespace, settings: Settings) -> int:
    from afs.forks.provider import LocalForkProvider, template_name
    from afs.sandbox.server import SandboxServer

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
    from afs.sandbox.importer import import_database
    from afs.sandbox.server import SandboxServer

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


async def cmd_sandbox_workload(args: argparse.Namespace, settings: Settings) -> int:
    """The demo shop's workload against the demo database; Ctrl-C stops it with its summary."""
    from afs.sandbox.seeding import ensure_demo
    from afs.sandbox.server import SandboxServer
    from afs.sandbox.workload import run_workload, summary_text

    if args.duration <= 0 or args.clients < 1:
        raise InputError("--duration must be positive and --clients at least 1")
    server = SandboxServer(settings)
    progress("starting the sandbox")
    await trio.to_thread.run_sync(server.start)
    await ensure_demo(settings, server, settings.scale, progress)
    stop = trio.Event()

    async def on_ctrl_c() -> None:
        with trio.open_signal_receiver(signal.SIGINT) as signals:  # this one, not the CLI's
            async for _ in signals:
                stop.set()  # the workload stops its clients and returns what ran
                return

    async with trio.open_nursery() as nursery:
        nursery.start_soon(on_ctrl_c)
        report = await run_workload(server.dsn(settings.demo_database), duration_s=args.duration,
                                    clients=args.clients, seed=args.seed, reset=args.reset,
                                    progress=progress, stop=stop)
        nursery.cancel_scope.cancel()
    progress_done()
    data = {**{k: getattr(report, k) for k in ("database", "clients", "seconds", "statements", "errors",
                                                 "interrupted")},
            "per_second": round(report.per_second, 1), "shapes": list(report.shapes)}
    emit(args, data, summary_text(report))
    return EXIT_INTERRUPTED if report.interrupted else EXIT_OK


# -- forks ---------------------------------------------------------------------------
async def _default_source(client: Any, settings: Settings) -> str:
    """The configured target once imported, else the demo database."""
    from afs.sandbox.importer import imported_copy

    if settings.target_dsn is not None:
        return await imported_copy(client, settings.target_dsn) or settings.demo_database
    return settings.demo_database


def _fork_text(fork: dict[str, Any]) -> str:
    return (f"{fork['name']}  parent={fork['parent']}  ttl={fork['ttl_seconds']}s"
            f"  created={fork['created_at']}\n  dsn: {fork['dsn']}")


async def cmd_fork_create(args: argparse.Namespace, settings: Settings) -> int:
    from afs.sandbox.forks import open_forks

    if args.ttl is not None and args.ttl <= 0:
        raise InputError(f"--ttl must be a positive number of seconds, got {args.ttl}")
    async with open_forks(settings) as client:
        source = args.source or await _default_source(client, settings)
        fork = await client.create(source, name=args.name,
                                   ttl_seconds=args.ttl or settings.fork_ttl_seconds)
    emit(args, fork.public(), _fork_text(fork.public()))
    return EXIT_OK


async def cmd_fork_list(args: argparse.Namespace, settings: Settings) -> int:
    from afs.sandbox.forks import open_forks

    async with open_forks(settings) as client:
        services = await client.list_services()
    forks = [{k: f[k] for k in ("name", "dsn", "parent", "created_at", "ttl_seconds")}
             for f in services["forks"]]
    emit(args, forks, "\n".join(_fork_text(f) for f in forks) or "no forks")
    return EXIT_OK


async def cmd_fork_destroy(args: argparse.Namespace, settings: Settings) -> int:
    from afs.sandbox.forks import open_forks

    async with open_forks(settings) as client:
        deleted = await client.destroy(args.name)
    emit(args, {"name": args.name, "deleted": deleted},
         f"destroyed {args.name}" if deleted else f"{args.name} did not exist (nothing to do)")
    return EXIT_OK


async def cmd_fork_gc(args: argparse.Namespace, settings: Settings) -> int:
    from afs.forks.provider import LocalForkProvider
    from afs.sandbox.server import SandboxServer

    server = SandboxServer(settings)
    await trio.to_thread.run_sync(server.start)
    report = await LocalForkProvider(server.dsn()).gc()
    lines = [f"removed {name}" for name in report.removed]
    lines += [f"could not remove {name}: {reason}" for name, reason in report.failed.items()]
    emit(args, report.public(), "\n".join(lines) or "nothing to collect")
    return EXIT_FAILED if report.failed else EXIT_OK


def psql_invocation(psql: str, dsn: str, env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """psql's command line and environment for `dsn`: the password goes in PGPASSWORD, never
    on the command line (`ps` and /proc/PID/cmdline show it to every local user; a process's
    environment only to its own user)."""
    from psycopg import conninfo

    params = conninfo.conninfo_to_dict(dsn)
    password = params.pop("password", None)
    child = dict(env)
    if password is not None:
        child["PGPASSWORD"] = str(password)
    return [psql, conninfo.make_conninfo("", **params)], child


async def cmd_fork_psql(args: argparse.Namespace, settings: Settings) -> int:
    from afs.sandbox.forks import open_forks
    from afs.sandbox.server import pg_binary

    async with open_forks(settings) as client:
        info = await client.get(args.name)
    if info.get("kind") != "fork":
        raise InputError(f"{args.name!r} is not a fork")
    if args.dsn:
        print(info["dsn"])
        return EXIT_OK
    psql = pg_binary("psql")
    argv, env = psql_invocation(psql, info["dsn"], os.environ)
    os.execve(psql, argv, env)


async def cmd_fork_roundtrip(args: argparse.Namespace, settings: Settings) -> int:
    """Sandbox up, then one fork through MCP: write in it, check the source, destroy it."""
    from afs.db import open_connection
    from afs.sandbox.forks import open_forks
    from afs.sandbox.seeding import ensure_demo
    from afs.sandbox.server import SandboxServer

    server = SandboxServer(settings)
    progress("starting the sandbox server")
    await trio.to_thread.run_sync(server.start)
    await ensure_demo(settings, server, settings.scale, progress)
    progress("forking the demo database through the MCP server")
    started = time.monotonic()
    async with open_forks(settings) as client:
        async with client.open_fork(settings.demo_database) as fork:
            created_ms = (time.monotonic() - started) * 1000
            async with open_connection(fork.dsn) as conn:
                items = await conn.fetchval("SELECT count(*) FROM order_items")
                await conn.execute("CREATE INDEX roundtrip_idx ON orders (user_id)")
                await conn.execute("TRUNCATE order_items")
                in_fork = await conn.fetchval("SELECT count(*) FROM order_items")
        left = [f["name"] for f in (await client.list_services())["forks"] if f["name"] == fork.name]
    async with open_connection(server.dsn(settings.demo_database)) as conn:
        in_source = await conn.fetchval("SELECT count(*) FROM order_items")
        index_leaked = await conn.fetchval("SELECT to_regclass('roundtrip_idx') IS NOT NULL")
    progress_done()
    untouched = in_source == items and not index_leaked
    ok = untouched and not left
    data = {"fork": fork.name, "fork_create_ms": round(created_ms, 1),
            "order_items_in_source": in_source, "order_items_in_fork": in_fork,
            "source_untouched": untouched, "fork_destroyed": not left, "ok": ok}
    emit(args, data, (
        f"forked {settings.demo_database} as {fork.name} in {created_ms:.0f} ms (MCP round trip)\n"
        f"in the fork: created an index, truncated order_items ({items} rows -> {in_fork})\n"
        f"source untouched ({in_source} order_items, no new index): {'yes' if untouched else 'NO'}\n"
        f"fork destroyed: {'yes' if not left else 'NO'}"))
    return EXIT_OK if ok else EXIT_FAILED


# -- optimize ---------------------------------------------------------------------------
def parse_weights(text: str | None) -> dict[str, float] | None:
    """`performance=0.6,storage=0.2,complexity=0.1,risk=0.1` → a checked mapping."""
    if text is None:
        return None
    from afs.consensus import check_weights

    weights: dict[str, float] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        try:
            weights[key.strip()] = float(value)
        except ValueError:
            raise InputError(f"--weights: expected name=number, got {part!r}") from None
        if not sep:
            raise InputError(f"--weights: expected name=number, got {part!r}")
    try:
        check_weights(weights)
    except ValueError as exc:
        raise InputError(f"--weights: {exc}") from None
    return weights


async def _served_source(client: Any, dsn: str) -> str:
    """The source another fork server makes from `dsn`: its import, else the database of that
    name registered there (`afs mcp serve --admin-dsn … --register DB`)."""
    from afs.sandbox.importer import origin_of

    origin = origin_of(dsn)
    sources = (await client.list_services())["sources"]
    for source in sources:
        if source.get("origin") == origin:
            return str(source["name"])
    dbname = origin.rpartition("/")[2]
    for source in sources:
        if source["name"] == dbname:
            return dbname
    raise InputError(f"the fork server has no source for {origin}: register the database there"
                     f" (`afs mcp serve --admin-dsn DSN --register {dbname}`)")


def uses_the_sandbox(settings: Settings, dsn: str | None) -> bool:
    """The sandbox serves forks unless another fork server is configured and a DSN is given."""
    return dsn is None or settings.fork_server_command == default_fork_server_command()


def add_libpq_flags(parser: argparse.ArgumentParser) -> None:
    """psql's -d/-p/-U (and --host: -h is --help here) for the target, over --dsn or the
    configured target."""
    parser.add_argument("-d", "--dbname", metavar="NAME", help="the target's database, as psql -d")
    parser.add_argument("--host", metavar="HOST", help="the target's host or socket directory, as psql -h")
    parser.add_argument("-p", "--port", metavar="PORT", help="the target's port, as psql -p")
    parser.add_argument("-U", "--username", metavar="USER", help="the target's user, as psql -U")


def target_from_flags(args: argparse.Namespace, settings: Settings) -> str | None:
    """--dsn (else the configured target), with psql's flags written over it; None: nothing given."""
    from psycopg import conninfo  # here: the CLI starts without psycopg for --help

    dsn = args.dsn if args.dsn is not None else settings.target_dsn
    given = {key: value for key, value in (("dbname", args.dbname), ("host", args.host),
                                           ("port", args.port), ("user", args.username)) if value}
    if not given:
        return dsn
    try:
        return conninfo.make_conninfo(dsn or "", **given)
    except Exception as exc:  # psycopg.ProgrammingError: a DSN that does not parse
        raise InputError(f"the target does not parse: {scrub(str(exc))}") from None


def query_text(query: str | None, file: str | None) -> str:
    """The query as given: `--query SQL`, `--query -` (standard input) or `--file FILE`, read as
    UTF-8 and at most one byte past the size limit (afs.features.check_input refuses it)."""
    from afs.query.text import MAX_QUERY_BYTES

    if query is not None and query != "-":
        return query
    try:
        if query == "-":
            raw = sys.stdin.buffer.read(MAX_QUERY_BYTES + 1)
            where = "standard input"
        else:
            assert file is not None
            with open(file, "rb") as handle:
                raw = handle.read(MAX_QUERY_BYTES + 1)
            where = file
    except OSError as exc:
        raise InputError(f"cannot read the query: {exc.strerror or exc}: {file}") from None
    if len(raw) > MAX_QUERY_BYTES:
        raise InputError(f"the query in {where} is larger than {MAX_QUERY_BYTES:,} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"the query in {where} is not UTF-8 text (byte {exc.start})") from None
    if not text.strip():
        raise InputError(f"the query in {where} is empty")
    return text


async def cmd_optimize(args: argparse.Namespace, settings: Settings) -> int:
    """A task like any other: stored, run here (or by `--server`), its report printed."""
    from afs.optimize import read_input

    runs = settings.runs if args.runs is None else args.runs
    if runs < 1:
        raise InputError(f"--runs must be at least 1, got {runs}")
    # the target as every command resolves it: --dsn and psql's flags, AFS_DATABASE_URL, PG*, the file
    args.dsn = target_from_flags(args, settings)
    args.query = query_text(args.query, args.file)
    await trio.to_thread.run_sync(read_input, args.query)  # bad input: refused before anything starts
    weights = parse_weights(args.weights)
    if args.server:
        return await _optimize_remote(args, settings, runs, weights)
    from afs.brains.choose import check_provider

    await check_provider(args.provider, settings, os.environ)  # models that exist, before a sandbox
    from afs.display import LiveDisplay
    from afs.optimize import new_task_id
    from afs.sandbox.importer import sandbox_source
    from afs.sandbox.seeding import ensure_demo
    from afs.sandbox.server import SandboxServer
    from afs.service.runner import relayed_cancellation, run_task
    from afs.service.worker import open_runtime, worker_name
    from afs.store import store_url

    sandboxed = uses_the_sandbox(settings, args.dsn)
    if not sandboxed and not settings.store_url:
        raise ConfigError("with another fork server (AFS_FORK_SERVER_COMMAND) and --dsn, set "
                          "AFS_STORE_URL to the task store's database (the sandbox holds it otherwise)")
    if sandboxed:
        server = SandboxServer(settings)
        progress("starting the sandbox")
        await trio.to_thread.run_sync(server.start)
        if args.dsn is None:
            await ensure_demo(settings, server, settings.scale, progress)
    progress_done()
    display = LiveDisplay(live=None if not args.json else False)
    worker = worker_name("optimize")
    finished = None
    async with sandbox_stop_reported(settings, sandboxed), relayed_cancellation() as work, \
            open_runtime(settings, store_url(settings)) as rt:
        with work:  # Ctrl-C: the task is recorded as cancelled, its forks destroyed
            direct_dsn = None
            if sandboxed:
                source = await sandbox_source(rt.forks, settings.demo_database, args.dsn)
            else:  # another fork server: the database itself is read, and forked there
                source, direct_dsn = await _served_source(rt.forks, args.dsn), args.dsn
            task = await rt.store.submit(
                task_id=new_task_id(), query=args.query, source=source, dsn=args.dsn,
                task_type=args.type, priority=args.priority, provider=args.provider, weights=weights,
                runs=runs, worker=worker, lease_s=rt.lease_s)
            async with display.running():
                finished = await run_task(rt, task, worker, sinks=(display.sink,), on_interrupt="cancel",
                                          direct_dsn=direct_dsn)
    if finished is None:
        raise KeyboardInterrupt
    if finished.status == "failed" and sandboxed and not await _sandbox_answers(settings):
        raise SandboxError(f"{SANDBOX_STOPPED} (task {finished.task_id}: `afs resume {finished.task_id}`)")
    return _print_finished(args, finished.task_id, finished.result, finished.error,
                           finished.bad_input)


def _print_finished(args: argparse.Namespace, task_id: str, result: Any, error: str | None,
                    bad_input: bool = False) -> int:
    from afs import report

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


# -- the service: task store, history, workers, HTTP API (afs.store, afs.service) ---------
@asynccontextmanager
async def _open_task_store(settings: Settings) -> AsyncIterator[Any]:
    """The task store: AFS_STORE_URL, else the sandbox (started if it is not running)."""
    from afs.store import open_store, store_url

    if settings.store_url is None:
        from afs.sandbox.server import SandboxServer

        await trio.to_thread.run_sync(SandboxServer(settings).start)
    async with open_store(store_url(settings)) as store:
        yield store


def _history_text(tasks: list[Any], winners: Mapping[str, Mapping[str, Any]]) -> str:
    lines = [f"{'task':<9} {'status':<15} {'created':<20} {'source':<12} {'winner':<20} {'gain':>7}  query"]
    for t in tasks:
        query = " ".join(t.query.split())
        won = winners.get(t.id) or {}
        gain = won.get("improvement_pct")
        lines.append(f"{t.id:<9} {t.status:<15} {t.created_at:%Y-%m-%d %H:%M:%S} "
                     f"{(t.source or '-'):<12} {won.get('proposal_type') or '-'!s:<20} "
                     f"{'-' if gain is None else f'{float(gain):.1f} %':>7}  "
                     f"{query[:60] + ('…' if len(query) > 60 else '')}")
    return "\n".join(lines) if tasks else "no tasks yet"


async def cmd_history(args: argparse.Namespace, settings: Settings) -> int:
    from afs.store.store import STATUSES

    if args.limit < 1:
        raise InputError(f"--limit must be at least 1, got {args.limit}")
    unknown = [s for s in args.status if s not in STATUSES]
    if unknown:
        raise InputError(f"--status: unknown {', '.join(unknown)} (one of {', '.join(STATUSES)})")
    async with _open_task_store(settings) as store:
        tasks = await store.tasks(limit=args.limit, statuses=args.status)
        winners = await store.winners([t.id for t in tasks])
    emit(args, [{**t.public(), "winner": winners.get(t.id)} for t in tasks], _history_text(tasks, winners))
    return EXIT_OK


async def cmd_show(args: argparse.Namespace, settings: Settings) -> int:
    async with _open_task_store(settings) as store:
        task = await store.get(args.task)
        result = await store.result(args.task)
    if result is not None:
        return _print_finished(args, task.id, result, task.error)
    emit(args, task.public(), f"AFS task {task.id}: {task.status}"
         + (f": {task.error}" if task.error else "") + f"\nquery: {task.query}")
    return EXIT_FAILED if task.status in ("failed", "cancelled", "interrupted") else EXIT_OK


def _event_text(e: Any) -> str:
    who = " ".join(x for x in (e.agent, e.fork) if x)
    data = " ".join(f"{k}={v}" for k, v in e.data.items())
    took = f" ({e.duration_s:.2f} s)" if e.duration_s is not None else ""
    return f"{e.at:%H:%M:%S.%f}"[:-3] + f" #{e.id} {e.kind}{took} {who} {data}".rstrip()


async def cmd_events(args: argparse.Namespace, settings: Settings) -> int:
    """Print a task's events; with --follow, go on until the task ends."""
    async with _open_task_store(settings) as store:
        await store.get(args.task)
        last = args.after
        while True:
            events = await store.events(args.task, after=last)
            for e in events:
                print(json.dumps(e.public(), default=str) if args.json else _event_text(e), flush=True)
                last = e.id
            if not args.follow:
                return EXIT_OK
            if not events:
                if (await store.get(args.task)).finished and not await store.events(args.task, after=last):
                    return EXIT_OK
                await trio.sleep(0.2)


async def cmd_resume(args: argparse.Namespace, settings: Settings) -> int:
    """Queue a failed, cancelled or interrupted task again, and run it here unless --queue-only."""
    from afs.service.runner import run_task
    from afs.service.worker import open_runtime, worker_name
    from afs.store import store_url

    async with _open_task_store(settings) as store:
        task = await store.resume(args.task)
    if args.queue_only:
        emit(args, task.public(), f"task {task.id} is queued again: a worker will take it")
        return EXIT_OK
    worker = worker_name("resume")
    sandboxed = settings.store_url is None or (not settings.fork_server_url and settings.fork_server_command
                                                == default_fork_server_command())
    async with sandbox_stop_reported(settings, sandboxed), open_runtime(settings, store_url(settings)) as rt:
        claimed = await rt.store.claim(worker, rt.lease_s, task_id=task.id, in_process=True)
        if claimed is None:
            emit(args, task.public(), f"task {task.id} is queued again; a worker took it already")
            return EXIT_OK
        finished = await run_task(rt, claimed, worker, on_interrupt="cancel")
    return _print_finished(args, finished.task_id, finished.result, finished.error, finished.bad_input)


async def cmd_worker(args: argparse.Namespace, settings: Settings) -> int:
    """Take tasks from the store until interrupted (a running task goes back to the queue)."""
    from afs.service.runner import relayed_cancellation
    from afs.service.worker import open_runtime, run_worker, worker_name
    from afs.store import store_url

    if args.lease <= 0 or args.poll <= 0:
        raise InputError("--lease and --poll must be positive numbers of seconds")
    name = args.name or worker_name()
    sandboxed = settings.store_url is None or not settings.source_server_url
    if sandboxed:
        from afs.sandbox.server import SandboxServer

        await trio.to_thread.run_sync(SandboxServer(settings).start)
    print(f"afs worker {name}: taking tasks (Ctrl-C stops it)", file=sys.stderr, flush=True)
    ran = 0
    stopped = "the sandbox stopped under the worker; start it with `afs sandbox up` and the worker again"
    async with sandbox_stop_reported(settings, sandboxed, stopped), relayed_cancellation() as work, \
            open_runtime(settings, store_url(settings), lease_s=args.lease) as rt:
        with work:  # Ctrl-C: the task goes back to the queue, its forks destroyed
            ran = await run_worker(rt, name, poll_s=args.poll, max_tasks=args.max_tasks)
    emit(args, {"worker": name, "tasks": ran}, f"worker {name} ran {ran} task(s)")
    return EXIT_OK


async def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    from afs.service.api import serve

    await serve(settings, bind=args.bind, workers=args.workers, lease_s=args.lease)
    return EXIT_OK


async def _optimize_remote(args: argparse.Namespace, settings: Settings, runs: int,
                           weights: dict[str, float] | None) -> int:
    """Submit to `afs serve`, follow its events, print the same report."""
    from afs.models import TaskResult
    from afs.service.client import ServiceClient
    from afs.store.codec import decode

    body: dict[str, Any] = {"query": args.query, "priority": args.priority, "type": args.type,
                            "provider": args.provider, "runs": runs, "weights": weights}
    if args.dsn:
        body["dsn"] = args.dsn
    async with ServiceClient(args.server, settings.service_token) as client:
        task = await client.submit(body)
        progress(f"task {task['id']} queued on {args.server}")
        async for event in client.events(task["id"]):
            who = f" {event['agent']}" if event.get("agent") else ""
            progress(f"task {task['id']}: {event['kind']}{who}")
        doc = await client.get(task["id"])
    progress_done()
    result = None if doc.get("result") is None else decode(TaskResult, doc["result"])
    return _print_finished(args, task["id"], result, doc["task"].get("error"))


def add_service_commands(commands: Any, sub: Any) -> None:
    """history, show, events, resume, worker, serve (and `optimize --server`)."""
    from afs.store.store import STATUSES

    hist = sub(commands, "history", "the tasks in the store, newest first", cmd_history)
    hist.add_argument("--limit", type=int, default=20, help="how many (default 20)")
    hist.add_argument("--status", action="append", default=[], metavar="STATUS",
                      help=f"only these statuses ({', '.join(STATUSES)}); repeatable")
    show = sub(commands, "show", "a stored task's report (the same as `afs optimize` printed)",
               cmd_show)
    show.add_argument("task", help="the task id (see `afs history`)")
    events = sub(commands, "events", "a task's events, in order (one JSON object a line with --json)",
                 cmd_events)
    events.add_argument("task")
    events.add_argument("--follow", "-f", action="store_true", help="wait for new events until the task ends")
    events.add_argument("--after", type=int, default=0, metavar="ID", help="only events after this id")
    resume = sub(commands, "resume", "run a failed, cancelled or interrupted task again (interrupted: "
                 "the command that ran it was killed)", cmd_resume)
    resume.add_argument("task")
    resume.add_argument("--queue-only", action="store_true",
                        help="only put it back in the queue, for a worker")
    worker = sub(commands, "worker", "take queued tasks from the store and run them", cmd_worker)
    worker.add_argument("--name", help="worker name (default: host, pid and a random suffix)")
    worker.add_argument("--lease", type=float, default=30.0, metavar="S",
                        help="lease length; renewed every min(S/3, 0.5) s (default 30)")
    worker.add_argument("--poll", type=float, default=0.5, metavar="S", help="queue poll interval")
    worker.add_argument("--max-tasks", type=int, metavar="N", help="stop after N tasks")
    serve = sub(commands, "serve", "the HTTP API (and N in-process workers)", cmd_serve, json_flag=False)
    serve.add_argument("--bind", default="127.0.0.1:8470", metavar="HOST:PORT",
                       help="address to listen on (default 127.0.0.1:8470); any other than loopback "
                            "needs AFS_SERVICE_TOKEN")
    serve.add_argument("--workers", type=int, default=1, metavar="N",
                       help="in-process workers (default 1; 0 = the API, and recovery of the tasks of "
                            "dead workers elsewhere)")
    serve.add_argument("--lease", type=float, default=30.0, metavar="S", help="the workers' lease")


# -- the batch job: the target's costliest statements (afs.batch) -----------------------------
async def cmd_batch(args: argparse.Namespace, settings: Settings) -> int:
    """`afs batch [options]` runs a batch; `afs batch show ID` prints a stored one."""
    if args.words == ["list"]:
        return await _batch_list(args, settings)
    if args.words:
        if len(args.words) != 2 or args.words[0] != "show":
            raise InputError("usage: afs batch [--dsn DSN] [--top N] … | afs batch show ID | afs batch list")
        return await _batch_show(args, settings, args.words[1])
    from afs.batch.job import run_batch_here
    from afs.sandbox.seeding import ensure_demo
    from afs.sandbox.server import SandboxServer
    from afs.store import store_url

    options = _batch_options(args, settings)
    options.check()
    if args.dsn is None:  # the target as every command resolves it: AFS_DATABASE_URL, PG*, the file
        args.dsn = settings.target_dsn
    if args.server:
        doc = await _batch_remote(args, settings, options)
    else:
        server = SandboxServer(settings)
        progress("starting the sandbox")
        await trio.to_thread.run_sync(server.start)
        if args.dsn is None:
            await ensure_demo(settings, server, settings.scale, progress)
        async with sandbox_stop_reported(settings):
            doc = await run_batch_here(settings, store_url(settings), dsn=args.dsn, options=options,
                                       progress=progress)
    progress_done()
    from afs.batch.report import render_markdown

    emit(args, doc, render_markdown(doc) + f"\n(report: {settings.home / 'reports'}/batch-{doc['id']}.md)")
    return EXIT_OK


def _batch_options(args: argparse.Namespace, settings: Settings) -> Any:
    from afs.batch.job import BatchOptions

    return BatchOptions(top=args.top, min_calls=args.min_calls, min_mean_ms=args.min_mean_ms,
                        force=getattr(args, "force", False), provider=args.provider,
                        runs=settings.runs if args.runs is None else args.runs,
                        recent_days=args.recent_days, since=args.since)


async def _batch_remote(args: argparse.Namespace, settings: Settings, options: Any) -> dict[str, Any]:
    """The tasks to `afs serve` at --server; the target read, and the report written, here."""
    from afs.batch.job import run_batch_on_server
    from afs.sandbox.server import dsn_for
    from afs.service.client import ServiceClient

    target = args.dsn if args.dsn is not None else dsn_for(settings, settings.demo_database)
    async with _open_task_store(settings) as store, \
            ServiceClient(args.server, settings.service_token) as client:
        doc: dict[str, Any] = await run_batch_on_server(store, settings, client, target_dsn=target,
                                                        task_dsn=args.dsn, options=options,
                                                        progress=progress)
    return doc


async def _batch_show(args: argparse.Namespace, settings: Settings, batch_id: str) -> int:
    from afs.batch.job import stored_batch

    async with _open_task_store(settings) as store:
        doc, markdown = await stored_batch(store, batch_id)
    if doc is None:
        emit(args, {"id": batch_id, "status": "running"}, f"batch {batch_id} has not finished")
        return EXIT_FAILED
    emit(args, doc, markdown or "")
    return EXIT_OK


async def _batch_list(args: argparse.Namespace, settings: Settings) -> int:
    from afs.batch.job import batches

    async with _open_task_store(settings) as store:
        found = await batches(store)
    emit(args, found, "\n".join(f"{b['id']}  {b['created_at'][:19]}  {b['origin']}"
                                 + ("" if b["finished_at"] else "  (not finished)") for b in found)
         or "no batches yet")
    return EXIT_OK


def add_batch_command(commands: Any, sub: Any) -> None:
    batch = sub(commands, "batch", "optimize the target's costliest statements "
                "(pg_stat_statements), one task each; `afs batch show ID` prints a stored report, "
                "`afs batch list` the stored batches",
                cmd_batch)
    batch.epilog = ("The target needs pg_stat_statements (preloaded, and created in the database). "
                    "Statements' $n parameters are filled from pg_stats. Report: Markdown, or --json; "
                    "also in $AFS_HOME/reports/ and the store. Nothing is applied to the target.")
    batch.add_argument("words", nargs="*", metavar="show ID | list",
                       help="print stored batch ID; list the stored batches, newest first")
    batch.add_argument("--dsn", metavar="DSN",
                       help="the target database (read: pg_stat_statements, pg_stats, EXPLAIN); its copy "
                            "in the sandbox is where tasks run (`afs sandbox import`); default: the demo "
                            "database. " + DSN_PASSWORDS)
    batch.add_argument("--top", type=int, default=10, metavar="N", help="statements to optimize (default 10)")
    batch.add_argument("--min-calls", type=int, default=1, metavar="C",
                       help="only statements called at least C times")
    batch.add_argument("--min-mean-ms", type=float, default=0.0, metavar="M",
                       help="only statements taking at least M ms on average")
    batch.add_argument("--force", action="store_true",
                       help="optimize again statements optimized recently with no schema change since")
    batch.add_argument("--recent-days", type=float, default=7.0, metavar="D",
                       help="what 'recently' means for --force (default 7 days)")
    batch.add_argument("--provider", choices=("auto", "heuristic", "gemini"), default="auto",
                       help="who thinks (as for afs optimize)")
    batch.add_argument("--runs", type=int, help="measured runs per suite query and side (default: AFS_RUNS)")
    batch.add_argument("--since", metavar="WHEN", help=SINCE_HELP)
    batch.add_argument("--server", metavar="URL",
                       help="submit the tasks to `afs serve` at URL (its workers run them, in parallel) "
                            "and wait for them; the target is read and the report written here, so the "
                            "server must use the same task store (AFS_STORE_URL; checked first)")


SINCE_HELP = ("rank by what ran since WHEN: a duration (24h, 7d, 90m, 2w) or an ISO timestamp "
              "(2026-11-22T03:00Z; UTC when no zone). pg_stat_statements keeps only running totals, "
              "so this is the counters now minus those stored by the newest earlier batch at or before "
              "WHEN (every batch stores them); with no such snapshot, or after a statistics reset, the "
              "window is since the reset, and the report says so. Default: since the reset")


# -- schedules: batches run by `afs serve` (afs.batch.schedule) ------------------------------
async def cmd_schedule_add(args: argparse.Namespace, settings: Settings) -> int:
    from afs.batch.schedule import add_schedule, check_cron, check_zone, describe, schedules

    check_cron(args.cron)  # bad input first: before the store starts
    check_zone(args.tz)
    options = _batch_options(args, settings)
    options.check()
    async with _open_task_store(settings) as store:
        added = await add_schedule(store, dsn=args.dsn, cron=args.cron, timezone=args.tz, options=options,
                                   origin=f"sandbox/{settings.demo_database}")
        doc = next(d for d in await schedules(store) if d["id"] == added.id)
    emit(args, doc, f"schedule {added.id} added; `afs serve` runs it\n{describe(doc)}")
    return EXIT_OK


async def cmd_schedule_list(args: argparse.Namespace, settings: Settings) -> int:
    from afs.batch.schedule import describe, schedules

    async with _open_task_store(settings) as store:
        found = await schedules(store)
    emit(args, found, "\n".join(describe(d) for d in found) or "no schedules (`afs schedule add`)")
    return EXIT_OK


async def cmd_schedule_remove(args: argparse.Namespace, settings: Settings) -> int:
    from afs.batch.schedule import remove_schedule

    async with _open_task_store(settings) as store:
        await remove_schedule(store, args.id)
    emit(args, {"id": args.id, "removed": True}, f"schedule {args.id} removed (its batches stay)")
    return EXIT_OK


def add_schedule_commands(commands: Any, sub: Any) -> None:
    schedule = commands.add_parser(
        "schedule", help="batches run on a cron schedule by `afs serve`",
        description="Batches (`afs batch`) run by `afs serve` on a cron schedule. A run still going is "
                    "not started again (also not by another `afs serve` on the same store); runs missed "
                    "while no server was up are run once when one starts.")
    actions = schedule.add_subparsers(dest="action", metavar="ACTION", required=True)
    add = sub(actions, "add", "store a schedule (the next run is shown)", cmd_schedule_add)
    add.add_argument("--dsn", metavar="DSN",
                     help="the target database, as for `afs batch` (stored as given: prefer a DSN "
                          "without a password, with ~/.pgpass or PGPASSWORD where `afs serve` runs); "
                          "default: the sandbox's demo database. " + DSN_PASSWORDS)
    add.add_argument("--cron", required=True, metavar="EXPR",
                     help='five fields, minute hour day-of-month month day-of-week, e.g. "0 3 * * *" '
                          "(or @daily, @hourly, …)")
    add.add_argument("--tz", default="UTC", metavar="ZONE",
                     help="the IANA time zone the expression is read in, e.g. Europe/Paris (default "
                          "UTC); across a daylight saving change a skipped time runs when the clocks "
                          "jump, a repeated one runs once")
    add.add_argument("--top", type=int, default=10, metavar="N", help="statements to optimize (default 10)")
    add.add_argument("--min-calls", type=int, default=1, metavar="C", help="as for `afs batch`")
    add.add_argument("--min-mean-ms", type=float, default=0.0, metavar="M", help="as for `afs batch`")
    add.add_argument("--recent-days", type=float, default=7.0, metavar="D",
                     help="a statement optimized within D days, with no schema change since, is not "
                          "run again (default 7)")
    add.add_argument("--provider", choices=("auto", "heuristic", "gemini"), default="auto",
                     help="who thinks (as for afs optimize)")
    add.add_argument("--runs", type=int, help="measured runs per suite query and side (default: AFS_RUNS)")
    add.add_argument("--since", metavar="DURATION",
                     help="each run ranks by what ran in the last DURATION (e.g. 24h for a nightly run: "
                          "the counters minus those the previous run stored); default: since the reset")
    sub(actions, "list", "the schedules: next run, last run, its status and batch id", cmd_schedule_list)
    remove = sub(actions, "remove", "delete a schedule (its batches stay in the store)", cmd_schedule_remove)
    remove.add_argument("id", help="the schedule id (see `afs schedule list`)")
# -- applying a winner: afs apply / audit / rollback (afs.apply) ---------------------------
async def _apply_target(args: argparse.Namespace, settings: Settings, store: Any, task_id: str) -> str:
    """--dsn, else the task's own database (its DSN resolved), else its database in the sandbox."""
    from afs.apply.resolve import apply_target

    task = await store.get(task_id)
    return apply_target(settings, dsn=args.dsn, task_dsn=task.dsn, source=task.source)


async def _approve(args: argparse.Namespace, question: str) -> str | None:
    """The approver's name once approved; None when the person says no. No terminal, no --yes: exit 2."""
    import getpass

    approver = args.approver or getpass.getuser()
    if args.yes:
        return str(approver)
    if not sys.stdin.isatty():
        raise InputError("approval needed and there is no terminal to ask: pass --yes "
                         "(and --approver NAME) to approve from a script")
    print(f"{question} [y/N] ", end="", flush=True)
    answer = await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
    return str(approver) if answer.strip().lower() in ("y", "yes") else None


async def cmd_apply(args: argparse.Namespace, settings: Settings) -> int:
    """Show the winner's plan, ask for approval, apply it on the target and verify it."""
    from afs.apply import apply_winner, load_plan, render_plan
    from afs.apply import audit as apply_audit
    from afs.apply.run import prepare_apply

    async with _open_task_store(settings) as store:
        plan = await load_plan(store, args.task)
        target = await _apply_target(args, settings, store, args.task)
        if plan.applicable:  # the exact statements on this target (partitions), checked against it
            plan = await prepare_apply(store, plan, target, args.approver or "-")
        if not args.json:
            print(render_plan(plan))
            print(f"target: {scrub(target)}")
        if plan.tier == "T3":
            emit(args, {"plan": plan.public(), "applied": False},
                 f"not applied: {plan.kind} is never applied by afs apply")
            return EXIT_OK if plan.kind == "partitioning" else EXIT_USAGE
        if not plan.applicable:
            emit(args, {"plan": plan.public(), "applied": False},
                 "nothing applied: nothing to change on the database")
            return EXIT_OK
        approver = await _approve(args, f"apply {len(plan.steps)} statement(s) to {scrub(target)}?")
        if approver is None:
            await apply_audit.record(store, task_id=plan.task_id, action="apply",
                                     approver=args.approver or "-", target=target, tier=plan.tier,
                                     sql=[s.sql for s in plan.steps],
                                     result="refused", detail="not approved at the terminal",
                                     rollback_sql=plan.rollback)
            emit(args, {"plan": plan.public(), "applied": False}, "not applied: not approved")
            return EXIT_FAILED
        row = await apply_winner(store, plan, target, approver, progress)
    progress_done()
    emit(args, {"plan": plan.public(), "applied": row["result"] == "applied", "audit": row},
         f"{row['result']}: {row['detail']} ({row['duration_s']:.2f} s; audit #{row['id']})")
    return EXIT_OK if row["result"] == "applied" else EXIT_FAILED


async def cmd_audit(args: argparse.Namespace, settings: Settings) -> int:
    from afs.apply import audit as apply_audit

    if args.limit < 1:
        raise InputError(f"--limit must be at least 1, got {args.limit}")
    async with _open_task_store(settings) as store:
        rows = await apply_audit.entries(store, args.task, args.limit)
    emit(args, rows, apply_audit.render(rows))
    return EXIT_OK


async def cmd_rollback(args: argparse.Namespace, settings: Settings) -> int:
    from afs.apply import audit as apply_audit
    from afs.apply import rollback_task
    from afs.apply.resolve import rollback_target
    from afs.errors import scrub

    async with _open_task_store(settings) as store:
        previous = await apply_audit.applied(store, args.task)
        if previous is None:
            await store.get(args.task)  # an unknown task says so
            raise InputError(f"task {args.task} has nothing applied to roll back (see `afs audit`)")
        task = await store.get(args.task)
        target = rollback_target(settings, recorded=previous["target"], dsn=args.dsn, source=task.source)
        if not args.json:
            print("\n".join(f"rollback: {sql};" for sql in previous["rollback_sql"]))
        approver = await _approve(args, f"roll back task {args.task} on {scrub(target)}?")
        if approver is None:
            emit(args, {"rolled_back": False}, "not rolled back: not approved")
            return EXIT_FAILED
        row = await rollback_task(store, args.task, target, approver, progress)
    progress_done()
    emit(args, row, f"{row['result']}: {row['detail']} ({row['duration_s']:.2f} s; audit #{row['id']})")
    return EXIT_OK if row["result"] == "rolled_back" else EXIT_FAILED


def add_apply_commands(commands: Any, sub: Any) -> None:
    """apply, audit, rollback."""
    apply = sub(commands, "apply", "apply a task's winner to the database, after approval", cmd_apply)
    apply.description = (
        "Show the winner's exact SQL, its tier, the lock it takes, the build time and storage measured in "
        "the fork; after approval build it (indexes CONCURRENTLY, one at a time, one apply per database), "
        "verify it (valid, used by the query's plan, measured read-only) and roll it back by itself if "
        "that fails. Rewrites, settings and partitioning are printed as advice, never applied.")
    apply.epilog = "example: afs apply 3f2a9c1d --yes --approver alice   (exit codes: 0 applied, 1 failed "\
                   "and rolled back or not approved, 2 refused or no terminal without --yes)"
    rollback = sub(commands, "rollback", "undo a task's applied winner with its recorded rollback",
                   cmd_rollback)
    for command, target in ((apply, "the target database (default: the task's database, its password from "
                                     "AFS_DATABASE_URL, else its sandbox database)"),
                            (rollback, "the database the winner was applied on, with its password (default: "
                                       "the audit row's database, resolved against AFS_DATABASE_URL and the "
                                       "sandbox; exit 2 when it cannot be)")):
        command.add_argument("task", help="the task id (see `afs history`)")
        command.add_argument("--dsn", metavar="DSN", help=f"{target}. {DSN_PASSWORDS}")
        command.add_argument("--yes", action="store_true", help="approve without asking (scripts)")
        command.add_argument("--approver", metavar="NAME", help="who approves (default: the OS user)")
    aud = sub(commands, "audit", "the audit log of applies and rollbacks, newest first", cmd_audit)
    aud.add_argument("--task", help="only this task")
    aud.add_argument("--limit", type=int, default=50, help="how many (default 50)")


# -- mcp ------------------------------------------------------------------------------
def cmd_mcp_serve(args: argparse.Namespace, settings: Settings) -> int:
    from afs.forks import server as mcp_server
    from afs.forks.limits import ForkLimits
    from afs.forks.provider import LocalForkProvider
    from afs.sandbox.server import SandboxServer

    token = ""
    if args.http:
        from afs.asgi import check_bind
        from afs.forks.token import ensure_token

        # a token always, loopback included: made once and kept in AFS_HOME when none is set
        token = settings.fork_server_token or ensure_token(settings.fork_server_token_file)
        check_bind(args.http, token)  # before anything starts
    else:
        # The client owns this process through its stdin; a terminal's Ctrl-C reaches the
        # whole process group, and the client still needs us to destroy its forks.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    admin_dsn = args.admin_dsn or settings.admin_dsn
    if admin_dsn is None:
        sandbox = SandboxServer(settings)
        sandbox.start()
        admin_dsn = sandbox.dsn()
    provider = LocalForkProvider(admin_dsn, limits=ForkLimits.from_settings(settings),
                                 public_address=args.public_address, spares=settings.fork_spares)
    for source in args.register:
        trio.run(provider.register_source, source, "registered")
    if args.http:
        async def serve_http() -> None:
            async with trio.open_nursery() as nursery:
                urls = await nursery.start(mcp_server.serve_http, provider, settings.fork_ttl_seconds,
                                           args.http, token, settings.fork_gc_interval_s)
                where = ("AFS_FORK_SERVER_TOKEN" if settings.fork_server_token
                         else f"{settings.fork_server_token_file}, which AFS reads on this machine; "
                              "elsewhere set AFS_FORK_SERVER_TOKEN to it")
                print(f"afs mcp serve: streamable HTTP on {', '.join(urls)}, bearer token in {where}; "
                      "Ctrl-C stops it", file=sys.stderr, flush=True)

        try:
            trio.run(serve_http)
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED
        return EXIT_OK
    mcp_server.run(provider, settings.fork_ttl_seconds, settings.fork_gc_interval_s)
    return EXIT_OK


# -- parser --------------------------------------------------------------------------
def _size(text: str) -> int:
    from afs.config import parse_cow_size

    try:
        return parse_cow_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="afs",
        description="Agentic Fork Squad: make slow PostgreSQL queries fast by experiment, "
                    "in disposable forks of the database.",
        epilog="State lives in $AFS_HOME (default ~/.afs). Exit codes: 0 ok, 1 failed, "
               "2 bad input, 130 interrupted.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def sub(group: Any, name: str, help_text: str, handler: Any, json_flag: bool = True) -> Any:
        command = group.add_parser(name, help=help_text, description=help_text)
        command.set_defaults(handler=handler)
        if json_flag:
            command.add_argument("--json", action="store_true", help="print one JSON document")
        return command

    scales = ("small", "demo", "large")
    sandbox = commands.add_parser("sandbox", help="the embedded PostgreSQL sandbox and its demo data",
                                  description="The embedded PostgreSQL 18 sandbox.")
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
    workload.add_argument("--duration", type=float, default=60.0, metavar="S",
                          help="seconds to run (default: 60)")
    workload.add_argument("--clients", type=int, default=4, metavar="N",
                          help="concurrent connections (default: 4)")
    workload.add_argument("--seed", type=int, default=1, help="seed of the values drawn (default: 1)")
    workload.add_argument("--reset", action="store_true",
                          help="forget the demo database's pg_stat_statements entries first")
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

    fork = commands.add_parser("fork", help="disposable forks of a database",
                               description="Forks are made and destroyed through the MCP fork server.")
    fork_cmds = fork.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = sub(fork_cmds, "create", "fork a database", cmd_fork_create)
    create.add_argument("--from", dest="source", metavar="DB",
                        help="source database in the sandbox (default: the demo database, "
                             "or the configured target once imported)")
    create.add_argument("--name", help="fork name (default: generated, afs-fork-…)")
    create.add_argument("--ttl", type=int, metavar="SECONDS",
                        help="collect the fork after this many seconds (default: 3600)")
    sub(fork_cmds, "list", "list forks", cmd_fork_list)
    destroy = sub(fork_cmds, "destroy", "destroy a fork (succeeds if it is gone already)",
                  cmd_fork_destroy)
    destroy.add_argument("name")
    sub(fork_cmds, "gc", "destroy expired forks and forks whose owner process is gone", cmd_fork_gc)
    psql = sub(fork_cmds, "psql", "open psql in a fork, as the fork's own role (its password in "
               "PGPASSWORD, not on psql's command line)", cmd_fork_psql, json_flag=False)
    psql.add_argument("name")
    psql.add_argument("--dsn", action="store_true", help="print the fork's DSN instead")
    sub(fork_cmds, "roundtrip", "sandbox up, then fork, write, check isolation, destroy",
        cmd_fork_roundtrip)

    opt = sub(commands, "optimize", "find out, in forks, how to make a query faster", cmd_optimize)
    opt.description = ("Route the query to a squad of agents; each forks the database, analyses "
                       "the plan, proposes a change, checks it is safe and measures it with a "
                       "four-query suite. A consensus ranks the measured proposals. Nothing is "
                       "applied to your database.")
    opt.epilog = ("example: afs optimize --query \"SELECT o.id FROM orders o WHERE o.user_id = 4242 "
                  "ORDER BY o.created_at DESC\"   (exit codes: 0 completed or no improvement, "
                  "1 failed, 2 bad input)")
    given = opt.add_mutually_exclusive_group(required=True)
    given.add_argument("--query", metavar="SQL", help="one read-only SELECT; - reads it from standard input")
    given.add_argument("--file", "-f", metavar="FILE",
                       help="read the query from FILE (UTF-8), as psql -f does")
    opt.add_argument("--dsn", metavar="DSN",
                     help="the database (its copy in the sandbox, see `afs sandbox import`; "
                          "with another fork server (AFS_FORK_SERVER_COMMAND), the database "
                          "registered there, and no sandbox); default: AFS_DATABASE_URL or the PG* "
                          "variables, else the sandbox's demo database. "
                          + DSN_PASSWORDS)
    add_libpq_flags(opt)
    opt.add_argument("--priority", choices=("high", "normal", "low"), default="normal",
                     help="high assigns all three agents")
    opt.add_argument("--type", choices=("query_optimization", "schema_improvement",
                                        "index_recommendation"), default="query_optimization")
    opt.add_argument("--provider", choices=("auto", "heuristic", "gemini"), default="auto",
                     help="who thinks: Gemini models, offline strategists, or auto "
                          "(Gemini when credentials are set)")
    opt.add_argument("--weights", metavar="W",
                     help="consensus weights for this task, e.g. performance=0.6,storage=0.2,"
                          "complexity=0.1,risk=0.1 (must sum to 1; default: routing_rules.yaml)")
    opt.add_argument("--runs", type=int,
                     help="measured runs per suite query and side, at most: measuring stops earlier"
                          " once the verdict is certain (default: AFS_RUNS or 5)")

    opt.add_argument("--server", metavar="URL",
                     help="submit to `afs serve` at URL (e.g. http://127.0.0.1:8470) instead of "
                          "running here")
    add_service_commands(commands, sub)
    add_batch_command(commands, sub)
    add_schedule_commands(commands, sub)
    add_apply_commands(commands, sub)

    mcp = commands.add_parser("mcp", help="the MCP fork server")
    mcp_cmds = mcp.add_subparsers(dest="action", metavar="ACTION", required=True)
    serve = sub(mcp_cmds, "serve", "serve service_list/get/fork/delete over stdio (or --http)",
                cmd_mcp_serve,
                json_flag=False)
    serve.add_argument("--admin-dsn", metavar="DSN",
                       help="superuser DSN of the server to fork on (default: AFS_ADMIN_DSN, else the "
                            "sandbox). " + DSN_PASSWORDS)
    serve.add_argument("--http", metavar="HOST:PORT",
                       help="serve over MCP's streamable HTTP transport at http://HOST:PORT/mcp, for "
                            "workers on other machines (they set AFS_FORK_SERVER_URL and "
                            "AFS_FORK_SERVER_TOKEN); every request needs the bearer token, loopback "
                            "too: AFS_FORK_SERVER_TOKEN, else one made once and kept in "
                            "$AFS_HOME/fork-server.token (mode 0600)")
    serve.add_argument("--register", action="append", default=[], metavar="DB",
                       help="make database DB forkable first (refreshes its template); repeatable")
    serve.add_argument("--public-address", metavar="HOST[:PORT]",
                       help="host and port clients reach the server at, for the fork DSNs "
                            "(default: those of the admin DSN)")
    return parser


def _reader_left() -> int:
    """The reader of our output went away (`afs show T | head`): stop quietly, like cat."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())  # the interpreter's final flush must not fail again
    return 128 + signal.SIGPIPE


def _actions(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Iterator[argparse.Action]:
    """The arguments of `parser` and of the subcommands `args` chose, recursively."""
    for action in parser._actions:  # argparse keeps them there; it has no public walk
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(str(getattr(args, action.dest, "")))
            if chosen is not None:
                yield from _actions(chosen, args)
        else:
            yield action


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse an argument that is not UTF-8 text (InputError, exit 2), and say where a
    password given in a DSN option is better kept.

    Python hands an argument's undecodable bytes over as lone surrogates (U+DC80-U+DCFF);
    nothing downstream (SQL, a DSN, a name in the store) can carry them.
    """
    names: dict[str, str] = {}
    dsn_options = set()
    for action in _actions(parser, args):
        names[action.dest] = max(action.option_strings, key=len, default=action.dest)
        if action.metavar == "DSN":
            dsn_options.add(action.dest)
    for dest, value in vars(args).items():
        for text in value if isinstance(value, list) else [value]:
            if not isinstance(text, str):
                continue
            at = next((i for i, c in enumerate(text) if "\ud800" <= c <= "\udfff"), None)
            if at is not None:
                code = ord(text[at])
                what = (f"byte 0x{code - 0xDC00:02X}" if 0xDC80 <= code <= 0xDCFF
                        else f"a lone surrogate U+{code:04X}")
                raise InputError(f"{names.get(dest, dest)} is not valid UTF-8 text ({what} at character "
                                 f"{at + 1}): give it as UTF-8")
            if dest in dsn_options and _has_password(text):
                print(f"afs: note: the password in {names[dest]} is visible to every local user (ps). "
                      + DSN_PASSWORDS, file=sys.stderr)


def _has_password(dsn: str) -> bool:
    from psycopg import conninfo

    try:
        return "password" in conninfo.conninfo_to_dict(dsn)
    except Exception:  # not a connection string: the command says so itself
        return False


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        check_arguments(parser, args)
        settings = load_settings()
        afs_log.configure(settings.log_dir, verbose=args.verbose)
        handler: Callable[[argparse.Namespace, Settings], Awaitable[int]] = args.handler
        if args.command == "mcp":  # sync: it runs its own event loop (anyio on trio)
            return cmd_mcp_serve(args, settings)
        exit_code: int = trio.run(run_interruptible, handler, args, settings)
        return exit_code
    except BaseExceptionGroup as group:
        leaf = single_leaf(group)
        if isinstance(leaf, AfsError):
            return _failed(args, str(leaf), leaf.exit_code, type(leaf).__name__)
        if isinstance(leaf, BrokenPipeError):
            return _reader_left()
        raise
    except BrokenPipeError:
        return _reader_left()
    except AfsError as exc:
        return _failed(args, str(exc), exc.exit_code, type(exc).__name__)
    except KeyboardInterrupt:
        return _failed(args, "interrupted", EXIT_INTERRUPTED, "Interrupted", prefix="afs: ")


def _failed(args: argparse.Namespace, message: str, code: int, kind: str,
            prefix: str = "afs: error: ") -> int:
    """Say why on stderr; with --json, also as JSON on stdout, where a script reads: {"error",
    "code" (the exit code), "kind" (the error's class)}."""
    progress_done()
    print(prefix + message, file=sys.stderr)
    if getattr(args, "json", False):
        with contextlib.suppress(BrokenPipeError):
            print(json.dumps({"error": message, "code": code, "kind": kind}), flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
