"""`afs mcp serve`: the fork provider behind an MCP server (stdio, under trio), or over
MCP's streamable HTTP transport (`--http ADDR`, hypercorn under trio) for workers on other
machines. Over HTTP every request needs the bearer token, loopback included: the server
hands out fork DSNs with their passwords (the token: AFS_FORK_SERVER_TOKEN, else the one
`afs.forks.token` keeps in AFS_HOME, mode 0600).

Tool names follow the Tiger Cloud MCP server where it has one (service_list,
service_get, service_fork) and add service_delete. Errors come back as MCP tool
errors (`is_error`), with the message a person can act on.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, ParamSpec, TypeVar

import anyio
import structlog
import trio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from afs.config import Settings
from afs.errors import AfsError, ConfigError
from afs.forks.provider import LocalForkProvider

P = ParamSpec("P")
R = TypeVar("R")

log = structlog.get_logger(__name__)

LIMITS_INTERVAL_S = 1.0  # how often the growth of forks is checked

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
        owner_host: str | None = None,
    ) -> dict[str, Any]:
        """Fork a source database or a fork. Returns name, dsn (of the fork's own role),
        parent, created_at, ttl_seconds. `owner_pid` on `owner_host` (default: the server's
        host): on the server's host, the fork is collected when that process is gone;
        elsewhere only the TTL applies."""
        fork = await provider.fork(
            service_id, name=name, ttl_seconds=default_ttl_seconds if ttl_seconds is None else ttl_seconds,
            owner_pid=owner_pid, owner_host=owner_host,
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


async def collect(provider: LocalForkProvider) -> None:
    """One garbage collection; what it could not remove is logged, never raised."""
    try:
        report = await provider.gc()
    except AfsError as exc:  # the server may be down for a moment: try again next round
        log.warning("fork_gc_failed", error=str(exc))
        return
    if report.removed:
        log.info("forks_collected", forks=report.removed)
    for name, reason in report.failed.items():
        log.warning("fork_not_collected", fork=name, reason=reason)


async def collect_periodically(provider: LocalForkProvider, interval_s: float) -> None:
    """Collect expired forks every `interval_s` seconds, for as long as the server runs."""
    while True:
        await trio.sleep(interval_s)
        await collect(provider)


async def enforce_limits_periodically(provider: LocalForkProvider, interval_s: float) -> None:
    """Cancel the statements of forks grown past their cap, every `interval_s` seconds."""
    while True:
        await trio.sleep(interval_s)
        try:
            over = await provider.enforce_limits()
        except AfsError as exc:
            log.warning("fork_limits_not_checked", error=str(exc))
            continue
        for name in over:
            log.warning("fork_over_its_growth_cap", fork=name,
                        max_growth_mb=provider.limits.max_growth_mb)


async def keep_spares(provider: LocalForkProvider) -> None:
    """Top up the spares each time a source is forked, for as long as the server runs
    (nothing to do with `spares` = 0); a failure is logged and tried again at the next fork."""
    if provider.spares <= 0:
        return
    while True:
        await provider.spares_wanted()
        try:
            made = await provider.top_up_spares()
        except AfsError as exc:
            log.warning("fork_spares_not_made", error=str(exc))
            continue
        if made:
            log.info("fork_spares_made", forks=made)


@asynccontextmanager
async def running(provider: LocalForkProvider, settings: Settings) -> AsyncIterator[None]:
    """A fork server's own work, around the block that serves: garbage collected once
    first, then every `settings.fork_gc_interval_s` seconds; forks past their growth cap stopped; spares
    topped up. (The stdio and HTTP servers here, and a fork server in the client's own
    process, `afs.sandbox.forks`.)"""
    await collect(provider)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(collect_periodically, provider, settings.fork_gc_interval_s)
        nursery.start_soon(enforce_limits_periodically, provider, LIMITS_INTERVAL_S)
        nursery.start_soon(keep_spares, provider)
        try:
            yield
        finally:
            nursery.cancel_scope.cancel()


async def serve_stdio(provider: LocalForkProvider, settings: Settings) -> None:
    """Collect garbage, then serve MCP over stdin/stdout until the client goes away,
    collecting expired forks every `settings.fork_gc_interval_s` seconds meanwhile (forks
    live `settings.fork_ttl_seconds` unless asked otherwise)."""
    async with running(provider, settings):
        await build_server(provider, settings.fork_ttl_seconds).run_stdio_async()


def run(provider: LocalForkProvider, settings: Settings) -> None:
    anyio.run(serve_stdio, provider, settings, backend="trio")


async def serve_http(provider: LocalForkProvider, settings: Settings, bind: str, token: str,
                     task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve MCP over streamable HTTP at `bind` (path /mcp) until cancelled; reports the URLs
    (the fork lifetime and garbage collection: `settings`, as `serve_stdio`).

    Every request must carry `token` as a bearer token (compared in constant time), on
    loopback too: any local process can reach loopback.
    """
    import hypercorn.trio
    from hypercorn.config import Config

    from afs.asgi import check_bind, require_token

    if not token:
        raise ConfigError("the fork server over HTTP needs a token (AFS_FORK_SERVER_TOKEN, or the one "
                          "afs.forks.token keeps in AFS_HOME)")
    host, _ = check_bind(bind, token)
    app: Any = build_server(provider, settings.fork_ttl_seconds).streamable_http_app(host=host)
    config = Config()
    config.bind = [bind]
    config.accesslog = None
    config.errorlog = None
    never = trio.Event()
    async with running(provider, settings), trio.open_nursery() as nursery:
        urls: list[str] = await nursery.start(functools.partial(
            hypercorn.trio.serve, require_token(app, token), config,
            shutdown_trigger=never.wait))
        task_status.started([f"{url}/mcp" for url in urls])
