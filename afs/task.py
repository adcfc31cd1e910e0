"""A task request's one check, shared by the command line (`afs optimize`) and the API
(`POST /v1/tasks`): whoever asks, the same task is refused for the same reason, before
anything is stored, forked or started. (The request itself is afs.optimize.TaskRequest.)

    PRIORITIES, TASK_TYPES, PROVIDERS   the choices, read from the Literals of afs.models
    check_choice(value, allowed, what)  one of them, or InputError naming `what`
    check_runs(value, what)             measured runs: an integer from 1 to MAX_RUNS
    read_weights(value, what)           consensus weights, as `a=0.6,b=0.4` text or a mapping of
                                        numbers, checked by afs.consensus.check_weights

    read_query(sql) -> (query, features)   the query as AFS reads it, or InputError:
        text      check_text: Unicode that UTF-8 can carry (no lone surrogate: a command
                  line's undecodable bytes, a JSON "\\ud800" without its pair), no NUL
        limits    afs.query.text.check_input: at most MAX_QUERY_BYTES, MAX_QUERY_DEPTH deep,
                  no parameters ($1)
        safety    afs.safety.check_query: one read-only SELECT
        features  afs.query.features.extract_features, reading at least one table

CPU-bound: a query at the size limit takes a second or two to read. Trio code calls
`read_query` in a worker thread (`trio.to_thread.run_sync`), never on the event loop: the
command line before it starts anything, the service under a CapacityLimiter of its own so
that parsing never holds up its other routes. The service also bounds the body it reads
(afs.asgi.guard_requests, AFS_SERVICE_MAX_BODY) before any of this sees it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import get_args

from afs.consensus import check_weights
from afs.errors import InputError
from afs.models import Priority, Provider, QueryFeatures, TaskType
from afs.query.features import extract_features
from afs.query.text import check_input
from afs.safety import check_query

PRIORITIES: tuple[str, ...] = get_args(Priority)
TASK_TYPES: tuple[str, ...] = get_args(TaskType)
PROVIDERS: tuple[str, ...] = get_args(Provider)
MAX_RUNS = 50  # measured runs per suite query and side that a task may ask for


def check_choice(value: object, allowed: tuple[str, ...], what: str) -> str:
    """`value` when it is one of `allowed`, else InputError naming `what` and the choices."""
    if not isinstance(value, str) or value not in allowed:
        raise InputError(f"{what}: one of {', '.join(allowed)}")
    return value


def check_runs(value: object, what: str = "runs") -> int:
    """Measured runs per suite query and side: an integer from 1 to MAX_RUNS, else InputError."""
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_RUNS:
        raise InputError(f"{what}: an integer from 1 to {MAX_RUNS}, got {value!r}")
    return value


def read_weights(value: str | Mapping[str, object] | None, what: str = "weights") -> dict[str, float] | None:
    """Consensus weights for a task: None (the rules file's), `performance=0.6,storage=0.2,…`
    (the command line) or a mapping of numbers (the API), checked by afs.consensus.check_weights:
    known names, each from 0 to 1, summing to 1. InputError naming `what` otherwise."""
    if value is None:
        return None
    weights: dict[str, float] = {}
    if isinstance(value, str):
        for part in value.split(","):
            key, sep, number = part.partition("=")
            try:
                weights[key.strip()] = float(number)
            except ValueError:
                raise InputError(f"{what}: expected name=number, got {part!r}") from None
            if not sep:
                raise InputError(f"{what}: expected name=number, got {part!r}")
    elif isinstance(value, Mapping) and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                            for v in value.values()):
        weights = {str(k): float(v) for k, v in value.items()}  # type: ignore[arg-type]
    else:
        raise InputError(f"{what}: an object of numbers, e.g. {{\"performance\": 0.6, ...}}")
    try:
        check_weights(weights)
    except ValueError as exc:
        raise InputError(f"{what}: {exc}") from None
    return weights


def check_text(text: str, what: str = "the query") -> None:
    """InputError when `text` holds a lone surrogate (it is not text UTF-8 can carry) or a
    NUL character (PostgreSQL's text cannot hold one)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InputError(f"{what} is not valid UTF-8: character {exc.start + 1} is a lone surrogate "
                         f"(U+{ord(text[exc.start]):04X}: a byte that is not UTF-8, or half of a "
                         "\\ud800-style pair)") from None
    if "\0" in text:
        raise InputError(f"{what} holds a NUL character (character {text.index(chr(0)) + 1}), "
                         "which PostgreSQL text cannot hold")


def read_query(sql: str) -> tuple[str, QueryFeatures]:
    """The query to optimize and its features, or InputError: not UTF-8 text, too large or too
    deep to read, parameters, not one read-only SELECT, no table."""
    check_text(sql)
    check_input(sql)
    query = check_query(sql)
    features = extract_features(query)
    if not features.tables:
        raise InputError("the query reads no table: there is nothing to optimize")
    return query, features

