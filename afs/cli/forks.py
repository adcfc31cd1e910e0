"""`afs fork …`: disposable forks, made and destroyed through the MCP fork server (the
sandbox's own, in process, unless another one is configured: afs.sandbox.forks).

    afs fork create|list|destroy|gc|psql|roundtrip
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Mapping
from typing import Any

import trio
from psycopg import conninfo

from afs.cli.commands import add_command, add_top
from afs.cli.output import EXIT_FAILED, EXIT_OK, emit, progress, progress_done
from afs.cli.shared import start_sandbox
from afs.config import Settings
from afs.db import open_connection
from afs.errors import InputError
from afs.forks.provider import LocalForkProvider
from afs.sandbox.forks import open_forks
from afs.sandbox.importer import imported_copy
from afs.sandbox.seeding import ensure_demo
from afs.sandbox.server import SandboxServer, pg_binary


# -- forks ---------------------------------------------------------------------------
async def _default_source(client: Any, settings: Settings) -> str:
    """The configured target once imported, else the demo database."""
    if settings.target_dsn is not None:
        return await imported_copy(client, settings.target_dsn) or settings.demo_database
    return settings.demo_database


def _fork_text(fork: dict[str, Any]) -> str:
    return (f"{fork['name']}  parent={fork['parent']}  ttl={fork['ttl_seconds']}s"
            f"  created={fork['created_at']}\n  dsn: {fork['dsn']}")


async def cmd_fork_create(args: argparse.Namespace, settings: Settings) -> int:
    if args.ttl is not None and args.ttl <= 0:
        raise InputError(f"--ttl must be a positive number of seconds, got {args.ttl}")
    async with open_forks(settings) as client:
        source = args.source or await _default_source(client, settings)
        fork = await client.create(source, name=args.name,
                                   ttl_seconds=args.ttl or settings.fork_ttl_seconds)
    emit(args, fork.public(), _fork_text(fork.public()))
    return EXIT_OK


async def cmd_fork_list(args: argparse.Namespace, settings: Settings) -> int:
    async with open_forks(settings) as client:
        services = await client.list_services()
    forks = [{k: f[k] for k in ("name", "dsn", "parent", "created_at", "ttl_seconds")}
             for f in services["forks"]]
    emit(args, forks, "\n".join(_fork_text(f) for f in forks) or "no forks")
    return EXIT_OK


async def cmd_fork_destroy(args: argparse.Namespace, settings: Settings) -> int:
    async with open_forks(settings) as client:
        deleted = await client.destroy(args.name)
    emit(args, {"name": args.name, "deleted": deleted},
         f"destroyed {args.name}" if deleted else f"{args.name} did not exist (nothing to do)")
    return EXIT_OK


async def cmd_fork_gc(args: argparse.Namespace, settings: Settings) -> int:
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
    params = conninfo.conninfo_to_dict(dsn)
    password = params.pop("password", None)
    child = dict(env)
    if password is not None:
        child["PGPASSWORD"] = str(password)
    return [psql, conninfo.make_conninfo("", **params)], child


async def cmd_fork_psql(args: argparse.Namespace, settings: Settings) -> int:
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
    server = SandboxServer(settings)
    await start_sandbox(server)
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


# -- parser --------------------------------------------------------------------------
def add_commands(commands: Any) -> None:
    """fork create|list|destroy|gc|psql|roundtrip."""
    sub = add_command
    fork = add_top(commands, "fork", description="Forks are made and destroyed through the MCP fork server.")
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
