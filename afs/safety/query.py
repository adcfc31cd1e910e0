"""The query to optimize (pure): exactly one read-only SELECT (`check_query`), and the checks of
structure every statement gets: no call of a function denied by name, no system relation, no
other database (`_side_effect_problem`), nothing written or locked (`_read_only_problem`).
"""

from __future__ import annotations

from typing import Any

from pglast import ast

from afs.errors import UnsafeSqlError
from afs.query.text import walk
from afs.safety.functions import _denial, _denied_by_name
from afs.safety.tree import _describe, _func_name, _parse_one, _Refused, _system_schema


def _side_effect_problem(node: Any) -> str | None:
    """A call of a function known by name to have side effects, or a name no proposal may use
    (a system relation, another database, a function in pg_temp). The rest is judged by the
    catalog (`judge_references`)."""
    for sub in walk(node):
        if isinstance(sub, ast.FuncCall):
            parts = _func_name(sub)
            if len(parts) > 2:
                return "cross-database names are not allowed"
            if len(parts) == 2 and _system_schema(parts[0]) and parts[0].lower() != "pg_catalog":
                return f"calls {'.'.join(parts)}(), which is not a built-in function"
            if _denied_by_name(parts):
                return f"calls {'.'.join(parts)}(), which {_denial(parts)}"
        elif isinstance(sub, ast.RangeVar):
            if sub.catalogname:
                return "cross-database names are not allowed"
            if _system_schema(sub.schemaname):
                return (f"{sub.schemaname}.{sub.relname} is in the system schema {sub.schemaname}: "
                        "system relations are neither read nor changed")
    return None


def _read_only_problem(stmt: Any) -> str | None:
    """Why `stmt` is not one read-only SELECT, or None when it is."""
    if not isinstance(stmt, ast.SelectStmt):
        return f"{_describe(stmt)} is not a read-only SELECT"
    for sub in walk(stmt):
        if isinstance(sub, ast.IntoClause):
            return "SELECT INTO creates a table"
        if isinstance(sub, ast.LockingClause):
            return "FOR UPDATE/SHARE locks rows"
        if isinstance(sub, ast.InsertStmt | ast.UpdateStmt | ast.DeleteStmt | ast.MergeStmt):
            return "data-modifying WITH (INSERT/UPDATE/DELETE/MERGE)"
    return _side_effect_problem(stmt)


def check_query(sql: str) -> str:
    """The query to optimize: exactly one read-only SELECT, returned as text.

    The text is stripped, without a trailing semicolon or trailing comments, so a caller
    can wrap it (`EXPLAIN …`, `SELECT count(*) FROM (…) q`). Raises `UnsafeSqlError`.
    """
    try:
        text, stmt = _parse_one(sql, what="query")
    except _Refused as exc:
        raise UnsafeSqlError(sql, exc.reason) from None
    if isinstance(stmt, ast.SelectStmt):
        problem = _read_only_problem(stmt)
    else:
        problem = f"only a SELECT can be optimized, not {_describe(stmt)}"
    if problem:
        raise UnsafeSqlError(text, problem)
    return text
