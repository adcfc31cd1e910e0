"""The one error tree of AFS.

    AfsError                      anything AFS raises on purpose; `.exit_code` for the CLI
    ├── ConfigError               settings file or environment is unusable            (exit 2)
    │   └── RulesError            routing_rules.yaml is broken (names file and rule)  (exit 2)
    ├── InputError                the user asked for something invalid                (exit 2)
    │   ├── UnknownServiceError   no source database or fork has that id              (exit 2)
    │   ├── UnknownTaskError      no task in the store has that id (`.task_id`)       (exit 2)
    │   └── UnsafeSqlError        SQL refused by the safety check (`.statement`, `.reason`)
    ├── SandboxError              the embedded server cannot be set up, started or stopped
    ├── ProposalFailedError       a validated proposal's SQL failed in a fork: built, screened or undone
    ├── DatabaseError             a statement failed on the server (`.sqlstate`)
    │   ├── StatementTimeout      the server's statement_timeout fired (or trio cancelled it)
    │   └── ForkLimitError        a statement would grow a fork past its cap (`.limit_mb`)
    ├── ModelError                the model API failed (`.status` HTTP, `.code` API status, `.retryable`)
    │   └── ModelOutputError      the model's answer is unusable even after re-prompts (`.reason`, `.raw`)
    ├── ServiceError              the AFS HTTP service is unreachable or refused (`.status`)
    └── ForkError                 the fork provider could not do what was asked
        ├── ForkBusyError         the template is in use; retry in a few seconds (`.retryable`)
        └── ForkServerError       the MCP fork server could not be reached or answered badly

Third-party errors (psycopg, mcp, subprocess) are translated once, where they
are caught, with `raise … from exc`; passwords are scrubbed from the message (`scrub`:
libpq's own parser for a connection string, a conservative search for free text).
"""

from __future__ import annotations

import re


def single_leaf(exc: BaseException) -> BaseException:
    """The one exception inside nested single-member exception groups (else `exc` itself)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


MASK = "***"  # what `scrub` puts where a secret was

# Keywords whose values are secrets: password, sslpassword, oauth_client_secret (libpq 18),
# PGPASSWORD in a quoted environment: any word that holds "password" or "secret", any case.
_SECRET_WORD = r"[A-Za-z0-9_\-]*(?:password|passwd|secret)[A-Za-z0-9_\-]*"
_SECRET_KEY = re.compile(_SECRET_WORD, re.IGNORECASE)
# scheme://user:password@: any scheme, any spelling (libpq knows postgresql:// and postgres://,
# but a message may hold a mistyped one). A password in free text may be decoded already (`@`
# and `/` in it) or hold spaces: the userinfo runs to the last "@" of the URI's word, then (a
# second pass) to an "@" before any "/", across spaces. Over-scrubbing is fine, a leak is not.
_URI_USERINFO = (re.compile(r"(\b[A-Za-z][A-Za-z0-9+.\-]*://)(\S*)@"),
                 re.compile(r"(\b[A-Za-z][A-Za-z0-9+.\-]*://)([^/@\n]*)@"))
# key=value, key = 'quoted \' value', key: value, "key": "value" (a dict in a message): the
# value ends where libpq's would (at a closing quote or white space not escaped by a backslash,
# or by a run of them in a JSON string; `a,b&c` is one value); an unterminated quote runs to
# the end of the text.
_KEY_VALUE = re.compile(
    rf"""(["']?\b{_SECRET_WORD}["']?\s*[=:]\s*)("(?:[^"\\]|\\+.)*"?|'(?:[^'\\]|\\+.)*'?|(?:\\+.|\S)+)""",
    re.IGNORECASE)
# a URI's query string: ?password=…&…, the name percent-encoded or not (pass%77ord)
_QUERY_PARAM = re.compile(r"([?&])([^=&\s?#]+)=([^&\s#]*)")
# libpq's own complaints about a connection string quote the part they could not read, which
# may be the password (`unexpected spaces found in "pa ss"`) or the whole URI.
_LIBPQ_COMPLAINT = re.compile(r"connection info string|connection option|URI|percent-encoded"
                              r"|unexpected spaces found", re.IGNORECASE)
_QUOTED = re.compile(r'"[^"\n]*"')


def scrub(text: str) -> str:
    """`text` with every password hidden (MASK in its place), whatever form it takes.

    A whole connection string is read by libpq's own parser (psycopg.conninfo): a URI with
    its password in the userinfo or the query string, percent-encoded or not, keyword/value
    pairs with quotes and escapes. Free text (an error message that quotes a DSN) is scrubbed
    where anything looks like one: `scheme://user:…@`, `…password… = value` (any case,
    sslpassword and oauth_client_secret too, quoted or not), `?password=…`, and the quoted
    fragments of libpq's complaints about a connection string. It errs towards hiding more.
    """
    whole = _scrub_conninfo(text)
    return whole if whole is not None else _scrub_free_text(text)


def _scrub_conninfo(text: str) -> str | None:
    """A connection string with its secrets masked (its own shape kept when the driver reads
    the same values from it), or None when `text` is not one."""
    if "=" not in text and "://" not in text:
        return None
    # libpq's parser, not a regex; this module stays free of I/O (it opens nothing)
    from psycopg import conninfo

    try:
        params = conninfo.conninfo_to_dict(text)
    except Exception:  # not a connection string (the driver says why, in many ways)
        return None
    shown = _scrub_free_text(text)
    try:
        again = conninfo.conninfo_to_dict(shown)
    except Exception:  # scrubbing broke its shape: rebuilt below
        again = {}
    # Masked: the secrets, a value that holds a DSN (a URI's dbname runs to its end, decoded:
    # `shop\npostgres://…`), and a value the free-text scrubber changed (a raw `user:pa@ss@host`
    # leaves `ss@host` as libpq's host, but it was meant as the password's).
    wanted = {k: MASK if _SECRET_KEY.fullmatch(k) or _scrub_free_text(str(v)) != v or again.get(k, v) != v
              else v for k, v in params.items()}
    if wanted == params:
        return text
    if again == wanted:
        return shown  # a URI stays a URI
    return conninfo.make_conninfo("", **wanted)


def _scrub_free_text(text: str) -> str:
    def userinfo(match: re.Match[str]) -> str:
        user, sep, _ = match.group(2).partition(":")
        return f"{match.group(1)}{user}{sep}{MASK if sep else ''}@"

    def query(match: re.Match[str]) -> str:
        name = _percent_decoded(match.group(2))
        return (f"{match.group(1)}{match.group(2)}={MASK}" if _SECRET_KEY.fullmatch(name)
                else match.group(0))

    for pattern in _URI_USERINFO:
        text = pattern.sub(userinfo, text)
    text = _QUERY_PARAM.sub(query, text)
    text = _KEY_VALUE.sub(lambda m: m.group(1) + MASK, text)
    if _LIBPQ_COMPLAINT.search(text):
        text = _QUOTED.sub(f'"{MASK}"', text)
    return text


def _percent_decoded(text: str) -> str:
    return re.sub(r"%([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)), text)


class AfsError(Exception):
    """Base class. The message is meant for a person and never holds a password."""

    exit_code = 1
    retryable = False

    def __init__(self, message: str) -> None:
        super().__init__(scrub(message))

    @property
    def message(self) -> str:
        return str(self)


class ConfigError(AfsError):
    """Raised when the settings file or the environment cannot be used."""

    exit_code = 2


class InputError(AfsError):
    """Raised for invalid user input: bad names, TTLs, SQL, options."""

    exit_code = 2


class UnknownTaskError(InputError):
    """Raised when a task id names no task in the store."""

    def __init__(self, task_id: str) -> None:
        super().__init__(f"no task {task_id!r} in the store (see `afs history`)")
        self.task_id = task_id


class UnknownServiceError(InputError):
    """Raised when a service id names no source database and no fork."""

    def __init__(self, service_id: str, known: list[str] | None = None,
                 message: str | None = None) -> None:
        hint = f" (known: {', '.join(sorted(known))})" if known else ""
        super().__init__(message or f"unknown service {service_id!r}{hint}")
        self.service_id = service_id


class UnsafeSqlError(InputError):
    """Raised when SQL is refused by the safety check; `.statement` and `.reason` say why."""

    def __init__(self, statement: str, reason: str) -> None:
        short = " ".join(statement.split())
        short = short if len(short) <= 120 else short[:117] + "..."
        super().__init__(f"refused SQL ({reason}): {short}" if short else f"refused SQL: {reason}")
        self.statement = statement
        self.reason = reason


class RulesError(ConfigError):
    """Raised when the routing rules file is unusable; the message names the file and the rule."""


class SandboxError(AfsError):
    """Raised when the embedded PostgreSQL cannot be initialised, started or stopped."""


class ProposalFailedError(AfsError):
    """Raised by `afs.bench` when a validated proposal's SQL fails in a fork: applying it,
    screening it in a rolled-back transaction, or undoing it (the DatabaseError as its cause).
    Not a DatabaseError: the proposal failed, not AFS's own statement; every fork of a task
    fails the same way, so the failure is shared with the other agents."""


class DatabaseError(AfsError):
    """Raised when a statement fails on the server; `.sqlstate` holds the SQLSTATE code."""

    def __init__(self, message: str, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class StatementTimeout(DatabaseError):
    """Raised when a statement was cancelled: by statement_timeout or by trio cancellation."""


class ForkLimitError(DatabaseError):
    """Raised before a statement runs in a fork when the planner expects it to write more than
    the fork may grow (`.limit_mb`); SQLSTATE 53400, as for the server's own temp_file_limit."""

    def __init__(self, message: str, limit_mb: int) -> None:
        super().__init__(message, sqlstate="53400")
        self.limit_mb = limit_mb


class ModelError(AfsError):
    """Raised when the model API fails: `.status` (HTTP) and `.code` (API status) say how.

    `.retryable` is True for rate limits, server errors and timeouts (after the retries ran out).
    """

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None,
                 retryable: bool = False, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.retryable = retryable
        self.retry_after_s = retry_after_s  # what the server asked us to wait, if it did


class ModelOutputError(ModelError):
    """Raised when a model's answer cannot be used; `.reason` is what to tell the model."""

    def __init__(self, reason: str, raw: str = "") -> None:
        super().__init__(f"unusable model output: {reason}")
        self.reason = reason
        self.raw = raw


class ServiceError(AfsError):
    """Raised by the HTTP client of `afs serve` when it cannot be reached or refuses a request."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        if status is not None and 400 <= status < 500:
            self.exit_code = 2


class ForkError(AfsError):
    """Raised when a fork cannot be created, found or destroyed."""


class ForkBusyError(ForkError):
    """Raised when the fork template is being accessed by other sessions. Retry shortly."""

    retryable = True


class ForkServerError(ForkError):
    """Raised when the MCP fork server cannot be started or answers with a protocol error."""
