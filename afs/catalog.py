"""What the database's catalog says about a query or a proposal: the I/O half of the safety gate.

`afs.safety` parses and judges the structure; the names it cannot judge (which function
`f(x)` calls, what runs behind `a = b` or `x::t`, where an unqualified `pg_authid` leads,
whether an index of that name exists) become `References`. Two layers, the second only when
the first passes (`catalog_problems`, `check_query_catalog`):

1. Names. `catalog_facts` resolves all of them in one query (`CATALOG_SQL`) against the
   connection's own catalog and search path (the fork's, where the proposal will run), and
   `safety.judge_references` decides, purely. Types cast to and the column types of the
   relations read are walked (`_WALK`: domains over domains, array elements, composite fields,
   ranges) before PostgreSQL is asked anything, because parsing a statement already runs the
   input functions of its literals, and those run a domain's checks.
2. What PostgreSQL resolves (`resolve_sync`, `resolved_problems`). Each `safety.Target` is
   resolved by PostgreSQL itself, in a transaction that is always rolled back: a temporary
   view over the query (the rewrite, the materialized view's query, `SELECT <expressions>
   FROM <table> WHERE <predicate>` for an index) is created, which is parse analysis only
   (nothing planned, no constant folding, nothing run), and `RESOLVED_SQL` reads what its
   rewrite rule depends on: the functions (attribute notation included), the operators the
   analyzer chose (`JOIN … USING`, `NATURAL JOIN`), the types, relations and columns, from
   pg_depend and from the rule's own stored tree (built-ins are pinned and never in
   pg_depend), then everything those run (`_WALK`). `safety.judge_resolved` decides. A query
   with `$n` parameters (pg_stat_statements) is PREPAREd first for the parameters' types, which
   then stand in as typed NULLs. Reads run as GATE_ROLE (afs_explain: NOLOGIN, a member of
   pg_read_all_data) where the connection may have it, as the connection's role otherwise
   (TEMP revoked from PUBLIC, or a recipe whose CREATE TABLE must run as the fork's role).
   A temporary view cannot be created READ ONLY: the transaction is read-write and never
   committed (a savepoint when the caller is already in a transaction); on a standby nothing
   can be resolved, and its statements are refused saying so. A statement PostgreSQL cannot
   resolve is refused with PostgreSQL's own message ("does not run on the database: …").
   Not followed: row-level security policies of the tables read; a partition a recipe adds to
   an existing partitioned table is not created ahead (that would scan the table's default
   partition with its key), its names alone are judged.

Public entry points: `catalog_problems(conn, refs)` (both layers, for a proposal or a query),
`check_query_catalog(conn, query, refs)` (raises `UnsafeSqlError`; resolves `query` even when
`refs` names no target), `resolved_problems(conn, refs)` (the second layer alone) and
`resolve_sync(raw, refs)` (its blocking half, for a psycopg connection).

`table_fingerprints` and `lost_rows` check a partitioning recipe in the fork: every table it
moves holds the same rows and columns under its name before and after it runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
import psycopg.errors
from psycopg.pq import TransactionStatus

from afs.db import Connection, translate
from afs.errors import InputError, UnsafeSqlError
from afs.models import UnsafeStatement
from afs.pg.names import quote_ident
from afs.safety import (
    CatalogFact,
    References,
    Target,
    bind_parameters,
    judge_references,
    judge_resolved,
    parameter_count,
)

# What an object runs, walked in the catalog from seeds `seed(i, cls, oid, sub, mode, via)`:
#   expressions (a view's rewrite rule, a domain's or table's constraint, a column default, a
#     created table: mode 'new') -> what pg_depend says they use (functions, operators, types,
#     relations, columns);
#   a relation read (mode 'relation') -> the rules of a view or materialized view, at any depth,
#     and the types of its columns (mode 'column');
#   an operator -> its function and its estimators; an aggregate -> its support functions;
#   a type in mode 'full' (cast to, coerced to, written) -> its input/output/modifier/analyze/
#     subscript functions, its domain constraints, its base type, array element, composite fields,
#     range subtype and range functions; a column's type (mode 'column') -> only what reading it may
#     run: the element and field types inside it in full (a literal compared with an array of a
#     domain runs the domain's checks while the statement is parsed), a range's functions
#     (subtype_diff runs when the planner estimates).
# pg_depend records for an expression the functions it calls (attribute notation included), the
# operators the analyzer chose (USING and NATURAL joins included), the types it casts or coerces
# to, the relations and columns it reads and its collations, but only those created after initdb:
# pinned built-ins (OIDs below 12000) are never recorded. So the expression's own tree, as
# PostgreSQL stored it (pg_rewrite.ev_action, pg_constraint.conbin, pg_attrdef.adbin,
# pg_partitioned_table.partexprs), is read too: every :funcid, :aggfnoid, :winfnoid (functions),
# :opno, :eqop, :sortop (operators) and :relid (relations) in it. What neither records is followed
# here: domain checks, type functions, operator functions, the rules of views it reads.
# `via` keeps the outermost operator, type or view a function runs for (NULL: called directly).
_WALK = r"""
walk(i, cls, oid, sub, mode, via) AS (
  SELECT i, cls, oid, sub, mode, via FROM seed
  UNION
  SELECT w.i, n.cls, n.oid, n.sub, n.mode, coalesce(w.via, n.via)
  FROM walk w CROSS JOIN LATERAL (
    SELECT d.refclassid, d.refobjid, d.refobjsubid,
           CASE WHEN d.refclassid <> 'pg_class'::regclass THEN 'full'
                WHEN d.refobjsubid > 0 THEN 'column' ELSE 'relation' END, NULL::text COLLATE "C"
    FROM pg_depend d
    WHERE (w.cls IN ('pg_rewrite'::regclass, 'pg_constraint'::regclass, 'pg_attrdef'::regclass)
           OR w.mode = 'new')
      AND d.classid = w.cls AND d.objid = w.oid AND d.deptype = 'n'
      AND NOT (d.refclassid = 'pg_class'::regclass AND d.refobjid = w.oid)
    UNION ALL
    SELECT CASE WHEN m.m[1] IN ('opno', 'eqop', 'sortop') THEN 'pg_operator'::regclass
                WHEN m.m[1] = 'relid' THEN 'pg_class'::regclass ELSE 'pg_proc'::regclass END,
           m.m[2]::oid, 0, CASE WHEN m.m[1] = 'relid' THEN 'relation' ELSE 'full' END, NULL
    FROM (SELECT CASE w.cls
            WHEN 'pg_rewrite'::regclass THEN (SELECT ev_action::text FROM pg_rewrite WHERE oid = w.oid)
            WHEN 'pg_constraint'::regclass THEN (SELECT conbin::text FROM pg_constraint WHERE oid = w.oid)
            WHEN 'pg_attrdef'::regclass THEN (SELECT adbin::text FROM pg_attrdef WHERE oid = w.oid)
            WHEN 'pg_class'::regclass THEN (SELECT partexprs::text FROM pg_partitioned_table
                                           WHERE partrelid = w.oid) END) x(tree)
    CROSS JOIN LATERAL regexp_matches(x.tree, ':(funcid|aggfnoid|winfnoid|opno|eqop|sortop|relid) (\d+)',
                                      'g') m(m)
    WHERE (w.cls IN ('pg_rewrite'::regclass, 'pg_constraint'::regclass, 'pg_attrdef'::regclass)
           OR w.mode = 'new') AND m.m[2] <> '0' AND NOT (m.m[1] = 'relid' AND m.m[2]::oid = w.oid)
    UNION ALL
    SELECT 'pg_rewrite'::regclass, r.oid, 0, 'full',
           (CASE c.relkind WHEN 'm' THEN 'materialized view ' ELSE 'view ' END
            || c.relnamespace::regnamespace::text || '.' || quote_ident(c.relname::text)) COLLATE "C"
    FROM pg_rewrite r JOIN pg_class c ON c.oid = r.ev_class
    WHERE w.cls = 'pg_class'::regclass AND w.mode = 'relation' AND r.ev_class = w.oid
      AND c.relkind IN ('v', 'm')
    UNION ALL
    SELECT 'pg_type'::regclass, a.atttypid, 0, 'column', NULL COLLATE "C"
    FROM pg_attribute a
    WHERE w.cls = 'pg_class'::regclass AND w.mode IN ('relation', 'column') AND a.attrelid = w.oid
      AND CASE WHEN w.sub = 0 THEN a.attnum > 0 ELSE a.attnum = w.sub END AND NOT a.attisdropped
    UNION ALL
    SELECT 'pg_proc'::regclass, f.f, 0, 'full',
           ('operator ' || o.oprnamespace::regnamespace::text || '.' || o.oprname) COLLATE "C"
    FROM pg_operator o CROSS JOIN LATERAL unnest(ARRAY[o.oprcode::oid, o.oprrest::oid, o.oprjoin::oid]) f(f)
    WHERE w.cls = 'pg_operator'::regclass AND o.oid = w.oid AND f.f <> 0
    UNION ALL
    SELECT 'pg_proc'::regclass, f.f, 0, 'full', ('aggregate ' || a.aggfnoid::regproc::text) COLLATE "C"
    FROM pg_aggregate a CROSS JOIN LATERAL unnest(ARRAY[a.aggtransfn::oid, a.aggfinalfn::oid,
      a.aggcombinefn::oid, a.aggserialfn::oid, a.aggdeserialfn::oid, a.aggmtransfn::oid,
      a.aggminvtransfn::oid, a.aggmfinalfn::oid]) f(f)
    WHERE w.cls = 'pg_proc'::regclass AND a.aggfnoid = w.oid AND f.f <> 0
    UNION ALL
    SELECT x.cls, x.oid, 0, x.mode, ('type ' || format_type(t.oid, NULL)) COLLATE "C"
    FROM pg_type t CROSS JOIN LATERAL (
      SELECT 'pg_proc'::regclass::oid, f, 'full' FROM unnest(ARRAY[t.typinput::oid, t.typoutput::oid,
        t.typreceive::oid, t.typsend::oid, t.typmodin::oid, t.typmodout::oid, t.typanalyze::oid,
        t.typsubscript::oid]) f WHERE w.mode = 'full'
      UNION ALL
      SELECT 'pg_constraint'::regclass, k.oid, 'full' FROM pg_constraint k
      WHERE w.mode = 'full' AND k.contypid = t.oid
      UNION ALL
      SELECT 'pg_type'::regclass, t.typbasetype, w.mode
      UNION ALL
      SELECT 'pg_type'::regclass, t.typelem, 'full'
      UNION ALL
      SELECT 'pg_type'::regclass, a.atttypid, 'full' FROM pg_attribute a
      WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped
      UNION ALL
      SELECT 'pg_type'::regclass, g.rngsubtype, 'full' FROM pg_range g WHERE g.rngtypid = t.oid
      UNION ALL
      SELECT 'pg_proc'::regclass, f, 'full' FROM pg_range g
        CROSS JOIN LATERAL unnest(ARRAY[g.rngcanonical::oid, g.rngsubdiff::oid]) f WHERE g.rngtypid = t.oid
      UNION ALL
      SELECT 'pg_type'::regclass, g.rngtypid, w.mode FROM pg_range g WHERE g.rngmultitypid = t.oid
    ) x(cls, oid, mode)
    WHERE w.cls = 'pg_type'::regclass AND t.oid = w.oid AND x.oid <> 0
  ) n(cls, oid, sub, mode, via)
)"""

# One row per function a walked object runs (kind 'function'), per relation it reads ('relation').
_WALKED = """
SELECT w.i, 'function', n.nspname::text, p.proname::text, coalesce(p.oid < 16384, false), e.extname::text,
       p.provolatile::text, coalesce(p.prosecdef, false), w.via, ARRAY[]::text[]
FROM (SELECT DISTINCT ON (i, oid) i, oid, via FROM walk WHERE cls = 'pg_proc'::regclass
      ORDER BY i, oid, via NULLS FIRST) w
JOIN pg_proc p ON p.oid = w.oid JOIN pg_namespace n ON n.oid = p.pronamespace
LEFT JOIN LATERAL (
  SELECT x.extname FROM pg_depend d JOIN pg_extension x ON x.oid = d.refobjid
  WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.refclassid = 'pg_extension'::regclass
    AND d.deptype = 'e' LIMIT 1
) e ON true
UNION ALL
SELECT w.i, 'relation', n.nspname::text, c.relname::text, c.oid < 16384, NULL, NULL, false, w.via,
       ARRAY[c.relkind::text]
FROM (SELECT DISTINCT ON (i, oid) i, oid, via FROM walk
      WHERE cls = 'pg_class'::regclass AND mode = 'relation' ORDER BY i, oid, via NULLS FIRST) w
JOIN pg_class c ON c.oid = w.oid JOIN pg_namespace n ON n.oid = c.relnamespace
"""

# One row per function a reference may run (with the operator, cast, type or view it runs for),
# per relation a name resolves to, per existing object a proposal would create again, and per
# table a copy reads (its columns). Built-in objects have OIDs below 16384 (FirstNormalObjectId):
# whatever a user or an extension creates gets a higher one. A type cast to is walked in full and
# a relation read as a relation (`_WALK`): what the statement's literals may run while PostgreSQL
# parses it is judged here, before `resolve` asks PostgreSQL anything about the statement.
CATALOG_SQL = """
WITH RECURSIVE r AS (
  SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::int[], %s::text[])
    WITH ORDINALITY AS r(kind, schema, name, nargs, near, i)
), path AS (
  SELECT s.nspname FROM unnest(current_schemas(true)) AS s(nspname) WHERE s.nspname !~ '^pg_temp_'
), seed(i, cls, oid, sub, mode, via) AS (
  SELECT r.i, 'pg_type'::regclass::oid, t.t, 0, 'full', NULL::text COLLATE "C"
  FROM r CROSS JOIN LATERAL (SELECT to_regtype(CASE WHEN r.kind = 'type' THEN r.name END) AS t) t
  WHERE r.kind = 'type' AND t.t IS NOT NULL
  UNION ALL
  SELECT r.i, 'pg_proc'::regclass::oid, k.castfunc, 0, 'full',
         ('cast to ' || format_type(k.casttarget, NULL)) COLLATE "C"
  FROM r JOIN pg_cast k ON k.casttarget = to_regtype(CASE WHEN r.kind = 'type' THEN r.name END)
  WHERE r.kind = 'type' AND k.castfunc <> 0
  UNION ALL
  SELECT r.i, 'pg_class'::regclass::oid, c.oid, 0, 'relation', NULL
  FROM r JOIN pg_class c ON c.oid = to_regclass(CASE WHEN r.kind = 'relation' THEN r.name END)
  WHERE r.kind = 'relation'
), """ + _WALK.strip() + """, walked AS (""" + _WALKED + """
), cand AS (
  SELECT r.i, p.oid AS proc, NULL::text AS via
  FROM r JOIN pg_proc p ON p.proname = r.name JOIN pg_namespace n ON n.oid = p.pronamespace
  WHERE r.kind = 'function'
    AND CASE WHEN r.schema IS NULL THEN n.nspname IN (SELECT nspname FROM path) ELSE n.nspname = r.schema END
    AND (r.nargs BETWEEN p.pronargs - p.pronargdefaults AND p.pronargs
         OR (p.provariadic <> 0 AND r.nargs >= p.pronargs - 1))
  UNION ALL
  SELECT r.i, f.f, 'operator ' || n.nspname || '.' || o.oprname
  FROM r JOIN pg_operator o ON o.oprname = r.name JOIN pg_namespace n ON n.oid = o.oprnamespace
  CROSS JOIN LATERAL unnest(ARRAY[o.oprcode::oid, o.oprrest::oid, o.oprjoin::oid]) f(f)
  WHERE r.kind = 'operator' AND (o.oprleft = 0) = (r.nargs = 1) AND f.f <> 0
    AND CASE WHEN r.schema IS NULL THEN n.nspname IN (SELECT nspname FROM path) ELSE n.nspname = r.schema END
  UNION ALL
  SELECT r.i, NULL, 'no such type' FROM r
  WHERE r.kind = 'type' AND to_regtype(CASE WHEN r.kind = 'type' THEN r.name END) IS NULL
)
SELECT c.i, 'function', n.nspname::text, p.proname::text, coalesce(p.oid < 16384, false), e.extname::text,
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
SELECT w.i, w.kind, w.nspname, w.name, w.builtin, w.extname, w.volatility, w.secdef,
       coalesce(w.via, CASE WHEN r.kind = 'type' THEN 'the cast to ' || r.name END), w.extra
FROM walked w(i, kind, nspname, name, builtin, extname, volatility, secdef, via, extra)
JOIN r ON r.i = w.i
WHERE w.kind = 'function' OR w.via IS NOT NULL
UNION ALL
SELECT r.i, 'relation', n.nspname::text, c.relname::text, c.oid < 16384, NULL, NULL, false, NULL,
       ARRAY[c.relkind::text]
FROM r JOIN pg_class c ON c.oid = to_regclass(CASE WHEN r.kind = 'relation' THEN r.name END)
  JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE r.kind = 'relation'
UNION ALL
SELECT r.i, 'relation', n.nspname::text, c.relname::text, false, NULL, NULL, false, NULL,
       ARRAY[CASE c.relkind WHEN 'i' THEN 'index' WHEN 'I' THEN 'index' WHEN 'm' THEN 'materialized view'
                            WHEN 'v' THEN 'view' WHEN 'S' THEN 'sequence' ELSE 'table' END]
FROM r JOIN pg_class c ON c.relname = r.name JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE r.kind = 'exists' AND n.oid = coalesce(
  to_regnamespace(quote_ident(r.schema)),
  (SELECT x.relnamespace FROM pg_class x WHERE x.oid = to_regclass(r.near)),
  to_regnamespace(quote_ident(current_schema())))
UNION ALL
SELECT r.i, 'relation', n.nspname::text, s.stxname::text, false, NULL, NULL, false, NULL, ARRAY['statistics']
FROM r JOIN pg_statistic_ext s ON s.stxname = r.name JOIN pg_namespace n ON n.oid = s.stxnamespace
WHERE r.kind = 'statistics' AND n.nspname = coalesce(r.schema, current_schema())
UNION ALL
SELECT r.i, 'relation', NULL, NULL, false, NULL, NULL, false, NULL,
       array_agg(a.attname::text ORDER BY a.attnum)
FROM r JOIN pg_attribute a ON a.attrelid = to_regclass(CASE WHEN r.kind = 'columns' THEN r.name END)
  AND a.attnum > 0 AND NOT a.attisdropped
  AND a.attgenerated = ''
WHERE r.kind = 'columns'
GROUP BY r.i
"""

# What PostgreSQL resolved for the targets (`safety.Target`): seeds are the rewrite rules of the
# temporary views (read, index) and the tables a recipe created (create), by target number.
RESOLVED_SQL = """
WITH RECURSIVE t AS (
  SELECT * FROM unnest(%s::int[], %s::oid[], %s::text[]) AS t(i, oid, kind)
), seed(i, cls, oid, sub, mode, via) AS (
  SELECT t.i, 'pg_rewrite'::regclass::oid, r.oid, 0, 'full', NULL::text COLLATE "C"
  FROM t JOIN pg_rewrite r ON r.ev_class = t.oid WHERE t.kind IN ('read', 'index', 'matview')
  UNION ALL
  SELECT t.i, 'pg_class'::regclass::oid, t.oid, 0, 'new', NULL FROM t WHERE t.kind = 'create'
  UNION ALL
  SELECT t.i, 'pg_attrdef'::regclass::oid, d.oid, 0, 'full', NULL
  FROM t JOIN pg_attrdef d ON d.adrelid = t.oid WHERE t.kind = 'create'
  UNION ALL
  SELECT t.i, 'pg_constraint'::regclass::oid, k.oid, 0, 'full', NULL
  FROM t JOIN pg_constraint k ON k.conrelid = t.oid WHERE t.kind = 'create'
), """ + _WALK.strip() + _WALKED


def catalog_params(refs: References) -> list[list[object]]:
    """The parameters of `CATALOG_SQL` for `refs` (one array per column)."""
    return [[r.kind for r in refs.refs], [r.schema for r in refs.refs], [r.name for r in refs.refs],
            [r.nargs for r in refs.refs], [r.near for r in refs.refs]]


def facts_from_rows(rows: Sequence[Sequence[Any]]) -> list[CatalogFact]:
    """`CATALOG_SQL` rows as facts (`ref` counts from 0)."""
    return [CatalogFact(ref=int(row[0]) - 1, kind="relation" if row[1] == "relation" else "function",
                        schema=_text(row[2]), name=_text(row[3]), builtin=bool(row[4]),
                        extension=_text(row[5]), volatility=_text(row[6]), security_definer=bool(row[7]),
                        via=_text(row[8]), extra=tuple(str(x) for x in row[9] or ()))
            for row in rows]


def _text(value: object) -> str | None:
    return None if value is None else str(value)


async def catalog_facts(conn: Connection, refs: References) -> list[CatalogFact]:
    """What the connection's catalog says about `refs`: one query, whatever their number."""
    if not refs.refs:
        return []
    return facts_from_rows(await conn.fetchall(CATALOG_SQL, catalog_params(refs)))


# -- what PostgreSQL resolves ------------------------------------------------------------------------
# The one low-privilege role, for resolving here and for planning and running on a target
# (afs.target): NOLOGIN, a member of pg_read_all_data only. It may create temporary views (the
# TEMP right PUBLIC has by default) and read, nothing more.
GATE_ROLE = "afs_explain"
# what GATE_ROLE may be a member of (any depth): reading, nothing more
_GRANTED = ("pg_read_all_data",)
# may SET ROLE to it: from PostgreSQL 16 a membership can be without SET (ADMIN alone, as a
# CREATEROLE role gets for the roles it creates)
_MEMBER_SQL = """
SELECT CASE WHEN current_setting('server_version_num')::int >= 160000
            THEN pg_has_role(current_user, oid, 'SET') ELSE pg_has_role(current_user, oid, 'MEMBER') END
FROM pg_roles WHERE rolname = %s
"""
# the roles GATE_ROLE has the privileges of besides itself and _GRANTED, and its own flags
_EXTRA_SQL = """
SELECT r.rolsuper OR r.rolcreaterole OR r.rolcreatedb OR r.rolbypassrls OR r.rolreplication,
       ARRAY(SELECT g.rolname::text FROM pg_roles g
             WHERE g.oid <> r.oid AND g.rolname <> ALL(%s) AND pg_has_role(r.oid, g.oid, 'USAGE')
             ORDER BY 1)
FROM pg_roles r WHERE r.rolname = %s
"""


def gate_role(raw: psycopg.Connection[Any]) -> str | None:
    """GATE_ROLE if the connected role may SET ROLE to it (created where it may create roles and
    the connection is outside a transaction), else None. InputError when it exists with more
    rights than reading: it is then neither used nor replaced by the connection's own role.
    Blocking: call it through `Connection.run`."""
    member = raw.execute(_MEMBER_SQL, (GATE_ROLE,)).fetchone()
    if member is None and raw.info.transaction_status == TransactionStatus.IDLE:
        # no right to create roles, or created meanwhile: look again either way
        with contextlib.suppress(psycopg.Error):
            raw.execute(f"CREATE ROLE {GATE_ROLE} NOLOGIN IN ROLE {', '.join(_GRANTED)}")
        member = raw.execute(_MEMBER_SQL, (GATE_ROLE,)).fetchone()
    if member is None or not member[0]:
        return None
    row = raw.execute(_EXTRA_SQL, (list(_GRANTED), GATE_ROLE)).fetchone()
    assert row is not None
    flags, extra = row
    if flags or extra:
        what = f"the rights of {', '.join(extra)}" if extra else "role attributes beyond LOGIN"
        raise InputError(
            f"the role {GATE_ROLE} on the target has {what}: AFS plans users' queries as this role "
            f"because it may only read (a member of {', '.join(_GRANTED)}, nothing else). Revoke "
            f"them, or DROP ROLE {GATE_ROLE} and AFS creates it again")
    return GATE_ROLE


class _Denied(Exception):
    """GATE_ROLE may not do what resolving needs here (create a temporary view)."""


def _first_line(exc: psycopg.Error) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _resolve_targets(raw: psycopg.Connection[Any], targets: Sequence[Target], role: str | None,
                     ) -> tuple[list[tuple[int, int, str]], dict[int, str]]:
    """Inside the caller's transaction: each target resolved (a temporary view created, a
    recipe's statement run), in order, each in a savepoint of its own. Returns (target number,
    the view's or table's oid, kind) for what resolved and the error of each that did not."""
    if role:
        raw.execute(f"SET LOCAL ROLE {role}")
    resolved: list[tuple[int, int, str]] = []
    failures: dict[int, str] = {}
    for i, target in enumerate(targets):
        raw.execute("SAVEPOINT afs_gate_target")
        try:
            if target.kind in ("read", "index"):
                sql = target.sql
                if parameter_count(sql):
                    sql = bind_parameters(sql, _parameter_types(raw, sql))
                view = f"pg_temp.afs_gate_{i}"
                # a view over it: parse analysis only, nothing is planned or run; the subquery lets
                # any output columns through (duplicate names, record)
                raw.execute(f"CREATE TEMP VIEW afs_gate_{i} AS SELECT 1 AS afs FROM ({sql}\n) AS afs_q")
                row = raw.execute("SELECT to_regclass(%s)::oid", (view,)).fetchone()
            else:
                raw.execute(target.sql)
                row = (raw.execute("SELECT to_regclass(%s)::oid", (target.relation,)).fetchone()
                       if target.kind in ("create", "matview") else None)
        except psycopg.Error as exc:
            if role and exc.sqlstate == "42501":
                raise _Denied from exc
            raw.execute("ROLLBACK TO SAVEPOINT afs_gate_target")
            failures[i] = _first_line(exc)
            continue
        raw.execute("RELEASE SAVEPOINT afs_gate_target")
        if row is not None and row[0] is not None:
            resolved.append((i, int(row[0]), target.kind))
    return resolved, failures


def _parameter_types(raw: psycopg.Connection[Any], sql: str) -> list[str]:
    """The types PostgreSQL infers for the $n of `sql` (PREPARE: parse analysis, no plan)."""
    name = "afs_gate_parameters"
    raw.execute(f"PREPARE {name} AS {sql}\n")
    try:
        row = raw.execute("SELECT parameter_types::text[] FROM pg_prepared_statements WHERE name = %s",
                          (name,)).fetchone()
    finally:
        raw.execute(f"DEALLOCATE {name}")
    return [str(t) for t in (row[0] if row is not None else ())]


def resolve_sync(raw: psycopg.Connection[Any], refs: References) -> tuple[list[CatalogFact], dict[int, str]]:
    """What PostgreSQL resolves `refs.targets` to (`safety.Target`), as facts for
    `safety.judge_resolved`, and what it said of each target that did not resolve.

    Runs in a transaction of its own that is always rolled back (a savepoint when the connection
    is already in one), read-write because a temporary view cannot be created read-only; reads
    and index expressions as GATE_ROLE where the connection may have it (a recipe's tables are
    created as the connection's role, in the fork). Creating a view runs nothing of the query:
    PostgreSQL only parses and analyses it (no planning, no constant folding); the input
    functions of its literals do run, which is why `judge_references` judges the types of casts
    and columns first. Blocking: call it through `Connection.run`.
    """
    if not refs.targets:
        return [], {}
    role = None
    if not any(t.kind in ("create", "execute") for t in refs.targets):
        role = gate_role(raw)
    nested = raw.info.transaction_status == TransactionStatus.INTRANS
    try:
        raw.execute("SAVEPOINT afs_gate" if nested else "BEGIN READ WRITE")
    except (psycopg.errors.ReadOnlySqlTransaction, psycopg.errors.FeatureNotSupported) as exc:
        # a standby ("cannot set transaction read-write mode during recovery"): no temporary view
        # can be created, so nothing can be resolved, and what cannot be resolved is refused
        reason = f"{_first_line(exc)} (a read-only server: AFS needs the primary to resolve queries)"
        with contextlib.suppress(psycopg.Error):
            raw.execute("ROLLBACK")
        return [], dict.fromkeys(range(len(refs.targets)), reason)
    except psycopg.Error as exc:
        raise translate(exc, "BEGIN READ WRITE") from exc
    try:
        try:
            try:
                resolved, failures = _resolve_targets(raw, refs.targets, role)
            except _Denied:
                # GATE_ROLE may not create temporary views here (TEMP revoked): as the connection's role
                raw.execute("ROLLBACK TO SAVEPOINT afs_gate" if nested else "ROLLBACK")
                raw.execute("SAVEPOINT afs_gate" if nested else "BEGIN READ WRITE")
                resolved, failures = _resolve_targets(raw, refs.targets, None)
            rows = raw.execute(RESOLVED_SQL, ([i + 1 for i, _, _ in resolved], [o for _, o, _ in resolved],
                                              [k for _, _, k in resolved])).fetchall() if resolved else []
        finally:
            if not raw.closed:
                raw.execute("ROLLBACK TO SAVEPOINT afs_gate" if nested else "ROLLBACK")
    except psycopg.Error as exc:
        raise translate(exc, "resolving a statement in a rolled-back transaction") from exc
    return facts_from_rows(rows), failures


async def resolved_problems(conn: Connection, refs: References) -> tuple[UnsafeStatement, ...]:
    """The statements refused for what PostgreSQL resolves them to (`safety.judge_resolved`)."""
    if not refs.targets:
        return ()
    facts, failures = await conn.run(lambda raw: resolve_sync(raw, refs))
    return judge_resolved(refs, facts, failures)


async def catalog_problems(conn: Connection, refs: References) -> tuple[UnsafeStatement, ...]:
    """The statements the catalog refuses, each with its reason: first the names
    (`safety.judge_references`), then, when they all pass, what PostgreSQL resolves the
    statements to (`resolved_problems`)."""
    problems = judge_references(refs, await catalog_facts(conn, refs))
    return problems or await resolved_problems(conn, refs)


async def check_query_catalog(conn: Connection, query: str, refs: References) -> None:
    """Raise `UnsafeSqlError` when the catalog refuses something the query uses or resolves to
    (`catalog_problems`); the query itself is resolved even when `refs` names no target."""
    if not refs.targets:
        refs = dataclasses.replace(refs, targets=(Target("read", query, query),))
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
