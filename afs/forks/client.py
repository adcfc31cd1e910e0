"""The MCP client side of forks.

    async with open_fork_client(settings) as client:        # one MCP session
        async with client.open_fork("afs_demo", name=...) as fork:
            ... fork.dsn ...
        # the fork is gone here: on success, error and cancellation

`open_fork(settings, source)` does both for a single fork. The server command is
configurable (`fork_server_command`), so another MCP fork server that speaks the
same tools can stand in. (Commands reach the sandbox's fork server through
`afs.sandbox.forks.open_forks`, which runs it in their own process unless another
fork server is configured.)
"""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import structlog
import trio
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp_types import CallToolResult, TextContent

from afs.config import Settings
from afs.errors import (
    AfsError,
    ConfigError,
    DatabaseError,
    ForkBusyError,
    ForkError,
    ForkServerError,
    InputError,
    UnknownServiceError,
    single_leaf,
)
from afs.forks.naming import random_fork_name
from afs.forks.token import read_token

log = structlog.get_logger(__name__)
_UNKNOWN = re.compile(r"unknown service '([^']*)'")

CREATE_TIMEOUT_S = 30  # the seed's fork creation timeout
CLEANUP_TIMEOUT_S = 30
CALL_TIMEOUT_S = 120


@dataclass(frozen=True)
class Fork:
    name: str
    dsn: str
    parent: str
    created_at: str
    ttl_seconds: int

    @classmethod
    def from_result(cls, data: dict[str, Any]) -> Fork:
        return cls(
            name=data["name"], dsn=data["dsn"], parent=data["parent"],
            created_at=data["created_at"], ttl_seconds=int(data["ttl_seconds"]),
        )

    def public(self) -> dict[str, Any]:
        return {"name": self.name, "dsn": self.dsn, "parent": self.parent,
                "created_at": self.created_at, "ttl_seconds": self.ttl_seconds}


_KINDS: dict[str, type[AfsError]] = {
    cls.__name__: cls
    for cls in (InputError, ForkBusyError, ForkError, ForkServerError, DatabaseError, AfsError)
}
_REPORTED = re.compile(r"(\w+): (.*)", re.DOTALL)


def _error_from_text(text: str) -> AfsError:
    """Map an MCP tool error ("Error executing tool t: InputError: …") back onto the tree."""
    _, _, detail = text.partition("Error executing tool ")
    _, _, detail = detail.partition(": ")
    if "validation error" in detail:
        return InputError(detail)
    match = _REPORTED.match(detail)
    if match is None:
        return ForkError(text)
    kind, message = match.groups()
    unknown = _UNKNOWN.search(message)
    if kind == "UnknownServiceError" and unknown:
        return UnknownServiceError(unknown.group(1), message=message)
    return _KINDS.get(kind, ForkError)(message)


class ForkClient:
    """An MCP session with a fork server."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self._fork_arguments: frozenset[str] | None = None

    async def fork_arguments(self) -> frozenset[str]:
        """The arguments the server's service_fork takes (another server may take fewer)."""
        if self._fork_arguments is None:
            try:
                tools = await self._client.list_tools()
            except Exception as exc:  # the MCP layer: protocol errors, dead server
                raise ForkServerError(f"fork server failed on list_tools: {exc}") from exc
            schema = next((t.input_schema for t in tools.tools if t.name == "service_fork"), {})
            self._fork_arguments = frozenset((schema or {}).get("properties", {}))
        return self._fork_arguments

    async def call(self, tool: str, **arguments: Any) -> Any:
        args = {k: v for k, v in arguments.items() if v is not None}
        try:
            result: CallToolResult = await self._client.call_tool(
                tool, args, read_timeout_seconds=CALL_TIMEOUT_S
            )
        except AfsError:
            raise
        except Exception as exc:  # the MCP layer: protocol errors, dead server
            raise ForkServerError(f"fork server failed on {tool}: {exc}") from exc
        text = "\n".join(b.text for b in result.content if isinstance(b, TextContent))
        if result.is_error:
            raise _error_from_text(text or f"{tool} failed")
        if result.structured_content is not None:
            data = result.structured_content
            return data.get("result", data) if isinstance(data, dict) and set(data) == {"result"} else data
        return json.loads(text) if text else None

    async def list_services(self) -> dict[str, Any]:
        data: dict[str, Any] = await self.call("service_list")
        return data

    async def get(self, service_id: str) -> dict[str, Any]:
        data: dict[str, Any] = await self.call("service_get", service_id=service_id)
        return data

    async def create(self, source: str, name: str | None = None, ttl_seconds: int | None = None,
                     owner_pid: int | None = None) -> Fork:
        """Fork `source`. `owner_pid` (with this host's name) goes to servers that take it."""
        owner: dict[str, Any] = {}
        if owner_pid is not None:
            accepted = await self.fork_arguments()
            owner = {k: v for k, v in (("owner_pid", owner_pid), ("owner_host", socket.gethostname()))
                     if k in accepted}
        data = await self.call("service_fork", service_id=source, name=name,
                               ttl_seconds=ttl_seconds, **owner)
        return Fork.from_result(data)

    async def destroy(self, name: str) -> bool:
        data = await self.call("service_delete", service_id=name)
        return bool(data["deleted"])

    @asynccontextmanager
    async def open_fork(self, source: str, name: str | None = None, ttl_seconds: int | None = None,
                        create_timeout_s: float = CREATE_TIMEOUT_S) -> AsyncIterator[Fork]:
        """Create a fork owned by this process; destroy it on exit, whatever happens.

        Creation raises trio.TooSlowError after `create_timeout_s` (the fork is then
        destroyed if the server finished it anyway).
        """
        with trio.fail_after(create_timeout_s):
            fork = await self._create_or_clean_up(source, name or random_fork_name("client"),
                                                  ttl_seconds)
        try:
            yield fork
        finally:
            await self._destroy_shielded(fork.name)

    async def _create_or_clean_up(self, source: str, name: str, ttl_seconds: int | None) -> Fork:
        try:
            return await self.create(source, name=name, ttl_seconds=ttl_seconds,
                                     owner_pid=os.getpid())
        except (trio.Cancelled, trio.TooSlowError, ForkServerError):
            # The server may have finished the fork after we stopped waiting for it.
            await self._destroy_shielded(name)
            raise

    async def _destroy_shielded(self, name: str) -> None:
        with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_TIMEOUT_S) as scope:
            try:
                await self.destroy(name)
            except AfsError as exc:
                log.warning("fork_destroy_failed", fork=name, error=str(exc))
                return
        if scope.cancelled_caught:
            log.warning("fork_destroy_timed_out", fork=name, timeout_s=CLEANUP_TIMEOUT_S)


def server_parameters(settings: Settings) -> StdioServerParameters:
    command, *args = settings.fork_server_command
    env = dict(os.environ)
    env["AFS_HOME"] = str(settings.home)
    env["AFS_FORK_SPARES"] = str(settings.fork_spares)  # these settings', not the file's alone
    return StdioServerParameters(command=command, args=args, env=env)


@asynccontextmanager
async def open_fork_client(settings: Settings, server: Any = None) -> AsyncIterator[ForkClient]:
    """Start (or connect to) the fork server and open an MCP session with it.

    `server` defaults to the configured fork server: over streamable HTTP when
    `fork_server_url` is set (AFS_FORK_SERVER_URL, with AFS_FORK_SERVER_TOKEN, else the token
    a fork server on this machine keeps in AFS_HOME), else the stdio command; tests may pass
    an in-process `MCPServer`.
    """
    if server is None and settings.fork_server_url:  # a fork server on another machine
        url = settings.fork_server_url
        token = settings.fork_server_token or read_token(settings.fork_server_token_file)
        if token is None:
            raise ConfigError(f"the fork server at {url} needs its token: set AFS_FORK_SERVER_TOKEN "
                              "(the server keeps it in its $AFS_HOME/fork-server.token)")
        async with _open_http_transport(url, token) as target, _session(settings, target) as client:
            yield client
        return
    async with _session(settings, server if server is not None else server_parameters(settings)) as client:
        yield client


@asynccontextmanager
async def _open_http_transport(url: str, token: str) -> AsyncIterator[Any]:
    from mcp.client.streamable_http import (  # type: ignore[attr-defined]  # imported there, not in __all__
        create_mcp_http_client,
        streamable_http_client,
    )

    async with create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as http:  # ours to close
        yield streamable_http_client(url, http_client=http)


@asynccontextmanager
async def _session(settings: Settings, target: Any) -> AsyncIterator[ForkClient]:
    from mcp.shared.exceptions import MCPError

    try:
        async with Client(target) as client:
            yield ForkClient(client)
    except BaseExceptionGroup as group:
        # The MCP client runs task groups: unwrap a lone error so callers see it as is.
        leaf = single_leaf(group)
        if leaf is group:
            raise
        if isinstance(leaf, MCPError):
            raise ForkServerError(f"the fork server refused the session: {leaf}") from None
        raise leaf from None
    except MCPError as exc:  # e.g. a fork server over HTTP that wants another token
        raise ForkServerError(f"the fork server refused the session: {exc}") from exc
    except OSError as exc:
        raise ForkServerError(
            f"cannot start the fork server {' '.join(settings.fork_server_command)!r}: {exc}"
        ) from exc


@asynccontextmanager
async def open_fork(settings: Settings, source: str, name: str | None = None,
                    ttl_seconds: int | None = None) -> AsyncIterator[Fork]:
    """One fork over its own MCP session; destroyed on exit."""
    async with open_fork_client(settings) as client, client.open_fork(source, name, ttl_seconds) as fork:
        yield fork
