"""What a proposal needs of PostgreSQL: the oldest server version that runs its SQL.

A fix is applied on the source server, which is often older than the one the plans were
measured on (an import into the sandbox's PostgreSQL 18). `too_new(sql, major)` says which
parts of `sql` that server cannot run, read from the parse tree PostgreSQL's own parser
gives (pglast), never from the text: each rule is one node (and field) and the release
that brought it. The brain refuses such a candidate with the reason, and the model is asked
again within the re-prompt bound. Pure: no trio, no network, no database.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Final

from pglast.parser import ParseError, parse_sql_json

Fields = Mapping[str, Any]


def _names(fields: Fields, key: str) -> list[str]:
    return [item.get("String", {}).get("sval", "")
            for item in fields.get(key) or () if isinstance(item, dict)]


def _function(name: str) -> Callable[[str, Fields], bool]:
    return lambda node, f: node == "FuncCall" and _names(f, "funcname")[-1:] == [name]


# (the first major version that has it, what it is, does this node use it)
RULES: Final[tuple[tuple[int, str, Callable[[str, Fields], bool]], ...]] = (
    (10, "declarative partitioning", lambda node, f: node == "PartitionSpec"),
    (10, "CREATE STATISTICS", lambda node, f: node == "CreateStatsStmt"),
    (11, "hash partitioning", lambda node, f: node == "PartitionSpec"
     and f.get("strategy") == "PARTITION_STRATEGY_HASH"),
    (11, "INCLUDE columns in an index", lambda node, f: node == "IndexStmt"
     and bool(f.get("indexIncludingParams"))),
    (12, "most-common-value (mcv) extended statistics", lambda node, f: node == "CreateStatsStmt"
     and "mcv" in _names(f, "stat_types")),
    (12, "generated columns", lambda node, f: node == "Constraint"
     and f.get("contype") == "CONSTR_GENERATED"),
    (12, "REINDEX CONCURRENTLY", lambda node, f: node == "DefElem" and f.get("defname") == "concurrently"),
    (13, "FETCH FIRST … WITH TIES", lambda node, f: node == "SelectStmt"
     and f.get("limitOption") == "LIMIT_OPTION_WITH_TIES"),
    (13, "the deduplicate_items index option", lambda node, f: node == "DefElem"
     and f.get("defname") == "deduplicate_items"),
    (14, "GROUP BY DISTINCT", lambda node, f: node == "SelectStmt" and bool(f.get("groupDistinct"))),
    (14, "SEARCH or CYCLE in a recursive query", lambda node, f: node == "CommonTableExpr"
     and bool(f.get("search_clause") or f.get("cycle_clause"))),
    (14, "BRIN minmax-multi and bloom operator classes", lambda node, f: node == "IndexElem" and any(
        re.search(r"_(minmax_multi|bloom)_ops$", name) for name in _names(f, "opclass"))),
    (15, "NULLS NOT DISTINCT", lambda node, f: node == "IndexStmt" and bool(f.get("nulls_not_distinct"))),
    (15, "MERGE", lambda node, f: node == "MergeStmt"),
    (16, "any_value()", _function("any_value")),
    (17, "JSON_TABLE", lambda node, f: node == "JsonTable"),
    (18, "uuidv7()", _function("uuidv7")),
)
_UNWRAPPED: Final = {"partspec": "PartitionSpec"}  # typed fields the JSON tree does not name


def _nodes(value: Any, name: str | None = None) -> Iterator[tuple[str, Fields]]:
    if isinstance(value, dict):
        if name is not None:
            yield name, value
        for key, child in value.items():
            if isinstance(child, dict) and key[:1].isupper() and len(value) == 1:
                yield from _nodes(child, key)
            else:
                yield from _nodes(child, _UNWRAPPED.get(key))
    elif isinstance(value, list):
        for item in value:
            yield from _nodes(item)


def too_new(statements: Sequence[str], major: int) -> list[str]:
    """What in `statements` PostgreSQL `major` cannot run: "NULLS NOT DISTINCT (PostgreSQL 15)"."""
    found: dict[str, int] = {}
    for sql in statements:
        try:
            tree = json.loads(parse_sql_json(sql))
        except ParseError:
            continue  # the safety check says what is wrong with it
        for node, fields in _nodes(tree):
            for since, what, uses in RULES:
                if since > major and uses(node, fields):
                    found[what] = since
    return [f"{what} (PostgreSQL {since})" for what, since in sorted(found.items(), key=lambda i: i[1])]


def major_of(version: str) -> int | None:
    """10 from "10.23", 18 from "18.1 (Debian …)"; None when it names no version."""
    match = re.match(r"\s*(\d+)", version)
    return int(match[1]) if match else None
