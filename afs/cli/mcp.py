"""`afs mcp serve`: the fork provider as an MCP server, over stdio (a client owns the process)
or streamable HTTP (--http, with a bearer token) for workers on other machines.
"""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any

import trio

from afs.asgi import check_bind
from afs.cli.commands import DSN_PASSWORDS, add_command, add_top
from afs.cli.output import EXIT_INTERRUPTED, EXIT_OK
from afs.config import Settings
from afs.forks import server as mcp_server
from afs.forks.provider import LocalForkProvider
from afs.forks.token import ensure_token
from afs.sandbox.server import SandboxServer


def cmd_mcp_serve(args: argparse.Namespace, settings: Settings) -> int:
    token = ""
    if args.http:
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
    provider = LocalForkProvider(admin_dsn, limits=settings.fork_limits,
                                 public_address=args.public_address, spares=settings.fork_spares)
    for source in args.register:
        trio.run(provider.register_source, source, "registered")
    if args.http:
        async def serve_http() -> None:
            async with trio.open_nursery() as nursery:
                urls = await nursery.start(mcp_server.serve_http, provider, settings, args.http, token)
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
    mcp_server.run(provider, settings)
    return EXIT_OK



def add_commands(commands: Any) -> None:
    """mcp serve (run without trio.run around it: it runs its own event loop)."""
    mcp = add_top(commands, "mcp")
    mcp_cmds = mcp.add_subparsers(dest="action", metavar="ACTION", required=True)
    serve = add_command(mcp_cmds, "serve", "serve service_list/get/fork/delete over stdio (or --http)",
                        cmd_mcp_serve, json_flag=False)
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
