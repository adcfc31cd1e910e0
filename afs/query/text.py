"""The text of a query, before any analysis (pure): the input limits, the one query in a
text, the one sqlglot reading of it, and the one walker over PostgreSQL's syntax trees.

    check_input(sql)   refuses what AFS cannot read safely, once, up front, before any other
                       reader (the safety check included) sees the text: larger than
                       MAX_QUERY_BYTES (every agent reads it: a 1 MB IN list cost 51 s of CPU
                       per agent), nested deeper than MAX_QUERY_DEPTH (sqlglot and the readers
                       built on it recurse; 50 parentheses exhausted Python's stack), or holding
                       parameters ($1, as pg_stat_statements stores queries)
    select_text(sql)   the one query in `sql` as pglast (PostgreSQL's parser) reads it, or
                       InputError
    parse_query(text)  the sqlglot tree (dialect "postgres", unquoted names folded to lower
                       case as PostgreSQL does); every sqlglot reading of a query goes through
                       it, and `PARSES` counts them by text (a task reads its query once:
                       afs.query.query.Query)
    walk(node)         every node of a pglast tree, iteratively (a deep query cannot exhaust
                       Python's stack)
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterator
from typing import Any, Final

import pglast
import sqlglot
from pglast import ast as pg_ast
from sqlglot import exp
from sqlglot.optimizer.normalize_identifiers import normalize_identifiers

from afs.errors import InputError

DIALECT = "postgres"
MAX_QUERY_BYTES: Final = 100_000
# Levels of the query's syntax tree (as PostgreSQL parses it) plus twice the levels of
# parentheses and brackets (sqlglot's parser spends about twice the frames on one): a bound
# of how deep the readers recurse. Measured: 40 parentheses read, 50 did not; at this limit
# every nesting (parentheses, CASE, NOT, subqueries, casts, `+` chains, UNION, JOIN) reads
# with 400 frames already on the stack (trio, a brain, pytest), 60 % of Python's default.
MAX_QUERY_DEPTH: Final = 56
# sqlglot's time to read nested ARRAY[…] doubles with each level (1 s at 12, 17 s at 17)
MAX_BRACKET_DEPTH: Final = 8
# How many times sqlglot has read each text (parse_query): how a test sees that a task reads
# its query once, not once per agent, candidate and rule. Bounded: a long-running worker reads
# many texts, and the count is only for seeing one task's readings.
PARSES: Counter[str] = Counter()
_PARSES_KEPT: Final = 1_000


# -- the one walker over pglast trees -------------------------------------------------------
def walk(tree: object) -> Iterator[pg_ast.Node]:
    """Every node of a pglast tree (a node, or a list or tuple of them), depth first, without
    recursing: a query nested as deep as the input limits allow walks in constant stack."""
    for node, _ in walk_depth(tree):
        yield node


def walk_depth(tree: object) -> Iterator[tuple[pg_ast.Node, int]]:
    """`walk`, each node with its depth (the outermost nodes at 1). An AND / OR of many terms
    is one node with a list of arguments, one level."""
    pending: list[tuple[Any, int]] = [(tree, 1)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, pg_ast.Node):
            yield value, depth
            slots: Any = getattr(type(value), "__slots__")  # noqa: B009 - the stubs do not declare it
            pending.extend((getattr(value, name, None), depth + 1) for name in reversed(slots))
        elif isinstance(value, tuple | list):
            pending.extend((item, depth) for item in reversed(value))


# -- the input check ------------------------------------------------------------------------
def check_input(sql: str, *, allow_parameters: bool = False) -> None:
    """Refuse a query AFS cannot read safely (InputError): larger than MAX_QUERY_BYTES,
    nested deeper than MAX_QUERY_DEPTH, or with parameters ($1) unless `allow_parameters`
    (pg_stat_statements' texts, planned generically by the batch). Iterative and linear in
    the size of the query, so it cannot itself run out of stack or time. Text that does not
    parse passes: the safety check (afs.safety.check_query) comes next and refuses it."""
    size = len(sql.encode())
    if size > MAX_QUERY_BYTES:
        raise InputError(f"the query is {size:,} bytes long; AFS reads queries of at most "
                         f"{MAX_QUERY_BYTES:,} bytes (each agent analyses it many times)")
    try:
        statements = pglast.parse_sql(sql)
    except pglast.parser.ParseError:
        return  # not SQL: the safety check that follows says so in its own words
    parentheses, brackets = _parenthesis_depth(sql)
    depth = _syntax_depth(statements) + 2 * parentheses
    if brackets > MAX_BRACKET_DEPTH:
        raise InputError(f"the query nests too deeply for AFS to analyse: {brackets} levels of "
                         f"brackets (ARRAY[ARRAY[…]]), at most {MAX_BRACKET_DEPTH}")
    if depth > MAX_QUERY_DEPTH:
        raise InputError(f"the query nests too deeply for AFS to analyse: {depth} levels of "
                         f"expressions, subqueries and parentheses, at most {MAX_QUERY_DEPTH}")
    parameters = [] if allow_parameters else sorted(_parameters(statements))
    if parameters:
        shown = ", ".join(f"${n}" for n in parameters[:5]) + (", …" if len(parameters) > 5 else "")
        raise InputError(
            f"the query has parameters ({shown}), as pg_stat_statements stores queries: AFS "
            "measures a query with values. Put values in their place, or let `afs batch` fill "
            "them in from the statistics (it reads such statements from pg_stat_statements)")


def _syntax_depth(statements: Any) -> int:
    """The depth of PostgreSQL's syntax tree. An AND / OR of many terms is one node with a list
    of arguments there, and counts once (sqlglot nests them, but reads and walks them without
    recursing)."""
    return max((depth for _, depth in walk_depth(statements)), default=0)


def _parameters(statements: Any) -> set[int]:
    return {int(node.number or 0) for node in walk(statements) if isinstance(node, pg_ast.ParamRef)}


def _parenthesis_depth(sql: str) -> tuple[int, int]:
    """The deepest nesting of parentheses and brackets together, and of brackets alone."""
    depth = deepest = brackets = deepest_brackets = 0
    for token in pglast.parser.scan(sql):
        if token.name in ("ASCII_40", "ASCII_91"):  # ( and [
            depth += 1
            deepest = max(deepest, depth)
            if token.name == "ASCII_91":
                brackets += 1
                deepest_brackets = max(deepest_brackets, brackets)
        elif token.name in ("ASCII_41", "ASCII_93"):
            depth -= 1
            brackets -= token.name == "ASCII_93"
    return deepest, deepest_brackets


# -- the one query and its one sqlglot reading -----------------------------------------
@functools.lru_cache(maxsize=1024)
def select_text(sql: str) -> str:
    """The text of the one query in `sql`, without its terminating `;` (pglast decides;
    remembered: a task asks for the same few texts again and again).

    A query is what PostgreSQL parses as a SELECT: WITH … SELECT, VALUES, TABLE and set
    operations included. Raises InputError for anything else.
    """
    try:
        statements = pglast.parse_sql(sql)
    except pglast.parser.ParseError as exc:
        raise InputError(f"invalid SQL: {first_line(exc)}") from exc
    if not statements:
        raise InputError("no SQL statement, only whitespace or comments")
    if len(statements) != 1:
        raise InputError(f"expected one query, got {len(statements)} statements")
    kind = type(statements[0].stmt).__name__
    if kind != "SelectStmt":
        raise InputError(f"expected a query (SELECT, WITH … SELECT, VALUES), got {kind}")
    (text,) = pglast.split(sql)
    return text


def parse_query(text: str) -> exp.Expr:
    """`text` as a sqlglot tree, unquoted names folded to lower case as PostgreSQL does.

    Raises SqlglotError, or InputError when the query nests too deeply to read (check_input
    refuses such queries first; this is the net behind it).
    """
    if len(PARSES) >= _PARSES_KEPT and text not in PARSES:
        PARSES.clear()
    PARSES[text] += 1
    try:
        return normalize_identifiers(sqlglot.parse_one(text, dialect=DIALECT), dialect=DIALECT)
    except RecursionError:
        raise InputError("the query nests too deeply for AFS to analyse") from None


def first_line(exc: Exception) -> str:
    """The first line of an error message (the exception's type when it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__

