"""Identifiers and object names, as PostgreSQL reads and limits them (pure).

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


def quote_literal(text: str) -> str:
    """`text` as a SQL string literal, its quotes doubled."""
    return "'" + text.replace("'", "''") + "'"


def schema_and_relation(name: str) -> tuple[str | None, str]:
    """("schema", "rel") of "schema.rel"; (None, name) for an unqualified or quoted name."""
    if "." in name and '"' not in name:
        schema, rel = name.rsplit(".", 1)
        return schema, rel
    return None, name


def relation_name(name: str) -> str:
    """The relation of a possibly qualified name, without quotes."""
    return schema_and_relation(name)[1].strip('"')


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
