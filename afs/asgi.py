"""What the HTTP servers share (`afs serve`, the fork server over streamable HTTP):
the bearer-token guard and the rule that only loopback may go without a token."""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Awaitable, Callable
from http.cookies import CookieError, SimpleCookie
from typing import Any
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from afs.errors import ConfigError

COOKIE = "afs_token"
LOGIN_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>AFS: token</title></head>
<body style="font-family: sans-serif; max-width: 28rem; margin: 4rem auto">
<h1>AFS</h1><p>This server needs its token (AFS_SERVICE_TOKEN).</p>%s
<form method="post" action="/login"><input type="password" name="token" autofocus
 style="width: 100%%" aria-label="token"><p><button type="submit">Open the monitor</button></p></form>
</body></html>"""


def require_token(app: Any, token: str, *, browser_login: bool = False) -> Callable[..., Awaitable[None]]:
    """ASGI middleware: `Authorization: Bearer <token>` on every request but /healthz.

    With `browser_login` (the monitor's pages), a browser that cannot send the header
    may also send the token as the `afs_token` cookie, set by `POST /login` (form field
    `token`; HttpOnly, SameSite=Strict so another site cannot make the browser use it).
    A page asked for without it is sent to `GET /login`.
    """
    expected = f"Bearer {token}".encode()

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] == "/healthz":
            await app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if browser_login and scope["path"] == "/login":
            await _login(scope, receive, send, token)
            return
        if hmac.compare_digest(headers.get(b"authorization", b""), expected):
            await app(scope, receive, send)
            return
        if browser_login and hmac.compare_digest(_cookie(headers).encode(), token.encode()):
            await app(scope, receive, send)
            return
        response: Response
        if browser_login and b"text/html" in headers.get(b"accept", b""):
            response = RedirectResponse("/login", status_code=303)
        else:
            response = JSONResponse({"error": "a bearer token is required (Authorization: Bearer …)",
                                     "field": "Authorization"}, status_code=401)
        await response(scope, receive, send)
    return guarded


def _cookie(headers: dict[bytes, bytes]) -> str:
    jar = SimpleCookie()
    try:
        jar.load(headers.get(b"cookie", b"").decode("latin-1"))
    except CookieError:
        return ""
    morsel = jar.get(COOKIE)
    return morsel.value if morsel else ""


async def _login(scope: Any, receive: Any, send: Any, token: str) -> None:
    request = Request(scope, receive)
    response: Response
    if request.method == "POST":
        form = parse_qs((await request.body()).decode("utf-8", "replace"))
        given = (form.get("token") or [""])[0]
        if hmac.compare_digest(given.encode(), token.encode()):
            response = RedirectResponse("/", status_code=303)
            response.set_cookie(COOKIE, given, httponly=True, samesite="strict",
                                secure=scope.get("scheme") == "https")
        else:
            response = HTMLResponse(LOGIN_PAGE % "<p><strong>That is not the token.</strong></p>",
                                    status_code=401)
    else:
        response = HTMLResponse(LOGIN_PAGE % "")
    await response(scope, receive, send)


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
