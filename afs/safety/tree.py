"""The parse tree of a statement, as the validator reads it (pure: pglast only).

Splitting a script into statements (`split_statements`), parsing exactly one (`_parse_one`:
NUL characters, several statements and what does not parse are refused), relation names as
SQL text and as keys (`public.x` is `x`), what the check of one statement says (`_Verdict`) or raises
(`_Refused`), and the `$n` parameters of a pg_stat_statements query.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pglast import ast, enums, parse_sql, split
from pglast.parser import ParseError, scan
from pglast.stream import RawStream, maybe_double_quote_name

from afs.errors import UnsafeSqlError
from afs.models import RiskLevel


def _system_schema(schema: str | None) -> bool:
    """A schema of the system, however it is spelled: pg_catalog, pg_toast, pg_temp_3,
    information_schema (PostgreSQL reserves the pg_ prefix; a quoted "PG_Catalog" is not the
    catalog, but no proposal needs a schema of that name)."""
    return schema is not None and (schema.lower().startswith("pg_") or schema.lower() == "information_schema")


_NUL = "contains a NUL character: PostgreSQL would not read what follows it, nor would this check"


class _Refused(Exception):
    """One statement is refused; `reason` says why (internal to afs.safety)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _func_name(call: ast.FuncCall) -> tuple[str, ...]:
    return tuple(part.sval for part in call.funcname or () if isinstance(part, ast.String) and part.sval)


def _describe(stmt: Any) -> str:
    """A short SQL-ish name for a statement node: 'DELETE', 'CREATE INDEX', …"""
    special = {
        "SelectStmt": "SELECT", "InsertStmt": "INSERT", "UpdateStmt": "UPDATE", "DeleteStmt": "DELETE",
        "VariableSetStmt": "SET", "VariableShowStmt": "SHOW", "DoStmt": "DO", "CopyStmt": "COPY",
        "IndexStmt": "CREATE INDEX", "CreateStmt": "CREATE TABLE", "RuleStmt": "CREATE RULE",
        "TransactionStmt": "transaction control", "CreatedbStmt": "CREATE DATABASE",
        "DropdbStmt": "DROP DATABASE", "CreateTrigStmt": "CREATE TRIGGER", "ViewStmt": "CREATE VIEW",
        "RenameStmt": "ALTER … RENAME", "CreateSeqStmt": "CREATE SEQUENCE", "AlterSeqStmt": "ALTER SEQUENCE",
        "SecLabelStmt": "SECURITY LABEL", "CommentStmt": "COMMENT ON",
    }
    name = type(stmt).__name__
    if isinstance(stmt, ast.VacuumStmt):
        return "ANALYZE" if not stmt.is_vacuumcmd else "VACUUM"
    if isinstance(stmt, ast.DropStmt):
        return f"DROP {_object_word(stmt.removeType)}"
    if isinstance(stmt, ast.CreateTableAsStmt):
        if stmt.objtype == enums.ObjectType.OBJECT_MATVIEW:
            return "CREATE MATERIALIZED VIEW"
        return "SELECT INTO" if stmt.is_select_into else "CREATE TABLE AS"
    if name in special:
        return special[name]
    words = re.findall(r"[A-Z][a-z]*", name.removesuffix("Stmt"))
    return " ".join(words).upper() if words else name


def _trim(text: str) -> str:
    """Drop trailing comments (and a stray semicolon) so the text can be embedded safely."""
    tokens = [t for t in scan(text) if t.name not in ("SQL_COMMENT", "C_COMMENT")]
    while tokens and tokens[-1].name == "ASCII_59":  # ';'
        tokens.pop()
    if not tokens:
        return ""
    return text[: tokens[-1].end + 1].strip()


def split_statements(sql: str) -> list[str]:
    """Split a script into its statements (text, stripped, no semicolons, no trailing comments).

    Uses the parser; when the script does not parse, falls back to the scanner so that each
    piece can still be judged (and the broken one refused) on its own. Raises
    `UnsafeSqlError` when not even the scanner can split it (an unterminated string, …).
    """
    if "\x00" in sql:
        raise UnsafeSqlError(sql, _NUL)
    try:
        pieces = split(sql)
    except ParseError:
        try:
            pieces = split(sql, with_parser=False)
        except ParseError as exc:
            raise UnsafeSqlError(sql, f"does not parse: {exc.args[0]}") from exc
    out: list[str] = []
    for piece in pieces:
        try:
            text = _trim(piece)
        except ParseError:
            text = piece.strip()
        if text:
            out.append(text)
    return out


def _with_leading_comments(sql: str, statement: str) -> str:
    """`statement` with the comments that precede it in `sql` (planner hints like /*+ … */)."""
    slices = split(sql, only_slices=True)
    if len(slices) != 1:  # pragma: no cover - only called for one statement
        return statement
    prefix = sql[: slices[0].start]
    if any(t.name not in ("SQL_COMMENT", "C_COMMENT") for t in scan(prefix)):
        return statement
    return (prefix + sql[slices[0]]).strip()


def _parse_one(sql: str, *, what: str) -> tuple[str, ast.Node]:
    """The single statement in `sql` (text and node), or `_Refused`."""
    if "\x00" in sql:
        raise _Refused(_NUL)
    try:
        pieces = split(sql)
    except ParseError as exc:
        raise _Refused(f"does not parse: {exc.args[0]}") from exc
    if not pieces:
        raise _Refused(f"empty {what}")
    if len(pieces) > 1:
        raise _Refused("several statements" if what == "query" else "several statements in one command")
    text = _trim(_with_leading_comments(sql, pieces[0]))
    try:
        raw = parse_sql(text)
    except ParseError as exc:  # pragma: no cover - split already parsed it
        raise _Refused(f"does not parse: {exc.args[0]}") from exc
    if len(raw) != 1 or raw[0].stmt is None:  # pragma: no cover - split agreed
        raise _Refused("several statements")
    return text, raw[0].stmt


def _qualified(schema: str | None, name: str) -> str:
    parts = [schema, name] if schema else [name]
    return ".".join(maybe_double_quote_name(p) for p in parts)


def _rv_sql(rv: ast.RangeVar | None) -> str:
    if rv is None or not rv.relname:
        raise _Refused("statement names no relation")
    return _qualified(rv.schemaname, rv.relname)


def _rv_key(rv: ast.RangeVar | None) -> str:
    """A name to compare relations by: `public.x` and `x` are the same."""
    if rv is None or not rv.relname:
        raise _Refused("statement names no relation")
    schema = rv.schemaname if rv.schemaname not in (None, "public") else None
    return f"{schema}.{rv.relname}" if schema else rv.relname


def _check_target(rv: ast.RangeVar | None) -> None:
    if rv is None or not rv.relname:
        raise _Refused("statement names no relation")
    if rv.catalogname:
        raise _Refused("cross-database names are not allowed")
    if _system_schema(rv.schemaname):
        temporary = (" (a temporary table would hide the real one)"
                     if (rv.schemaname or "").lower().startswith("pg_temp") else "")
        raise _Refused(f"system schema {rv.schemaname} is not changed by proposals{temporary}")


@dataclass
class _Verdict:
    risk: RiskLevel
    reversibility: float
    rollback: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    point_of_no_return: bool = False  # undoing earlier commands would destroy the only copy of data


def _sql(node: ast.Node) -> str:
    """A node as SQL text (a new stream each time: one accumulates what it printed)."""
    return str(RawStream()(node))


def parameter_count(sql: str) -> int:
    """The highest $n in `sql` (0 when it has no parameters)."""
    numbers = [int(sql[t.start + 1:t.end + 1]) for t in scan(sql) if t.name == "PARAM"]
    return max(numbers, default=0)


def bind_parameters(sql: str, types: Sequence[str]) -> str:
    """`sql` with each $n replaced by `(NULL::<types[n-1]>)` (types as SQL text, from PostgreSQL):
    a query of pg_stat_statements resolves in a view as it does when planned with parameters."""
    out, last = [], 0
    for token in scan(sql):
        if token.name == "PARAM":
            n = int(sql[token.start + 1:token.end + 1])
            out += [sql[last:token.start], f"(NULL::{types[n - 1]})"]
            last = token.end + 1
    return "".join(out) + sql[last:]


def _only_set_statistics(stmt: ast.AlterTableStmt) -> bool:
    return bool(stmt.cmds) and all(isinstance(c, ast.AlterTableCmd)
                                   and c.subtype == enums.AlterTableType.AT_SetStatistics
                                   for c in stmt.cmds or ())


def _key_sql(key: str) -> str:
    """A relation key of `_rv_key` (schema.name or name) as SQL text."""
    schema, _, name = key.rpartition(".")
    return _qualified(schema or None, name)


def _object_word(objtype: Any) -> str:
    name = str(getattr(objtype, "name", objtype)).removeprefix("OBJECT_")
    words = {"MATVIEW": "MATERIALIZED VIEW", "FDW": "FOREIGN DATA WRAPPER", "STATISTIC_EXT": "STATISTICS"}
    return words.get(name, name.replace("_", " "))


def _plain(rv: ast.RangeVar | None) -> str | None:
    """A relation as written, unquoted: schema.name or name (None when it names none)."""
    if rv is None or not rv.relname:
        return None
    return f"{rv.schemaname}.{rv.relname}" if rv.schemaname else rv.relname

