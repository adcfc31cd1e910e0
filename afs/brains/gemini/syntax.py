"""What a proposal needs of PostgreSQL: the oldest server version that runs its SQL.

A fix is applied on the source server, which is often older than the one the plans were
measured on (an import into the sandbox's PostgreSQL 18). `too_new(sql, major)` says which
parts of `sql` that server cannot run, read from the parse tree PostgreSQL's own parser
gives (pglast), never from the text: every node of it (`afs.query.text.walk`, typed fields
such as a UNION's arms included, without recursing), each rule one node (and field) and the
release that brought it. The brain refuses such a candidate with the reason, and the model
is asked again within the re-prompt bound. Pure: no trio, no network, no database.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Final

import pglast
from pglast import ast, enums
from pglast.parser import ParseError

from afs.query.text import walk


def _names(values: Sequence[ast.Node] | None) -> list[str]:
    return [item.sval or "" for item in values or () if isinstance(item, ast.String)]


def _function(name: str) -> Callable[[ast.Node], bool]:
    return lambda n: isinstance(n, ast.FuncCall) and _names(n.funcname)[-1:] == [name]


# (the first major version that has it, what it is, does this node use it)
RULES: Final[tuple[tuple[int, str, Callable[[ast.Node], bool]], ...]] = (
    (10, "declarative partitioning", lambda n: isinstance(n, ast.PartitionSpec)),
    (10, "CREATE STATISTICS", lambda n: isinstance(n, ast.CreateStatsStmt)),
    (11, "hash partitioning", lambda n: isinstance(n, ast.PartitionSpec)
     and n.strategy == enums.PartitionStrategy.PARTITION_STRATEGY_HASH),
    (11, "INCLUDE columns in an index", lambda n: isinstance(n, ast.IndexStmt)
     and bool(n.indexIncludingParams)),
    (12, "most-common-value (mcv) extended statistics", lambda n: isinstance(n, ast.CreateStatsStmt)
     and "mcv" in _names(n.stat_types)),
    (12, "generated columns", lambda n: isinstance(n, ast.Constraint)
     and n.contype == enums.ConstrType.CONSTR_GENERATED),
    (12, "REINDEX CONCURRENTLY", lambda n: isinstance(n, ast.DefElem) and n.defname == "concurrently"),
    (13, "FETCH FIRST … WITH TIES", lambda n: isinstance(n, ast.SelectStmt)
     and n.limitOption == enums.LimitOption.LIMIT_OPTION_WITH_TIES),
    (13, "the deduplicate_items index option", lambda n: isinstance(n, ast.DefElem)
     and n.defname == "deduplicate_items"),
    (14, "GROUP BY DISTINCT", lambda n: isinstance(n, ast.SelectStmt) and bool(n.groupDistinct)),
    (14, "SEARCH or CYCLE in a recursive query", lambda n: isinstance(n, ast.CommonTableExpr)
     and bool(n.search_clause or n.cycle_clause)),
    (14, "BRIN minmax-multi and bloom operator classes", lambda n: isinstance(n, ast.IndexElem) and any(
        re.search(r"_(minmax_multi|bloom)_ops$", name) for name in _names(n.opclass))),
    (15, "NULLS NOT DISTINCT", lambda n: isinstance(n, ast.IndexStmt) and bool(n.nulls_not_distinct)),
    (15, "MERGE", lambda n: isinstance(n, ast.MergeStmt)),
    (16, "any_value()", _function("any_value")),
    (17, "JSON_TABLE", lambda n: isinstance(n, ast.JsonTable)),
    (18, "uuidv7()", _function("uuidv7")),
)


def too_new(statements: Sequence[str], major: int) -> list[str]:
    """What in `statements` PostgreSQL `major` cannot run: "NULLS NOT DISTINCT (PostgreSQL 15)"."""
    found: dict[str, int] = {}
    for sql in statements:
        try:
            tree = pglast.parse_sql(sql)
        except ParseError:
            continue  # the safety check says what is wrong with it
        for node in walk(tree):
            for since, what, uses in RULES:
                if since > major and uses(node):
                    found[what] = since
    return [f"{what} (PostgreSQL {since})" for what, since in sorted(found.items(), key=lambda i: i[1])]


def major_of(version: str) -> int | None:
    """10 from "10.23", 18 from "18.1 (Debian …)"; None when it names no version."""
    match = re.match(r"\s*(\d+)", version)
    return int(match[1]) if match else None
