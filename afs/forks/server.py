"""`afs mcp serve`: the fork provider behind an MCP server (stdio, under trio), or over
MCP's streamable HTTP transport (`--http ADDR`, hypercorn under trio, bearer token) for
workers on other machines.

Tool names follow the Tiger Cloud MCP server where it has one (service_list,
service_get, service_fork) and add service_delete. Errors come back as MCP tool
errors (`is_error`), with the message a person can act on.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

import anyio
import structlog
import trio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from afs.errors import AfsError
from afs.forks.provider import LocalForkProvider

P = ParamSpec("P")
R = TypeVar("R")

log = structlog.get_logger(__name__)

INSTRUCTIONS = (
    "AFS fork provider. Forks are disposable copies of a source database, each with its own"
    " login role. Fork with service_fork, always delete with service_delete when done."
)


def reported(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """Turn AFS errors into MCP tool errors that name their class: "InputError: …"."""

    @functools.wraps(fn)
    async def tool(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(*args, **kwargs)
        except AfsError as exc:
            raise ToolError(f"{type(exc).__name__}: {exc}") from exc

    return tool


def build_server(provider: LocalForkProvider, default_ttl_seconds: int = 3600) -> MCPServer:
    server = MCPServer("afs-forks", instructions=INSTRUCTIONS, version="0.1.0")

    @server.tool()
    @reported
    async def service_list() -> dict[str, Any]:
        """List the source databases that can be forked and the forks that exist."""
        return await provider.list_services()

    @server.tool()
    @reported
    async def service_get(service_id: str) -> dict[str, Any]:
        """Describe one source database or fork (DSN, parent, TTL, size)."""
        return await provider.get_service(service_id)

    @server.tool()
    @reported
    async def service_fork(
        service_id: str,
        name: str | None = None,
        ttl_seconds: int | None = None,
        owner_pid: int | None = None,
    ) -> dict[str, Any]:
        """Fork a source database or a fork. Returns name, dsn (of the fork's own role),
        parent, created_at, ttl_seconds. `owner_pid`: the fork is collected when that
        process on this host is gone."""
        fork = await provider.fork(
            service_id, name=name, ttl_seconds=default_ttl_seconds if ttl_seconds is None else ttl_seconds,
            owner_pid=owner_pid,
        )
        log.info("fork_created", fork=fork.name, parent=fork.parent)
        return fork.public()

    @server.tool()
    @reported
    async def service_delete(service_id: str) -> dict[str, Any]:
        """Destroy a fork (database, role, catalog entry). Deleting a missing fork succeeds."""
        result = await provider.delete(service_id)
        log.info("fork_deleted", fork=service_id, existed=result["deleted"])
        return result

    return server


async def serve_stdio(provider: LocalForkProvider, default_ttl_seconds: int) -> None:
    """Collect garbage, then serve MCP over stdin/stdout until the client goes away."""
    removed = await provider.gc()
    if removed:
        log.info("forks_collected", forks=removed)
    await build_server(provider, default_ttl_seconds).run_stdio_async()


def run(provider: LocalForkProvider, default_ttl_seconds: int) -> None:
    anyio.run(serve_stdio, provider, default_ttl_seconds, backend="trio")


async def serve_http(provider: LocalForkProvider, default_ttl_seconds: int, bind: str,
                     token: str | None,
                     task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve MCP over streamable HTTP at `bind` (path /mcp) until cancelled; reports the URLs.

    Off loopback a token is required (`afs.asgi.check_bind`); clients send it as a bearer token.
    """
    import hypercorn.trio
    from hypercorn.config import Config

    from afs.asgi import check_bind, require_token

    host, _ = check_bind(bind, token)
    removed = await provider.gc()
    if removed:
        log.info("forks_collected", forks=removed)
    app: Any = build_server(provider, default_ttl_seconds).streamable_http_app(host=host)
    config = Config()
    config.bind = [bind]
    config.accesslog = None
    config.errorlog = None
    never = trio.Event()
    async with trio.open_nursery() as nursery:
        urls: list[str] = await nursery.start(functools.partial(
            hypercorn.trio.serve, require_token(app, token) if token else app, config,
            shutdown_trigger=never.wait))
        task_status.started([f"{url}/mcp" for url in urls])
