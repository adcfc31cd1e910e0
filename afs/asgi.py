"""What the HTTP servers share (`afs serve`, the fork server over streamable HTTP): the
guard against requests a web page makes the user's browser send, the bearer-token guard, the
rule that only loopback may go without a token, and the reading of a JSON body.

    guard_requests   Host (DNS rebinding: 421), Origin / Sec-Fetch-Site on state-changing
                     requests (cross-site: 403), JSON bodies only (415), the body size (413)
    require_token    Authorization: Bearer (401); names the principal of the request
    check_bind       a non-loopback address needs a token
    parse_json       a body as JSON, UTF-8 with no lone surrogates or NULs (BodyError naming
                     the field)

A browser lets any page it shows send a "simple" request to any address: a POST of
text/plain, a form or no body type at all, with no preflight and the user's cookies. With
JSON required, a page needs a CORS preflight, which this server never answers; a foreign
Origin is refused besides (a browser always sends one on a cross-origin POST or DELETE). A
page may also rebind its own name to 127.0.0.1 and then read every answer as same-origin:
its requests carry its own name as Host, which is neither loopback nor configured.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
from collections.abc import Awaitable, Callable, Iterable
from http.cookies import CookieError, SimpleCookie
from typing import Any
from urllib.parse import parse_qs, urlsplit

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from afs.errors import ConfigError

COOKIE = "afs_token"
PRINCIPAL = "afs.principal"  # the scope key require_token sets: who the request authenticated as
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
WITH_BODY = frozenset({"POST", "PUT", "PATCH"})
FORM_PATHS = frozenset({"/login"})  # the token form of the monitor (require_token), not JSON
_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
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
    A page asked for without it is sent to `GET /login`. An authenticated request carries its
    principal (`token_principal`) in the scope under PRINCIPAL, for the audit log.
    """
    expected = f"Bearer {token}".encode()
    principal = token_principal(token)

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan" or (scope["type"] == "http" and scope["path"] == "/healthz"):
            await app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if scope["type"] != "http":  # a websocket: the same token, or closed (policy violation)
            if hmac.compare_digest(headers.get(b"authorization", b""), expected) or (
                    browser_login and hmac.compare_digest(_cookie(headers).encode(), token.encode())):
                await app({**scope, PRINCIPAL: principal}, receive, send)
            else:
                await send({"type": "websocket.close", "code": 1008})
            return
        if browser_login and scope["path"] == "/login":
            await _login(scope, receive, send, token)
            return
        if hmac.compare_digest(headers.get(b"authorization", b""), expected) or (
                browser_login and hmac.compare_digest(_cookie(headers).encode(), token.encode())):
            await app({**scope, PRINCIPAL: principal}, receive, send)
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


def token_principal(token: str) -> str:
    """Who a request that sent `token` is, for the audit log: `token:` and the first 12 hex
    digits of the token's SHA-256 (names the token without giving it away)."""
    return "token:" + hashlib.sha256(token.encode()).hexdigest()[:12]


class BodyError(ValueError):
    """A request body that is not what the API reads (`.field`: "body", or the top-level field
    that holds the bad text)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def parse_json(raw: bytes) -> Any:
    """The body as JSON. JSON is UTF-8 text: invalid bytes, or a string with a lone surrogate
    (`"\\ud800"` without its pair, which no database or log can store), are BodyError
    naming where they are. CPU-bound for a large body: call it off the event loop."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BodyError("body", f"the body is not valid UTF-8 (byte 0x{raw[exc.start]:02x} at offset "
                                f"{exc.start}): send JSON as UTF-8 text") from None
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BodyError("body", f"the body is not valid JSON: {exc}") from None
    pending: list[tuple[str, Any]] = (list(body.items()) if isinstance(body, dict)
                                      else [("body", body)])
    while pending:  # iterative: a deeply nested body cannot exhaust the stack
        field, value = pending.pop()
        if isinstance(value, dict):
            pending.extend((field, v) for pair in value.items() for v in pair)
        elif isinstance(value, list):
            pending.extend((field, v) for v in value)
        elif isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise BodyError(field, f"{field} holds a lone surrogate (U+{ord(value[exc.start]):04X} at "
                                       f"character {exc.start + 1}), which is not text: send valid "
                                       "UTF-8") from None
            if "\0" in value:
                raise BodyError(field, f"{field} holds a NUL character (at character "
                                       f"{value.index(chr(0)) + 1}), which PostgreSQL text cannot hold")
    return body


def _host_name(value: str) -> str | None:
    """The name in a Host header (`name`, `name:port`, `[v6]:port`), lower case; None when the
    header is not one."""
    value = value.strip().lower()
    if value.startswith("["):
        name, sep, rest = value[1:].partition("]")
        if not sep or (rest and not (rest.startswith(":") and rest[1:].isdigit())):
            return None
        return name
    name, sep, port = value.rpartition(":")
    if not sep:
        return value or None
    return name if port.isdigit() and name and ":" not in name else None


def _origin_of(scheme: str, host: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an origin or of this server as the request names it."""
    try:
        parts = urlsplit(f"{scheme}://{host}" if "://" not in host else host)
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme, 0)
    except ValueError:
        return None
    if not parts.hostname or parts.path or parts.query:
        return None
    return parts.scheme, parts.hostname.lower(), port


def guard_requests(app: Any, *, hosts: Iterable[str] = (), max_body: int) -> Callable[..., Awaitable[None]]:
    """ASGI middleware, outermost: what a page in the user's browser must not make the server do.

    - Host must be a loopback name (localhost, 127.0.0.1, [::1]; any port) or one of `hosts`:
      421 otherwise, on every route (a rebound name would read every answer).
    - POST, PUT, PATCH and DELETE with an Origin other than the server's own (as the request's
      Host names it), or with `Sec-Fetch-Site: cross-site | same-site`: 403. Clients that are
      not browsers send neither.
    - POST, PUT and PATCH need `Content-Type: application/json` (415), but for the token form
      (FORM_PATHS).
    - A path or query string with a NUL character: 400 (no name here holds one, and the
      store's text cannot).
    - A body larger than `max_body` bytes is refused with 413: at once by its Content-Length,
      else once the bytes that arrived pass it; the body is read here, in chunks, and handed
      to the application whole.
    """
    allowed = LOOPBACK_HOSTS | {h.strip("[]").lower() for h in hosts}

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host", "")
        name = _host_name(host)
        refusal: tuple[int, str, str] | None = None
        if name is None or name not in allowed:
            refusal = (421, "Host", f"this server answers to {', '.join(sorted(allowed))} (any port), "
                                    f"not {host or 'a request without a Host'}: add a name to "
                                    "AFS_SERVICE_HOSTS to use it")
        elif "\0" in scope["path"] or b"%00" in scope.get("query_string", b"").lower():
            refusal = (400, "path", "the path or query string holds a NUL character, which no "
                                    "name here holds")
        elif scope.get("method") in STATE_CHANGING:
            origin = headers.get("origin")
            own = _origin_of(scope.get("scheme", "http"), host)
            if origin is not None and (own is None or _origin_of("", origin) != own):
                refusal = (403, "Origin", f"a request from {origin} may not change anything here "
                                          "(only this server's own pages may)")
            elif headers.get("sec-fetch-site") in ("cross-site", "same-site"):
                refusal = (403, "Origin", "a request from another site may not change anything here")
            elif scope["method"] in WITH_BODY and scope["path"] not in FORM_PATHS and \
                    headers.get("content-type", "").partition(";")[0].strip().lower() != "application/json":
                refusal = (415, "Content-Type", "the body must be JSON, sent as "
                                                "Content-Type: application/json")
        length = headers.get("content-length", "")
        if refusal is None and length.isdigit() and int(length) > max_body:
            refusal = (413, "body", _too_large(max_body))
        if refusal is not None:
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
                return
            status, field, message = refusal
            await JSONResponse({"error": message, "field": field}, status_code=status)(scope, receive, send)
            return
        if scope["type"] == "http" and scope["method"] in WITH_BODY:
            body = await _read_body(receive, max_body)
            if body is _LEFT:  # the client went away mid-body: nothing to answer, nothing to do
                return
            if body is None:
                await JSONResponse({"error": _too_large(max_body), "field": "body"},
                                   status_code=413)(scope, receive, send)
                return
            receive = _replay(body, receive)
        await app(scope, receive, send)
    return guarded


def _too_large(limit: int) -> str:
    return f"the body is larger than {limit:,} bytes, the most this server reads (AFS_SERVICE_MAX_BODY)"


_LEFT = b"\0left"  # a sentinel, compared by identity


async def _read_body(receive: Any, limit: int) -> bytes | None:
    """The request's body; None once more than `limit` bytes have arrived; _LEFT when the
    client went away before the end."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return _LEFT
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Any) -> Callable[[], Awaitable[Any]]:
    sent = False

    async def replayed() -> Any:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()
    return replayed
