"""The index kind from the catalog (pure): which access method and operator class serve the
operators one index key must answer, chosen among what the fork's catalog says serves them.

    kind = choose(ctx.operator_classes, [("@>", "jsonb"), ("?", "jsonb")])
    kind.method, kind.opclass   # "gin", None (jsonb_ops, the default: it has `?`)

The candidates are the (method, operator class) pairs that serve every operator asked for, as
pg_amop lists them (afs.analysis.operator_support reads them, with those of installed
extensions and of the trusted ones that could be created). Among them:

- the method: B-tree first (it orders, and it is the cheapest to keep up on writes), then GIN
  (exact lookups of many-valued keys: containment, trigrams, full text), GiST, SP-GiST (lossy
  or space-partitioned trees: overlap, geometry, ranges), hash (equality only: chosen only
  where no B-tree serves). BRIN is never chosen here: it pays only where the column follows
  the physical row order and the range read is large (`brin_fits`), which the caller knows;
- within a method, a class of an installed extension before one whose extension must be
  created (with the index: `IndexKind.extension`);
- for B-tree and hash, the default class of the type (the order by the collation, and the
  class other queries share); for the others, the most specialised class that serves the
  operators (the fewest operators in its family: it indexes less, so it is smaller and
  faster — jsonb_path_ops beside jsonb_ops), the default first among equals.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import pglast
from pglast import ast as pg_ast
from pglast.enums import A_Expr_Kind, BoolExprType
from pglast.stream import RawStream

from afs.models import OperatorSupport
from afs.query.text import walk

# the order of preference of the access methods (module docstring); others come after them
METHOD_ORDER: Final = ("btree", "gin", "gist", "spgist", "hash")
BRIN_MIN_CORRELATION: Final = 0.9  # |pg_stats.correlation| for BRIN to prune block ranges
BRIN_MIN_FRACTION: Final = 0.05  # a range read this large (or more) is BRIN's, not a B-tree's
ORDERED_METHODS: Final = frozenset({"btree"})  # pg_am.amcanorder among the core methods


@dataclass(frozen=True)
class IndexKind:
    """What one index key is built with: `USING method (key opclass)`."""

    method: str
    opclass: str | None  # None: the type's default class for the method (not written)
    extension: str | None = None  # the extension to create first (not installed yet)
    owner: str | None = None  # the extension the class comes from (installed or not)
    serves: tuple[str, ...] = ()  # the operators it serves, as asked for

    @property
    def named(self) -> str:
        """The class as a sentence names it: "gin (jsonb_path_ops)", "btree"."""
        return f"{self.method} ({self.opclass})" if self.opclass else self.method


def support_key(operator: str, left_type: str) -> str:
    """The key of AnalysisContext.operator_classes: "@> jsonb"."""
    return f"{operator} {left_type}"


def supports(catalog: Mapping[str, tuple[OperatorSupport, ...]], operator: str,
             left_type: str | None) -> tuple[OperatorSupport, ...]:
    """The classes serving `operator` on `left_type`; when the type is not known (an expression),
    those of the one type the query uses the operator with, if it is one."""
    if left_type is not None:
        found = catalog.get(support_key(operator, left_type))
        if found is not None:
            return found
        if left_type.endswith("[]"):
            found = catalog.get(support_key(operator, "anyarray"))
            if found is not None:
                return found
    keys = {k for k in catalog if k.split(" ", 1)[0] == operator}
    types = {s.left_type for k in keys for s in catalog[k]}
    if left_type is None and len(types) == 1:
        return tuple(dict.fromkeys(s for k in sorted(keys) for s in catalog[k]))
    return ()


def _method_rank(method: str) -> int:
    return METHOD_ORDER.index(method) if method in METHOD_ORDER else len(METHOD_ORDER)


def candidates(catalog: Mapping[str, tuple[OperatorSupport, ...]],
               needs: Iterable[tuple[str, str | None]], *, methods: Iterable[str] | None = None,
               ordered: bool = False, purpose: str = "search") -> list[IndexKind]:
    """Every (method, class) serving all of `needs` ((operator, left type) pairs) for a WHERE
    test (`purpose` "order": for an ORDER BY of the operator's result, a nearest-neighbour
    scan), best first (module docstring); `methods` limits the methods, `ordered` keeps those
    that return rows in order (an ORDER BY on the key)."""
    wanted = list(dict.fromkeys(needs))
    if not wanted:
        return []
    served: dict[tuple[str, str], list[OperatorSupport]] = {}
    for i, (operator, left_type) in enumerate(wanted):
        here: dict[tuple[str, str], OperatorSupport] = {}
        for s in supports(catalog, operator, left_type):
            if s.purpose == purpose:
                here.setdefault((s.method, s.opclass), s)
        if i == 0:
            served = {k: [s] for k, s in here.items()}
        else:
            served = {k: [*v, here[k]] for k, v in served.items() if k in here}
    allowed = set(methods) if methods is not None else None
    kinds: list[tuple[tuple[int, int, int, int, str], IndexKind]] = []
    for (method, opclass), found in served.items():
        if method == "brin" or (allowed is not None and method not in allowed):
            continue
        if ordered and method not in ORDERED_METHODS:
            continue
        first = found[0]
        installed = all(s.installed for s in found)
        plain = method in ("btree", "hash")
        rank = (_method_rank(method), 0 if installed else 1,
                0 if plain and first.default else 1 if plain else first.family_operators,
                0 if first.default else 1, opclass)
        kinds.append((rank, IndexKind(
            method=method, opclass=None if first.default else opclass,
            extension=None if installed else first.extension, owner=first.extension,
            serves=tuple(op for op, _ in wanted))))
    return [kind for _, kind in sorted(kinds, key=lambda item: item[0])]


def choose(catalog: Mapping[str, tuple[OperatorSupport, ...]],
           needs: Iterable[tuple[str, str | None]], *, methods: Iterable[str] | None = None,
           ordered: bool = False, purpose: str = "search") -> IndexKind | None:
    """The best kind serving all of `needs` (`candidates`); None when nothing in the catalog
    serves them all."""
    found = candidates(catalog, needs, methods=methods, ordered=ordered, purpose=purpose)
    return found[0] if found else None


def brin_fits(catalog: Mapping[str, tuple[OperatorSupport, ...]],
              needs: Iterable[tuple[str, str | None]], correlation: float | None,
              fraction: float) -> IndexKind | None:
    """BRIN for a range: when the catalog has a BRIN class for every operator, the column follows
    the physical row order (|correlation| ≥ BRIN_MIN_CORRELATION) and the range keeps at least
    BRIN_MIN_FRACTION of the rows (below it a B-tree reads less)."""
    if correlation is None or abs(correlation) < BRIN_MIN_CORRELATION or fraction < BRIN_MIN_FRACTION:
        return None
    wanted = list(dict.fromkeys(needs))
    common: set[tuple[str, bool, str | None, bool]] | None = None
    for operator, left_type in wanted:
        here = {(s.opclass, s.default, s.extension, s.installed)
                for s in supports(catalog, operator, left_type) if s.method == "brin"}
        common = here if common is None else common & here
    if not common:
        return None
    opclass, default, extension, installed = min(common, key=lambda c: (not c[1], c[0]))
    return IndexKind("brin", None if default else opclass, None if installed else extension,
                     extension, tuple(op for op, _ in wanted))


def catalog_type(data_type: str) -> str:
    """A column's type as format_type prints it without a type modifier, the name the catalog
    keys use: "character varying(255)" → "character varying", "numeric(10,2)" → "numeric",
    "timestamp(3) with time zone" → "timestamp with time zone"."""
    return re.sub(r"\s+", " ", re.sub(r"\(\s*\d+(\s*,\s*\d+)?\s*\)", "", data_type)).strip()


# -- the WHERE terms an index of some kind may serve ---------------------------------------
@dataclass(frozen=True)
class WhereTerm:
    """A top-level WHERE term `<column or expression of one column> <operator> <constant>` of one
    SELECT, as PostgreSQL's parser reads it: the operator as written (`&&`, `@@`, `=`, …)."""

    qualifier: str | None  # the column's table or alias, as written
    column: str
    operator: str
    expression: str | None  # the left side when it is not the column itself, unqualified
    shown: str  # the term as written


def _unqualified(node: Any) -> Any:
    """A copy of an expression with its column references unqualified (an index key names the
    columns of its table alone)."""
    select: Any = pglast.parse_sql(f"SELECT {RawStream()(node)}")[0].stmt
    copy = select.targetList[0].val
    for ref in walk(copy):
        if isinstance(ref, pg_ast.ColumnRef) and ref.fields and len(ref.fields) > 1:
            ref.fields = ref.fields[-1:]
    return copy


def _select(sql: str) -> Any:
    """The one SELECT of `sql` as pglast reads it, else None."""
    try:
        statements = pglast.parse_sql(sql)
    except pglast.parser.ParseError:
        return None
    if len(statements) != 1 or not isinstance(statements[0].stmt, pg_ast.SelectStmt):
        return None
    return statements[0].stmt


def where_terms(sql: str) -> tuple[WhereTerm, ...]:
    """The WhereTerms of the query's top-level WHERE (none unless it is one SELECT)."""
    select = _select(sql)
    where = select.whereClause if select is not None else None
    if isinstance(where, pg_ast.BoolExpr) and where.boolop == BoolExprType.AND_EXPR:
        return _operator_terms(list(where.args or ()))
    return _operator_terms([where] if where is not None else [])


def order_terms(sql: str) -> tuple[WhereTerm, ...]:
    """The ORDER BY items of the query that are `column op constant` (a distance: `location <->
    point '(1,2)'`), as WhereTerms: what a nearest-neighbour index scan serves."""
    select = _select(sql)
    items = list(select.sortClause or ()) if select is not None else []
    return _operator_terms([item.node for item in items if isinstance(item, pg_ast.SortBy)])


def _operator_terms(terms: list[Any]) -> tuple[WhereTerm, ...]:
    found: list[WhereTerm] = []
    for term in terms:
        if (not isinstance(term, pg_ast.A_Expr) or term.kind != A_Expr_Kind.AEXPR_OP
                or not term.name or len(term.name) != 1 or term.lexpr is None or term.rexpr is None):
            continue
        if any(isinstance(n, pg_ast.ColumnRef | pg_ast.SubLink | pg_ast.ParamRef)
               for n in walk(term.rexpr)):
            continue  # not a constant
        left = list(walk(term.lexpr))
        refs = [n for n in left if isinstance(n, pg_ast.ColumnRef)]
        if len(refs) != 1 or any(isinstance(n, pg_ast.SubLink | pg_ast.ParamRef) for n in left):
            continue
        names = [getattr(f, "sval", None) for f in refs[0].fields or ()]
        if not names or len(names) > 2 or not all(isinstance(n, str) for n in names):
            continue
        plain = isinstance(term.lexpr, pg_ast.ColumnRef)
        found.append(WhereTerm(
            qualifier=str(names[0]) if len(names) == 2 else None, column=str(names[-1]),
            operator=str(term.name[0].sval),
            expression=None if plain else RawStream()(_unqualified(term.lexpr)),
            shown=RawStream()(term)))
    return tuple(found)
