"""Identifiers and object names, as PostgreSQL reads and limits them (pure).

A relation is named everywhere in AFS (QueryFeatures.tables, ColumnUse.table, TableInfo.name,
the keys of AnalysisContext.tables) as PostgreSQL prints a regclass: `relation_key(*parts)`,
each part bare when PostgreSQL reads it back unchanged, double-quoted otherwise (`orders`,
`"Orders"`, `sales."Line Items"`). Such a name is valid SQL as it stands and goes to
to_regclass() unchanged; `name_parts` gives its raw parts back. Quoted mixed-case names are
distinct tables: `"Orders"` is not `orders`.

Values: quote_literal (a string literal), sql_literal (a value as PostgreSQL prints it, as
a literal of its column's type).

Two ways to quote, for two uses:
    ident / qualified            SQL shown to people: bare when PostgreSQL would read the
                                 name back unchanged, double-quoted otherwise; a name that
                                 already holds a `"` is taken as quoted by the query
    quote_ident / quote_qualified  SQL built from names the catalog returned: always
                                 double-quoted, embedded quotes doubled
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from typing import Final

from pglast.keywords import COL_NAME_KEYWORDS, RESERVED_KEYWORDS, TYPE_FUNC_NAME_KEYWORDS

NAME_MAX: Final = 63  # PostgreSQL's NAMEDATALEN - 1
_PLAIN = re.compile(r"[a-z_][a-z0-9_$]*")
_SAFE = re.compile(r"[a-z_][a-z0-9_]*")  # what quote_identifier leaves bare (keywords aside)
# keywords that cannot name a column unquoted (col_name keywords can)
RESERVED: Final = frozenset(RESERVED_KEYWORDS) | frozenset(TYPE_FUNC_NAME_KEYWORDS)
# … and, to be safe anywhere (a select item, a type position), not col_name keywords either
KEYWORDS: Final = RESERVED | frozenset(COL_NAME_KEYWORDS)


def is_plain(name: str, *, keywords: frozenset[str] = RESERVED) -> bool:
    """PostgreSQL reads `name` back unchanged without quotes: lower case, not one of `keywords`."""
    return _PLAIN.fullmatch(name) is not None and name not in keywords


def ident(name: str) -> str:
    """`name` as a PostgreSQL identifier: bare when it can be, double-quoted otherwise."""
    if '"' in name:
        return name  # already quoted as the query spelled it
    if is_plain(name):
        return name
    return '"' + name + '"'


def qualified(name: str) -> str:
    """A possibly schema-qualified table name, each part quoted as needed."""
    if '"' in name:
        return name
    return ".".join(ident(part) for part in name.split("."))


def quote_ident(name: str) -> str:
    """`name` always double-quoted, its own quotes doubled (PostgreSQL's quote_ident, stricter)."""
    return '"' + name.replace('"', '""') + '"'


def quote_qualified(name: str) -> str:
    """"schema.name" (or "name"), each part through quote_ident."""
    return ".".join(quote_ident(part) for part in name.split("."))


def relation_key(*parts: str) -> str:
    """The name of a relation from its raw parts, as `regclass::text` prints it: a part is
    bare when lower case and not a keyword (PostgreSQL's quote_identifier), quoted otherwise."""
    return ".".join(part if _SAFE.fullmatch(part) and part not in KEYWORDS else quote_ident(part)
                    for part in parts)


def name_parts(name: str) -> tuple[str, ...]:
    """The raw parts of a dotted name as SQL writes it: `sales."Line Items"` → ("sales",
    "Line Items"); quoted parts keep their case (doubled quotes undone), bare parts are folded
    to lower case, as PostgreSQL folds them."""
    parts: list[str] = []
    i, n = 0, len(name)
    while i <= n:
        if i < n and name[i] == '"':
            j, raw = i + 1, []
            while j < n:
                if name[j] == '"':
                    if j + 1 < n and name[j + 1] == '"':
                        raw.append('"')
                        j += 2
                        continue
                    break
                raw.append(name[j])
                j += 1
            parts.append("".join(raw))
            i = j + 1
        else:
            j = name.find(".", i)
            j = n if j < 0 else j
            parts.append(name[i:j].strip().lower())
            i = j
        if i < n and name[i] == ".":
            i += 1
            continue
        break
    return tuple(parts)


def quote_literal(text: str) -> str:
    """`text` as a SQL string literal, its quotes doubled."""
    return "'" + text.replace("'", "''") + "'"


_NUMERIC_TYPES: Final = frozenset({"smallint", "integer", "bigint", "numeric", "real",
                                   "double precision", "decimal"})


def sql_literal(value: str, data_type: str | None = None) -> str:
    """A value as PostgreSQL prints it (pg_stats, a row read as text) written as an SQL literal
    of a column of `data_type`: a number bare (a negative one in parentheses, so that it can
    follow an operator), a boolean as true / false, anything else a quoted string."""
    base = (data_type or "").split("(")[0].strip().lower()
    if base in _NUMERIC_TYPES:
        return value if not value.startswith("-") else f"({value})"
    if base in ("boolean", "bool"):
        return "true" if value in ("t", "true") else "false"
    return quote_literal(value)


def schema_and_relation(name: str) -> tuple[str | None, str]:
    """The raw ("schema", "rel") of `schema.rel` (see name_parts); (None, "rel") unqualified."""
    parts = name_parts(name)
    return (parts[-2] if len(parts) > 1 else None), parts[-1]


def relation_name(name: str) -> str:
    """The raw relation part of a possibly qualified name (see name_parts)."""
    return name_parts(name)[-1]


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def short_hash(text: str, n: int = 8) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:n]


def object_name(*parts: str, suffix: str, taken: Iterable[str] = ()) -> str:
    """A deterministic name of at most 63 bytes: the slugged parts joined by `_`, then `suffix`.

    Too long (or already taken) names are cut and get a short hash of the full name,
    so two different long keys never collide; a hashed name that is taken too is hashed again."""
    base = "_".join(s for s in (slug(p) for p in parts) if s)
    name = f"{base}_{suffix}"
    taken = set(taken)
    seed = name
    while len(name) > NAME_MAX or name in taken:
        tag = short_hash(seed, 8)
        room = NAME_MAX - len(suffix) - len(tag) - 2
        name = f"{base[:room].rstrip('_')}_{tag}_{suffix}"
        seed = name
    return name


def index_name(table: str, columns: Sequence[str], suffix: str = "idx",
               taken: Iterable[str] = ()) -> str:
    """`afs_<table>_<col>_…_<suffix>`, e.g. `afs_orders_user_id_created_at_idx`."""
    return object_name("afs", relation_name(table), *columns, suffix=suffix, taken=taken)
