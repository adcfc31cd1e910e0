"""What the database's catalog says about a query or a proposal: the I/O half of the safety gate.

`afs.safety` parses and judges the structure; the names it cannot judge (which function
`f(x)` calls, what runs behind `a = b` or `x::t`, where an unqualified `pg_authid` leads,
whether an index of that name exists) become `References`. `catalog_facts` resolves all of
them in one query against the connection's own catalog and search path (the fork's, where
the proposal will run), and `safety.judge_references` decides, purely.

`table_fingerprints` and `lost_rows` check a partitioning recipe in the fork: every table it
moves holds the same rows and columns under its name before and after it runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from afs.db import Connection
from afs.errors import UnsafeSqlError
from afs.models import UnsafeStatement
from afs.pg.names import quote_ident
from afs.safety import CatalogFact, References, judge_references

# One row per function a reference may run (with the operator, cast or view it runs for), per
# relation a name resolves to, per existing object a proposal would create again, and per
# table a copy reads (its columns). Built-in objects have OIDs below 16384
# (FirstNormalObjectId): whatever a user or an extension creates gets a higher one.
CATALOG_SQL = """
WITH RECURSIVE r AS (
  SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::int[], %s::text[])
    WITH ORDINALITY AS r(kind, schema, name, nargs, near, i)
), views AS (
  SELECT r.i, c.oid FROM r JOIN pg_class c
    ON c.oid = to_regclass(CASE WHEN r.kind = 'relation' THEN r.name END) AND c.relkind IN ('v', 'm')
  UNION
  SELECT v.i, d.refobjid FROM views v JOIN pg_rewrite w ON w.ev_class = v.oid
  JOIN pg_depend d ON d.classid = 'pg_rewrite'::regclass AND d.objid = w.oid
                  AND d.refclassid = 'pg_class'::regclass AND d.refobjid <> v.oid
  JOIN pg_class c ON c.oid = d.refobjid AND c.relkind IN ('v', 'm')
), path AS (
  SELECT s.nspname FROM unnest(current_schemas(true)) AS s(nspname) WHERE s.nspname !~ '^pg_temp_'
), cand AS (
  SELECT r.i, p.oid AS proc, NULL::text AS via
  FROM r JOIN pg_proc p ON p.proname = r.name JOIN pg_namespace n ON n.oid = p.pronamespace
  WHERE r.kind = 'function'
    AND CASE WHEN r.schema IS NULL THEN n.nspname IN (SELECT nspname FROM path) ELSE n.nspname = r.schema END
    AND (r.nargs BETWEEN p.pronargs - p.pronargdefaults AND p.pronargs
         OR (p.provariadic <> 0 AND r.nargs >= p.pronargs - 1))
  UNION ALL
  SELECT r.i, o.oprcode::oid, 'operator ' || n.nspname || '.' || o.oprname
  FROM r JOIN pg_operator o ON o.oprname = r.name JOIN pg_namespace n ON n.oid = o.oprnamespace
  WHERE r.kind = 'operator' AND (o.oprleft = 0) = (r.nargs = 1)
    AND CASE WHEN r.schema IS NULL THEN n.nspname IN (SELECT nspname FROM path) ELSE n.nspname = r.schema END
  UNION ALL
  SELECT r.i, f.proc, 'cast to ' || format_type(t.t, NULL)
  FROM r CROSS JOIN LATERAL (SELECT to_regtype(CASE WHEN r.kind = 'type' THEN r.name END) AS t) t
  CROSS JOIN LATERAL (
    SELECT typinput::oid AS proc FROM pg_type WHERE oid = t.t
    UNION SELECT castfunc FROM pg_cast WHERE casttarget = t.t AND castfunc <> 0
    UNION SELECT d.refobjid FROM pg_constraint k
      JOIN pg_depend d ON d.classid = 'pg_constraint'::regclass AND d.objid = k.oid
                      AND d.refclassid = 'pg_proc'::regclass
      WHERE k.contypid = t.t
  ) f
  WHERE r.kind = 'type' AND t.t IS NOT NULL
  UNION ALL
  SELECT v.i, d.refobjid, 'view ' || vn.nspname || '.' || vc.relname
  FROM views v JOIN pg_class vc ON vc.oid = v.oid JOIN pg_namespace vn ON vn.oid = vc.relnamespace
  JOIN pg_rewrite w ON w.ev_class = v.oid
  JOIN pg_depend d ON d.classid = 'pg_rewrite'::regclass AND d.objid = w.oid
                  AND d.refclassid = 'pg_proc'::regclass
  UNION ALL
  SELECT r.i, NULL, 'no such type' FROM r
  WHERE r.kind = 'type' AND to_regtype(CASE WHEN r.kind = 'type' THEN r.name END) IS NULL
)
SELECT c.i, n.nspname::text, p.proname::text, coalesce(p.oid < 16384, false), e.extname::text,
       p.provolatile::text, coalesce(p.prosecdef, false), c.via, ARRAY[]::text[]
FROM cand c
LEFT JOIN pg_proc p ON p.oid = c.proc
LEFT JOIN pg_namespace n ON n.oid = p.pronamespace
LEFT JOIN LATERAL (
  SELECT x.extname FROM pg_depend d JOIN pg_extension x ON x.oid = d.refobjid
  WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.refclassid = 'pg_extension'::regclass
    AND d.deptype = 'e' LIMIT 1
) e ON true
UNION ALL
SELECT r.i, n.nspname::text, c.relname::text, c.oid < 16384, NULL, NULL, false, NULL, ARRAY[c.relkind::text]
FROM r JOIN pg_class c ON c.oid = to_regclass(CASE WHEN r.kind = 'relation' THEN r.name END)
  JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE r.kind = 'relation'
UNION ALL
SELECT r.i, n.nspname::text, c.relname::text, false, NULL, NULL, false, NULL,
       ARRAY[CASE c.relkind WHEN 'i' THEN 'index' WHEN 'I' THEN 'index' WHEN 'm' THEN 'materialized view'
                            WHEN 'v' THEN 'view' WHEN 'S' THEN 'sequence' ELSE 'table' END]
FROM r JOIN pg_class c ON c.relname = r.name JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE r.kind = 'exists' AND n.oid = coalesce(
  to_regnamespace(quote_ident(r.schema)),
  (SELECT x.relnamespace FROM pg_class x WHERE x.oid = to_regclass(r.near)),
  to_regnamespace(quote_ident(current_schema())))
UNION ALL
SELECT r.i, n.nspname::text, s.stxname::text, false, NULL, NULL, false, NULL, ARRAY['statistics']
FROM r JOIN pg_statistic_ext s ON s.stxname = r.name JOIN pg_namespace n ON n.oid = s.stxnamespace
WHERE r.kind = 'statistics' AND n.nspname = coalesce(r.schema, current_schema())
UNION ALL
SELECT r.i, NULL, NULL, false, NULL, NULL, false, NULL, array_agg(a.attname::text ORDER BY a.attnum)
FROM r JOIN pg_attribute a ON a.attrelid = to_regclass(CASE WHEN r.kind = 'columns' THEN r.name END)
  AND a.attnum > 0 AND NOT a.attisdropped
  AND a.attgenerated = ''
WHERE r.kind = 'columns'
GROUP BY r.i
"""


def catalog_params(refs: References) -> list[list[object]]:
    """The parameters of `CATALOG_SQL` for `refs` (one array per column)."""
    return [[r.kind for r in refs.refs], [r.schema for r in refs.refs], [r.name for r in refs.refs],
            [r.nargs for r in refs.refs], [r.near for r in refs.refs]]


def facts_from_rows(rows: Sequence[Sequence[Any]]) -> list[CatalogFact]:
    """`CATALOG_SQL` rows as facts (`ref` counts from 0)."""
    return [CatalogFact(ref=int(row[0]) - 1, schema=_text(row[1]), name=_text(row[2]),
                        builtin=bool(row[3]), extension=_text(row[4]), volatility=_text(row[5]),
                        security_definer=bool(row[6]), via=_text(row[7]),
                        extra=tuple(str(x) for x in row[8] or ()))
            for row in rows]


def _text(value: object) -> str | None:
    return None if value is None else str(value)


async def catalog_facts(conn: Connection, refs: References) -> list[CatalogFact]:
    """What the connection's catalog says about `refs`: one query, whatever their number."""
    if not refs.refs:
        return []
    return facts_from_rows(await conn.fetchall(CATALOG_SQL, catalog_params(refs)))


async def catalog_problems(conn: Connection, refs: References) -> tuple[UnsafeStatement, ...]:
    """The statements the catalog refuses (`safety.judge_references`), each with its reason."""
    return judge_references(refs, await catalog_facts(conn, refs))


async def check_query_catalog(conn: Connection, query: str, refs: References) -> None:
    """Raise `UnsafeSqlError` when the catalog refuses something the query uses."""
    problems = await catalog_problems(conn, refs)
    if problems:
        raise UnsafeSqlError(query, problems[0].reason)


# -- the rows of a migration ---------------------------------------------------------------------
@dataclass(frozen=True)
class Fingerprint:
    """A table's columns, row count and an order-independent checksum of its rows."""

    columns: tuple[str, ...]
    rows: int
    checksum: str


_COLUMNS_SQL = """
SELECT coalesce(array_agg(a.attname::text ORDER BY a.attnum), ARRAY[]::text[]), bool_or(true)
FROM pg_attribute a WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped
"""


async def table_fingerprints(
    conn: Connection, tables: Sequence[str], columns: Mapping[str, tuple[str, ...]] | None = None,
) -> dict[str, Fingerprint | None]:
    """The fingerprint of each table (SQL text), None for a table that does not exist.

    `columns` (by table) fixes the columns summed, so that a table with its columns in
    another order, or more of them, compares with the original; a table lacking one of them
    gets the columns it has and no rows counted.
    """
    found: dict[str, Fingerprint | None] = {}
    for table in tables:
        row = await conn.fetchone(_COLUMNS_SQL, (table,))
        present = tuple(row[0]) if row is not None and row[1] else None
        if present is None:
            found[table] = None
            continue
        wanted = (columns or {}).get(table, present)
        if set(wanted) - set(present):
            found[table] = Fingerprint(present, -1, "")
            continue
        values = ", ".join(quote_ident(c) for c in wanted)
        row_hash = f"('x' || left(md5(ROW({values})::text), 15))::bit(60)::bigint"
        sql = f"SELECT count(*), coalesce(sum({row_hash}), 0)::text FROM {table}"
        count, checksum = await conn.fetchone(sql) or (0, "0")
        found[table] = Fingerprint(wanted, int(count), str(checksum))
    return found


def lost_rows(before: Mapping[str, Fingerprint | None], after: Mapping[str, Fingerprint | None]) -> list[str]:
    """What a migration lost: tables gone, columns gone, rows gone or changed (empty: nothing)."""
    problems: list[str] = []
    for table, old in before.items():
        new = after.get(table)
        if old is None:
            continue
        if new is None:
            problems.append(f"no table {table} after the migration: its rows must stay under its name")
        elif set(old.columns) - set(new.columns):
            missing = ", ".join(c for c in old.columns if c not in new.columns)
            problems.append(f"{table} lost its column(s) {missing}")
        elif (new.rows, new.checksum) != (old.rows, old.checksum):
            problems.append(f"{table} holds {new.rows} rows after the migration, {old.rows} before"
                            + (" (their values differ)" if new.rows == old.rows else ""))
    return problems
