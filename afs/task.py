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

    check_workload(workload, tables) -> WriteWorkload   the workload's writes a task is given
              (StatementParameters.workload, the batch's): at most MAX_WORKLOAD_WRITES, each
              one INSERT, UPDATE or DELETE of a table the query reads (`check_write`: no WITH,
              no call the safety check refuses), filled and as normalised, rates finite and
              not negative. The fork checks the statement it runs again (afs.replay).

CPU-bound: a query at the size limit takes a second or two to read. Trio code calls
`read_query` in a worker thread (`trio.to_thread.run_sync`), never on the event loop: the
command line before it starts anything, the service under a CapacityLimiter of its own so
that parsing never holds up its other routes. The service also bounds the body it reads
(afs.asgi.guard_requests, AFS_SERVICE_MAX_BODY) before any of this sees it.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from typing import get_args

from pglast import ast

from afs.consensus import check_weights
from afs.errors import InputError
from afs.models import Priority, Provider, QueryFeatures, TaskType, WorkloadWrite, WriteWorkload
from afs.params.fill import substitute, typed_parameters
from afs.pg.names import relation_key
from afs.query.features import extract_features
from afs.query.text import check_input
from afs.safety import check_query
from afs.safety.query import _side_effect_problem
from afs.safety.tree import _parse_one, _Refused

PRIORITIES: tuple[str, ...] = get_args(Priority)
TASK_TYPES: tuple[str, ...] = get_args(TaskType)
PROVIDERS: tuple[str, ...] = get_args(Provider)
MAX_RUNS = 50  # measured runs per suite query and side that a task may ask for
MAX_WORKLOAD_WRITES = 5  # write statements a task replays per measured design, at most (~1 s each)
MAX_VALUE_BYTES = 4096  # one filled value of a write ($n → SQL literal), at most


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



def check_write(sql: str, what: str = "the write") -> str:
    """The table one INSERT, UPDATE or DELETE writes (as the catalog prints it), or InputError:
    not one such statement, a data-modifying WITH, or a call or name the safety check refuses
    (a function with side effects, a system relation, another database)."""
    check_text(sql, what)
    check_input(sql, allow_parameters=True)
    try:
        _, stmt = _parse_one(sql, what="query")
    except _Refused as exc:
        raise InputError(f"{what}: {exc.reason}") from None
    if not isinstance(stmt, (ast.InsertStmt, ast.UpdateStmt, ast.DeleteStmt)) or stmt.relation is None:
        raise InputError(f"{what}: one INSERT, UPDATE or DELETE, got {type(stmt).__name__}")
    if stmt.withClause:
        raise InputError(f"{what}: a write with WITH is not replayed")
    problem = _side_effect_problem(stmt)
    if problem:
        raise InputError(f"{what}: {problem}")
    rel = stmt.relation
    return relation_key(*(p for p in (rel.schemaname, rel.relname) if p))


def _rate(value: object, what: str) -> float | None:
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) \
            or value < 0:
        raise InputError(f"{what}: a finite number of 0 or more, or null, got {value!r}")
    return float(value)


def _bare(table: str) -> str:
    return table.lower().rsplit(".", 1)[-1].strip('"')


def check_workload(workload: WriteWorkload | None, tables: Collection[str]) -> WriteWorkload | None:
    """The workload's writes a task is given, checked (InputError naming the write otherwise):
    at most MAX_WORKLOAD_WRITES; each one INSERT, UPDATE or DELETE (`check_write`) of one of
    `tables` (the query's), its normalised statement and its filled query writing the same
    table, the statement with its values substituted too; calls and rates not negative."""
    if workload is None:
        return None
    if len(workload.writes) > MAX_WORKLOAD_WRITES:
        raise InputError(f"workload: at most {MAX_WORKLOAD_WRITES} writes, got {len(workload.writes)}")
    _rate(workload.reads_per_day, "workload.reads_per_day")
    read = {_bare(t) for t in tables}
    for n, write in enumerate(workload.writes, 1):
        what = f"workload write {n}"
        if not isinstance(write, WorkloadWrite):
            raise InputError(f"{what}: expected {{statement, query, table, calls, per_day, values}}")
        table = check_write(write.query, what)
        if check_write(write.statement, what) != table:
            raise InputError(f"{what}: its statement and its filled query write different tables")
        if _bare(write.table) != _bare(table):
            raise InputError(f"{what}: its table is {write.table!r}, but it writes {table}")
        if _bare(table) not in read:
            raise InputError(f"{what}: writes {table}, which the query does not read")
        if not isinstance(write.calls, int) or isinstance(write.calls, bool) or write.calls < 0:
            raise InputError(f"{what}: calls must be an integer of 0 or more, got {write.calls!r}")
        _rate(write.per_day, f"{what}: per_day")
        for number, literal in write.values:
            if not isinstance(number, int) or number < 1 or not isinstance(literal, str) \
                    or len(literal.encode("utf-8", "replace")) > MAX_VALUE_BYTES:
                raise InputError(f"{what}: values are $n → an SQL literal of at most {MAX_VALUE_BYTES} bytes")
        try:
            filled = substitute(typed_parameters(write.statement), dict(write.values))
        except KeyError as exc:
            raise InputError(f"{what}: its values fill no ${exc.args[0]} of its statement") from None
        if check_write(filled, what) != table:
            raise InputError(f"{what}: its statement with its values writes another table")
    return workload
