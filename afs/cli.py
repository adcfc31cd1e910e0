"""The `afs` command line.

    afs optimize --query SQL                    measure how to make a query faster, in forks
    afs sandbox up|status|down|reset|import     the embedded PostgreSQL and its demo data
    afs fork create|list|destroy|gc|psql|roundtrip   disposable forks, through the MCP server
    afs mcp serve                               the fork provider as an MCP server (stdio)

Exit codes: 0 success, 1 failure, 2 bad input or usage, 130 interrupted.
Results go to stdout (`--json` for scripts); progress and logs go to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import trio

from afs import log as afs_log
from afs.config import Settings, default_fork_server_command, load_settings
from afs.errors import AfsError, ConfigError, InputError, single_leaf

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


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
                info["forks"] = await conn.fetchval("SELECT count(*) FROM afs.forks")
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
            f"forks: {info['forks'] or 0}, made by {method}{image}")


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
    report = await import_database(server, source, args.name, args.schema_only, progress)
    progress_done()
    data = {"database": report.database, "origin": report.origin,
            "seconds": round(report.seconds, 1), "schema_only": report.schema_only,
            "dsn": server.dsn(report.database), "skipped": list(report.skipped)}
    skipped = "".join(f"\nskipped (this server refused it): {s}" for s in report.skipped)
    emit(args, data, f"imported {report.origin} as {report.database} in {report.seconds:.1f} s;"
                     f" fork it with: afs fork create --from {report.database}{skipped}")
    return EXIT_OK


# -- forks ---------------------------------------------------------------------------
async def imported_copy(client: Any, dsn: str) -> str | None:
    """The sandbox database imported from `dsn` (matched by host, port and name), if any."""
    from afs.sandbox.importer import origin_of

    origin = origin_of(dsn)
    for source in (await client.list_services())["sources"]:
        if source["origin"] == origin:
            return str(source["name"])
    return None


async def _default_source(client: Any, settings: Settings) -> str:
    """The configured target once imported, else the demo database."""
    if settings.target_dsn is not None:
        return await imported_copy(client, settings.target_dsn) or settings.demo_database
    return settings.demo_database


def _fork_text(fork: dict[str, Any]) -> str:
    return (f"{fork['name']}  parent={fork['parent']}  ttl={fork['ttl_seconds']}s"
            f"  created={fork['created_at']}\n  dsn: {fork['dsn']}")


async def cmd_fork_create(args: argparse.Namespace, settings: Settings) -> int:
    from afs.forks.client import open_fork_client

    if args.ttl is not None and args.ttl <= 0:
        raise InputError(f"--ttl must be a positive number of seconds, got {args.ttl}")
    async with open_fork_client(settings) as client:
        source = args.source or await _default_source(client, settings)
        fork = await client.create(source, name=args.name,
                                   ttl_seconds=args.ttl or settings.fork_ttl_seconds)
    emit(args, fork.public(), _fork_text(fork.public()))
    return EXIT_OK


async def cmd_fork_list(args: argparse.Namespace, settings: Settings) -> int:
    from afs.forks.client import open_fork_client

    async with open_fork_client(settings) as client:
        services = await client.list_services()
    forks = [{k: f[k] for k in ("name", "dsn", "parent", "created_at", "ttl_seconds")}
             for f in services["forks"]]
    emit(args, forks, "\n".join(_fork_text(f) for f in forks) or "no forks")
    return EXIT_OK


async def cmd_fork_destroy(args: argparse.Namespace, settings: Settings) -> int:
    from afs.forks.client import open_fork_client

    async with open_fork_client(settings) as client:
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


async def cmd_fork_psql(args: argparse.Namespace, settings: Settings) -> int:
    from afs.forks.client import open_fork_client
    from afs.sandbox.server import pg_binary

    async with open_fork_client(settings) as client:
        info = await client.get(args.name)
    if info.get("kind") != "fork":
        raise InputError(f"{args.name!r} is not a fork")
    if args.dsn:
        print(info["dsn"])
        return EXIT_OK
    psql = pg_binary("psql")
    os.execv(psql, [psql, info["dsn"]])


async def cmd_fork_roundtrip(args: argparse.Namespace, settings: Settings) -> int:
    """Sandbox up, then one fork through MCP: write in it, check the source, destroy it."""
    from afs.db import open_connection
    from afs.forks.client import open_fork_client
    from afs.sandbox.seeding import ensure_demo
    from afs.sandbox.server import SandboxServer

    server = SandboxServer(settings)
    progress("starting the sandbox server")
    await trio.to_thread.run_sync(server.start)
    await ensure_demo(settings, server, settings.scale, progress)
    progress("forking the demo database through the MCP server")
    started = time.monotonic()
    async with open_fork_client(settings) as client:
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
@asynccontextmanager
async def open_squad(provider: str, settings: Settings, env: Mapping[str, str]) -> AsyncIterator[Any]:
    """The brains: `heuristic` (offline strategists), `gemini`, or `auto` (Gemini if credentials are set)."""
    from afs.brains import Squad, StrategistBrain

    if provider != "heuristic":
        from afs.brains.gemini.client import NO_CREDENTIALS, gemini_credentials

        credentials = gemini_credentials(env)
        if credentials is not None:
            from afs.brains.gemini.brain import open_gemini_squad

            async with open_gemini_squad(settings, credentials, env) as squad:
                yield squad
            return
        if provider == "gemini":
            raise ConfigError(f"--provider gemini: {NO_CREDENTIALS}")
    brain = StrategistBrain()
    note = ("no Gemini credentials: the offline strategists ran" if provider == "auto"
            else "offline strategists, as asked")
    yield Squad(brain_for=lambda _agent: brain, provider="heuristic", note=note)


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


async def _optimize_source(client: Any, settings: Settings, dsn: str | None) -> str:
    if dsn is None:
        return settings.demo_database
    source = await imported_copy(client, dsn)
    if source is None:
        from afs.sandbox.importer import origin_of

        raise InputError(f"{origin_of(dsn)} is not in the sandbox yet: copy it first with"
                         f" `afs sandbox import --from DSN` (forks are made from that copy)")
    return source


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


async def cmd_optimize(args: argparse.Namespace, settings: Settings) -> int:
    from afs import report
    from afs.display import LiveDisplay
    from afs.events import Emitter, log_sink
    from afs.forks.client import open_fork_client
    from afs.optimize import TaskRequest, new_task_id, optimize, read_input
    from afs.router import load_rules
    from afs.sandbox.seeding import ensure_demo
    from afs.sandbox.server import SandboxServer

    runs = settings.runs if args.runs is None else args.runs
    if runs < 1:
        raise InputError(f"--runs must be at least 1, got {runs}")
    await trio.to_thread.run_sync(read_input, args.query)  # bad input: refused before anything starts
    weights = parse_weights(args.weights)
    rules = load_rules(settings.routing_rules)
    async with open_squad(args.provider, settings, os.environ) as squad:
        server = SandboxServer(settings)
        sandboxed = uses_the_sandbox(settings, args.dsn)
        if sandboxed:
            progress("starting the sandbox")
            await trio.to_thread.run_sync(server.start)
            if args.dsn is None:
                await ensure_demo(settings, server, settings.scale, progress)
        progress_done()
        request = TaskRequest(query=args.query, task_type=args.type, priority=args.priority,
                              runs=runs, weights=weights)
        display = LiveDisplay(live=None if not args.json else False)
        emitter = Emitter(new_task_id(), sinks=(log_sink, display.sink))
        async with open_fork_client(settings) as client:
            if sandboxed:
                source = await _optimize_source(client, settings, args.dsn)
                source_dsn = server.dsn(source)
            else:  # another fork server: read the database itself, fork it there
                source, source_dsn = await _served_source(client, args.dsn), args.dsn
            async with display.running():
                result = await optimize(settings, request, source=source,
                                        source_dsn=source_dsn, forks=client, squad=squad,
                                        rules=rules, events=emitter)
    if args.json:
        print(json.dumps(report.to_json(result), default=str))
    else:
        print(report.render_text(result))
    return EXIT_FAILED if result.status == "failed" else EXIT_OK


# -- mcp ------------------------------------------------------------------------------
def cmd_mcp_serve(args: argparse.Namespace, settings: Settings) -> int:
    from afs.forks import server as mcp_server
    from afs.forks.limits import ForkLimits
    from afs.forks.provider import LocalForkProvider
    from afs.sandbox.server import SandboxServer

    # The client owns this process through its stdin; a terminal's Ctrl-C reaches the
    # whole process group, and the client still needs us to destroy its forks.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    admin_dsn = args.admin_dsn
    if admin_dsn is None:
        sandbox = SandboxServer(settings)
        sandbox.start()
        admin_dsn = sandbox.dsn()
    provider = LocalForkProvider(admin_dsn, limits=ForkLimits.from_settings(settings),
                                 public_address=args.public_address)
    for source in args.register:
        trio.run(provider.register_source, source, "registered")
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
    refresh = sub(sandbox_cmds, "refresh", "copy a source database into its fork template again, "
                  "so new forks see what changed in it (needs no other session on it)",
                  cmd_sandbox_refresh)
    refresh.add_argument("database", nargs="?", help="the source database (default: the demo database)")
    imp = sub(sandbox_cmds, "import", "copy a database into the sandbox (pg_dump | pg_restore)",
              cmd_sandbox_import)
    imp.add_argument("--from", dest="source", metavar="DSN",
                     help="the database to copy (default: AFS_DATABASE_URL or PG* variables)")
    imp.add_argument("--as", dest="name", metavar="NAME", help="name in the sandbox")
    imp.add_argument("--schema-only", action="store_true", help="copy the schema, not the data")

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
    psql = sub(fork_cmds, "psql", "open psql in a fork, as the fork's own role", cmd_fork_psql,
               json_flag=False)
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
    opt.add_argument("--query", required=True, metavar="SQL", help="one read-only SELECT")
    opt.add_argument("--dsn", metavar="DSN",
                     help="the database (its copy in the sandbox, see `afs sandbox import`; "
                          "with another fork server (AFS_FORK_SERVER_COMMAND), the database "
                          "registered there, and no sandbox); default: the sandbox's demo database")
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

    mcp = commands.add_parser("mcp", help="the MCP fork server")
    mcp_cmds = mcp.add_subparsers(dest="action", metavar="ACTION", required=True)
    serve = sub(mcp_cmds, "serve", "serve service_list/get/fork/delete over stdio", cmd_mcp_serve,
                json_flag=False)
    serve.add_argument("--admin-dsn", metavar="DSN",
                       help="superuser DSN of the server to fork on (default: the sandbox)")
    serve.add_argument("--register", action="append", default=[], metavar="DB",
                       help="make database DB forkable first (refreshes its template); repeatable")
    serve.add_argument("--public-address", metavar="HOST[:PORT]",
                       help="host and port clients reach the server at, for the fork DSNs "
                            "(default: those of the admin DSN)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
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
            progress_done()
            print(f"afs: error: {leaf}", file=sys.stderr)
            return leaf.exit_code
        raise
    except AfsError as exc:
        progress_done()
        print(f"afs: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        progress_done()
        print("afs: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
