"""The one error tree of AFS.

    AfsError                      anything AFS raises on purpose; `.exit_code` for the CLI
    ├── ConfigError               settings file or environment is unusable            (exit 2)
    │   └── RulesError            routing_rules.yaml is broken (names file and rule)  (exit 2)
    ├── InputError                the user asked for something invalid                (exit 2)
    │   ├── UnknownServiceError   no source database or fork has that id              (exit 2)
    │   ├── UnknownTaskError      no task in the store has that id (`.task_id`)       (exit 2)
    │   └── UnsafeSqlError        SQL refused by the safety check (`.statement`, `.reason`)
    ├── SandboxError              the embedded server cannot be set up, started or stopped
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
are caught, with `raise … from exc`; passwords are scrubbed from the message.
"""

from __future__ import annotations

import re

_URL_PASSWORD = re.compile(r"(postgres(?:ql)?://[^:/@\s]*:)([^@\s]*)@")
_KW_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def single_leaf(exc: BaseException) -> BaseException:
    """The one exception inside nested single-member exception groups (else `exc` itself)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def scrub(text: str) -> str:
    """Hide passwords in DSNs and libpq keyword strings."""
    text = _URL_PASSWORD.sub(r"\1***@", text)
    return _KW_PASSWORD.sub(r"\1***", text)


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
