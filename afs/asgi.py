"""What the HTTP servers share (`afs serve`, the fork server over streamable HTTP):
the bearer-token guard and the rule that only loopback may go without a token."""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.responses import JSONResponse

from afs.errors import ConfigError


def require_token(app: Any, token: str) -> Callable[..., Awaitable[None]]:
    """ASGI middleware: `Authorization: Bearer <token>` on every request but /healthz."""
    expected = f"Bearer {token}".encode()

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] != "/healthz":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, expected):
                response = JSONResponse({"error": "a bearer token is required (Authorization: Bearer …)",
                                         "field": "Authorization"}, status_code=401)
                await response(scope, receive, send)
                return
        await app(scope, receive, send)
    return guarded


def check_bind(bind: str, token: str | None) -> tuple[str, int]:
    """HOST:PORT; a non-loopback address without a token is refused (ConfigError)."""
    host, sep, port_text = bind.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ConfigError(f"--bind: expected HOST:PORT, got {bind!r}")
    host = host.strip("[]")
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback and not token:
        raise ConfigError(f"refusing to serve on {host} without a token: set AFS_SERVICE_TOKEN "
                          "(clients send it as Authorization: Bearer …), or bind to 127.0.0.1")
    return host, int(port_text)
