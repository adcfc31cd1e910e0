"""The benchmark suite: four variants of one query, built by editing its parse tree (pure).

    baseline   the query as given (the user's text, without its terminating `;`)
    limit      with `LIMIT 10`
    filter     with an extra date-range predicate on a timestamp column of the main table
    sort       with an `ORDER BY` on top of the query

The edited variants come from sqlglot (dialect "postgres"), never from string
concatenation, and every SQL string this module returns has been re-parsed by
pglast (PostgreSQL's own parser) as exactly one SELECT. A variant that cannot
be built is left out with a reason, never emitted broken.

How results are compared (`QueryVariant.ordered` / `.exact`):

* `ordered` — the variant's ORDER BY fixes a total order, so results compare row
  by row. It does when one of these holds for the outermost query:
  1. it aggregates without GROUP BY (it returns at most one row);
  2. it has a plain GROUP BY (no ROLLUP/CUBE/GROUPING SETS) and the ORDER BY
     covers every GROUP BY key (rows are unique per key);
  3. SELECT DISTINCT ON (…) and the ORDER BY covers every DISTINCT ON key;
  4. the ORDER BY covers every output column (rows that tie are identical; for a
     set operation this is the only rule);
  5. it reads the main table alone (no join, no other FROM item), does not
     aggregate, and the ORDER BY covers every primary-key column of the main
     table. A join is never ordered by rule 5: the main table's key does not
     identify a joined row when the join can repeat it, and only the main
     table's key is known here.
  An ORDER BY item covers a target when it is the same expression (qualifiers
  ignored when the query reads one table), its output position (`ORDER BY 2`)
  or its output name. A set-returning function in the select list (unnest,
  generate_series, jsonb_array_elements, …) makes nothing ordered.
  Caveat of rule 4: values that sort equal yet print differently (numeric 1.0
  and 1.00, -0 and 0, nondeterministic collations) could still swap places.
* `exact` — False only when a LIMIT, OFFSET or FETCH (at any level, subqueries
  and CTEs included) applies to rows in no total order: the database may then
  legitimately return other rows, so only the row count is comparable.

`result_checksum_sql` wraps a variant into a query returning (row count,
checksum): an order-independent sum of row hashes for multiset comparison, an
md5 over the rows in their order for ordered comparison; `result_checksums_sql`
gives both in one run of the variant.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pglast import parser as pg_parser
from sqlglot import exp
from sqlglot.errors import ErrorLevel, SqlglotError

from afs.errors import InputError
from afs.models import ColumnStats, QueryVariant, TableInfo
from afs.pg.functions import ANONYMOUS_AGGREGATES, SET_RETURNING
from afs.pg.names import KEYWORDS, is_plain, name_parts
from afs.query.query import Query
from afs.query.shape import function_name
from afs.query.text import DIALECT, first_line, select_text

__all__ = [
    "RECENT_SHARE",
    "SUITE_LIMIT",
    "build_suite",
    "implied_limit",
    "result_checksum_sql",
    "result_checksums_sql",
]

SUITE_LIMIT = 10  # rows kept by the "limit" variant
RECENT_SHARE = 0.25  # share of histogram rows the "filter" variant keeps (at least)
FILTER_PAST_END = timedelta(days=1)  # hi = the last histogram bound + this
WRAP_ALIAS = "afs_q"  # the subquery alias of wrapped variants

_REWRITTEN = ("sqlglot re-rendered the rest of the query with differences PostgreSQL's parser can see "
              "(such as now() as CURRENT_TIMESTAMP, 'day' as 'DAY')")
_AST_NOISE = re.compile(r"location|stmt_len|.*list_start|.*list_end")


# -- public API -----------------------------------------------------------------------------


def build_suite(
    query: Query, main_table: TableInfo | None, main_alias: str | None,
) -> tuple[tuple[QueryVariant, ...], tuple[str, ...]]:
    """The suite's variants of `query` (read once: its tree is copied, never read again),
    and a reason for each variant left out.

    `main_table` is the table the query is mainly about (its `column_stats` should
    hold the statistics of the table's timestamp columns); `main_alias` is how the
    query names it, when it uses an alias.
    """
    baseline_sql = query.text
    try:
        tree = _editable(query)
    except SqlglotError as exc:
        reason = f"sqlglot cannot edit this query ({first_line(exc)})"
        baseline = QueryVariant("baseline", baseline_sql, ordered=False,
                                exact=not _pg_has_limit(baseline_sql))
        return (baseline,), tuple(f"{name}: {reason}" for name in ("limit", "filter", "sort"))

    main = _locate_main(tree, main_table, main_alias)
    ordered = _fixes_total_order(tree, main)
    variants = [QueryVariant("baseline", baseline_sql, ordered=ordered,
                             exact=_limits_deterministic(tree, main))]
    skipped: list[str] = []
    try:
        faithful = _same_tree(baseline_sql, _sql(tree))
    except SqlglotError:
        faithful = False
    for name, build in _BUILDERS:
        try:
            built = build(tree.copy(), main_table, main_alias)
        except SqlglotError as exc:  # unsupported by the generator: leave the variant out
            built = f"sqlglot cannot render it ({first_line(exc)})"
        if isinstance(built, str):
            skipped.append(f"{name}: {built}")
            continue
        variant = built
        problem = _pglast_problem(variant.sql)
        if problem:
            skipped.append(f"{name}: the edited query does not parse as one SELECT ({problem})")
            continue
        if not faithful:
            variant = _with_note(variant, _REWRITTEN)
        variants.append(variant)
    return tuple(variants), tuple(skipped)


@functools.lru_cache(maxsize=1024)
def result_checksum_sql(variant_sql: str, ordered: bool) -> str:
    """A query returning one row (afs_rows bigint, afs_checksum text) for the variant's result.

    Unordered (multiset) comparison: the sum, as numeric, of hashtextextended()
    of each row's text form — independent of row order, sensitive to duplicates.
    Ordered comparison: md5 of the rows' text forms joined in result order. The
    order is captured by `row_number() OVER ()` over the variant in a subquery;
    PostgreSQL numbers the rows in the order the subquery produces them (a window
    without PARTITION BY / ORDER BY needs no sort, and a subquery scan keeps its
    input's order) — an implementation property, not an SQL guarantee. Row texts
    depend on session settings (DateStyle, TimeZone, extra_float_digits): compare
    checksums taken under the same settings.
    """
    inner = _single_select(variant_sql)
    if ordered:
        sql = (f"SELECT count(*) AS afs_rows,\n       {_ORDERED_SUM} AS afs_checksum\n"
               + _NUMBERED_ROWS.format(inner=inner))
    else:
        sql = (f"SELECT count(*) AS afs_rows,\n       {_UNORDERED_SUM.format(row='afs_q')} AS afs_checksum\n"
               f"FROM (\n{inner}\n) AS afs_q")
    return _parsed(sql)


@functools.lru_cache(maxsize=1024)
def result_checksums_sql(variant_sql: str) -> str:
    """Both checksums of `result_checksum_sql` in one run of the query: one row (afs_rows,
    afs_ordered, afs_unordered), equal to the ordered and the unordered form's checksums."""
    inner = _single_select(variant_sql)
    return _parsed(f"SELECT count(*) AS afs_rows,\n       {_ORDERED_SUM} AS afs_ordered,\n"
                   f"       {_UNORDERED_SUM.format(row='afs_s.afs_r')} AS afs_unordered\n"
                   + _NUMBERED_ROWS.format(inner=inner))


_ORDERED_SUM = "coalesce(md5(string_agg(afs_s.afs_r::text, '|' ORDER BY afs_s.afs_n)), '')"
_UNORDERED_SUM = "coalesce(sum(hashtextextended({row}::text, 0)::numeric), 0)::text"
_NUMBERED_ROWS = ("FROM (SELECT afs_q AS afs_r, row_number() OVER () AS afs_n\n"
                  "      FROM (\n{inner}\n) AS afs_q) AS afs_s")


def _parsed(sql: str) -> str:
    problem = _pglast_problem(sql)
    if problem:  # pragma: no cover - the inner statement parsed on its own
        raise ValueError(f"checksum query does not parse: {problem}")
    return sql


def implied_limit(variant: QueryVariant) -> str | None:
    """Why measuring the "limit" variant adds nothing to the query as given, or None (pure).

    It adds nothing when the query as given has its own constant LIMIT (`own_limit`, which
    `_limit_variant` edits) that the variant keeps (the same query) or lowers to no less than
    half of it: its rows are the first of the query's own, by the same ORDER BY, and the plan
    that reads them is the query's own, stopping a little sooner. A LIMIT lowered further
    (LIMIT 1000 to 10) may call for another plan (a fast start), so that variant is measured."""
    own = variant.own_limit if variant.name == "limit" else None
    if own is None or own > SUITE_LIMIT * 2:
        return None
    kept = min(own, SUITE_LIMIT)
    how = "the same query" if own == kept else f"{kept} of its rows, by the same plan stopping sooner"
    return f"limit: not measured: the query as given has its own LIMIT {own} ({how})"


# -- statements -------------------------------------------------------------------------------


def _single_select(query: str) -> str:
    """The text of the one SELECT statement in `query`, without the terminating `;`."""
    try:
        return select_text(query)
    except InputError as exc:
        raise ValueError(str(exc)) from exc


def _pglast_problem(sql: str) -> str | None:
    """Why `sql` is not exactly one SELECT statement for PostgreSQL (None when it is)."""
    try:
        select_text(sql)
    except InputError as exc:
        return str(exc)
    return None


def _pg_has_limit(sql: str) -> bool:
    text = pg_parser.parse_sql_json(sql)
    return any(key in text for key in ('"limitCount"', '"limitOffset"'))


def _same_tree(a: str, b: str) -> bool:
    """Whether PostgreSQL parses both texts to the same tree (positions ignored)."""
    try:
        return bool(_stripped(json.loads(pg_parser.parse_sql_json(a)))
                    == _stripped(json.loads(pg_parser.parse_sql_json(b))))
    except pg_parser.ParseError:
        return False


def _stripped(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _stripped(v) for k, v in node.items() if not _AST_NOISE.fullmatch(k)}
    if isinstance(node, list):
        return [_stripped(v) for v in node]
    return node


def _editable(query: Query) -> exp.Query:
    """The query's tree (shared: the builders edit copies), or SqlglotError why not."""
    if query.tree is None:
        raise SqlglotError(query.problem or "sqlglot cannot read it")
    if not isinstance(query.tree, exp.Select | exp.SetOperation):
        raise SqlglotError(f"sqlglot reads it as {type(query.tree).__name__}, not a SELECT")
    return query.tree


def _sql(tree: exp.Expr) -> str:
    return tree.sql(dialect=DIALECT, unsupported_level=ErrorLevel.RAISE)


def _with_note(variant: QueryVariant, note: str) -> QueryVariant:
    joined = f"{variant.note}; {note}" if variant.note else note
    return QueryVariant(variant.name, variant.sql, variant.ordered, variant.exact, joined)


# -- the main table in the tree -----------------------------------------------------------------


@dataclass(frozen=True)
class _Main:
    """Where the main table is read: the SELECT whose own FROM lists it, and its name there."""

    select: exp.Select
    table: exp.Table
    info: TableInfo

    @property
    def ref(self) -> exp.Identifier:
        alias = self.table.args.get("alias")
        if isinstance(alias, exp.TableAlias) and isinstance(alias.this, exp.Identifier):
            return alias.this
        ident = self.table.this
        assert isinstance(ident, exp.Identifier)
        return ident

    @property
    def ref_name(self) -> str:
        return self.ref.name


def _from_items(select: exp.Select) -> list[exp.Expr]:
    items: list[exp.Expr] = []
    from_ = select.args.get("from_")
    if isinstance(from_, exp.From) and from_.this is not None:
        items.append(from_.this)
    for join in select.args.get("joins") or ():
        if isinstance(join, exp.Join) and join.this is not None:
            items.append(join.this)
    return items


def _single_source(select: exp.Select) -> bool:
    return len(_from_items(select)) == 1


def _cte_names(tree: exp.Expr) -> set[str]:
    with_ = tree.args.get("with_")
    if not isinstance(with_, exp.With):
        return set()
    return {cte.alias_or_name.lower() for cte in with_.expressions if isinstance(cte, exp.CTE)}


def _candidate_scopes(tree: exp.Query) -> list[exp.Select]:
    """The SELECTs where the main table may be read: the outermost, its CTEs, its FROM subqueries."""
    scopes: list[exp.Select] = []
    if isinstance(tree, exp.Select):
        scopes.append(tree)
    with_ = tree.args.get("with_")
    if isinstance(with_, exp.With):
        scopes += [cte.this for cte in with_.expressions
                   if isinstance(cte, exp.CTE) and isinstance(cte.this, exp.Select)]
    if isinstance(tree, exp.Select):
        scopes += [item.this for item in _from_items(tree)
                   if isinstance(item, exp.Subquery) and isinstance(item.this, exp.Select)]
    return scopes


def _locate_main(tree: exp.Query, info: TableInfo | None, alias: str | None) -> _Main | None:
    if info is None:
        return None
    wanted = name_parts(info.name)  # raw parts, as the (normalized) tree holds them
    shadowed = _cte_names(tree)
    alias_l = alias.lower() if alias else None
    for select in _candidate_scopes(tree):
        matches: list[exp.Table] = []
        for item in _from_items(select):
            if not isinstance(item, exp.Table) or not isinstance(item.this, exp.Identifier):
                continue
            name = item.name
            if name != wanted[-1] or (len(wanted) > 1 and item.db not in ("", wanted[-2])):
                continue
            if not item.db and name in shadowed:
                continue
            matches.append(item)
        if alias_l:
            matches.sort(key=lambda t: t.alias_or_name.lower() != alias_l)
        if matches:
            return _Main(select, matches[0], info)
    return None


# -- what a SELECT does ----------------------------------------------------------------------------


def _leftmost_select(query: exp.Expr) -> exp.Select | None:
    node: exp.Expr | None = query
    while isinstance(node, exp.SetOperation | exp.Subquery):
        node = node.this
    return node if isinstance(node, exp.Select) else None


def _outputs(query: exp.Expr) -> list[exp.Expr] | None:
    """The output expressions (of the leftmost SELECT of a set operation); None when there is a star."""
    select = _leftmost_select(query)
    if select is None or any(e.is_star for e in select.expressions):
        return None
    return list(select.expressions)


def _belongs_to(node: exp.Expr, select: exp.Expr) -> bool:
    """Whether an aggregate call is computed by `select` (not by a subquery, not as a window)."""
    child, parent = node, node.parent
    while parent is not None:
        if isinstance(parent, exp.Window) and child.arg_key == "this":
            return False
        if isinstance(parent, exp.Select | exp.SetOperation):
            return parent is select
        child, parent = parent, parent.parent
    return False


def _is_aggregate(select: exp.Select) -> bool:
    if select.args.get("group") or select.args.get("having"):
        return True
    for output in select.expressions:
        for func in output.find_all(exp.Func, exp.WithinGroup):
            is_agg = isinstance(func, exp.AggFunc | exp.WithinGroup) or (
                isinstance(func, exp.Anonymous) and function_name(func) in ANONYMOUS_AGGREGATES)
            if is_agg and _belongs_to(func, select):
                return True
    return False


def _has_set_returning(select: exp.Select) -> bool:
    for output in select.expressions:
        for func in output.find_all(exp.Func):
            if isinstance(func, exp.Explode | exp.Unnest) or function_name(func) in SET_RETURNING:
                return True
    return False


def _plain_group(group: exp.Group) -> bool:
    if any(group.args.get(key) for key in ("grouping_sets", "cube", "rollup", "totals")):
        return False
    return not any(group.find_all(exp.Rollup, exp.Cube, exp.GroupingSets))


def _ordinal(expr: exp.Expr) -> int | None:
    if isinstance(expr, exp.Literal) and not expr.is_string and str(expr.this).isdigit():
        return int(expr.this)
    return None


class _Keys:
    """Comparable names of expressions within one query: what an ORDER BY item covers."""

    def __init__(self, query: exp.Query) -> None:
        self.outputs = _outputs(query)
        self.single = isinstance(query, exp.Select) and _single_source(query)

    def expr(self, e: exp.Expr) -> set[str]:
        if isinstance(e, exp.Column) and not e.is_star:
            return {f"col:{e.name}"} if self.single or not e.table else {f"col:{e.table}.{e.name}"}
        return {e.sql(dialect=DIALECT)}

    def output(self, index: int) -> set[str]:
        """Keys of output column `index` (1-based)."""
        keys = {f"#{index}"}
        if self.outputs is not None and 1 <= index <= len(self.outputs):
            keys |= self.expr(self.outputs[index - 1].unalias())
        return keys

    def item(self, e: exp.Expr) -> set[str]:
        """Keys of an ORDER BY / GROUP BY item: itself, or the output it names by position or name."""
        position = _ordinal(e)
        if position is not None:
            return self.output(position)
        keys = self.expr(e)
        if isinstance(e, exp.Column) and not e.table and self.outputs is not None:
            for index, output in enumerate(self.outputs, start=1):
                if output.alias_or_name == e.name:
                    keys |= self.output(index)
        return keys


def _order_keys(query: exp.Query, keys: _Keys) -> set[str]:
    order = query.args.get("order")
    found: set[str] = set()
    if isinstance(order, exp.Order):
        for item in order.expressions:
            found |= keys.item(item.this if isinstance(item, exp.Ordered) else item)
    return found


def _pk_keys(main: _Main, keys: _Keys) -> list[set[str]]:
    return [keys.expr(exp.column(col, main.ref_name)) for col in main.info.primary_key]


def _fixes_total_order(query: exp.Query, main: _Main | None) -> bool:
    """Rules 1-5 of the module docstring."""
    if isinstance(query, exp.Subquery) and isinstance(query.this, exp.Query):
        return _fixes_total_order(query.this, main)
    keys = _Keys(query)
    ordered = _order_keys(query, keys)

    def covered(targets: Iterable[set[str]]) -> bool:
        return all(target & ordered for target in targets)

    outputs_rule = keys.outputs is not None and bool(ordered) and covered(
        keys.output(i) for i in range(1, len(keys.outputs) + 1))
    if not isinstance(query, exp.Select):
        return isinstance(query, exp.SetOperation) and outputs_rule
    if _has_set_returning(query):
        return False
    aggregate = _is_aggregate(query)
    group = query.args.get("group")
    if aggregate and not group:
        return True  # rule 1
    if not ordered:
        return False
    if isinstance(group, exp.Group) and _plain_group(group) and covered(
            keys.item(g) for g in group.expressions):
        return True  # rule 2
    distinct = query.args.get("distinct")
    on = distinct.args.get("on") if isinstance(distinct, exp.Distinct) else None
    if isinstance(on, exp.Tuple) and covered(keys.item(e) for e in on.expressions):
        return True  # rule 3
    if outputs_rule:
        return True  # rule 4
    return (not aggregate and main is not None and main.select is query and keys.single
            and bool(main.info.primary_key) and covered(_pk_keys(main, keys)))  # rule 5


def _has_limit(query: exp.Expr) -> bool:
    """LIMIT, OFFSET or FETCH FIRST (sqlglot keeps FETCH FIRST as an exp.Fetch under "limit")."""
    return bool(query.args.get("limit") or query.args.get("offset"))


def _limits_deterministic(tree: exp.Query, main: _Main | None) -> bool:
    """False when some LIMIT/OFFSET/FETCH in the tree cuts rows that are in no total order."""
    for node in tree.find_all(exp.Select, exp.SetOperation):
        if _has_limit(node) and not _fixes_total_order(node, main):
            return False
    return True


# -- the variants ------------------------------------------------------------------------------------


def _limit_variant(tree: exp.Query, main_table: TableInfo | None,
                   main_alias: str | None) -> QueryVariant | str:
    main = _locate_main(tree, main_table, main_alias)
    limit = tree.args.get("limit")
    count = limit.expression if isinstance(limit, exp.Limit) else None
    own = _ordinal(count) if count is not None else None
    if isinstance(tree, exp.Select) and (limit is None or own is not None):
        edited = tree.limit(SUITE_LIMIT if own is None else min(own, SUITE_LIMIT), copy=False)
        note = (f"LIMIT {SUITE_LIMIT} added" if own is None
                else f"the query's LIMIT {own} kept (not above {SUITE_LIMIT})" if own <= SUITE_LIMIT
                else f"the query's LIMIT {own} lowered to {SUITE_LIMIT}")
        return QueryVariant("limit", _sql(edited), ordered=_fixes_total_order(edited, main),
                            exact=_limits_deterministic(edited, main), note=note, own_limit=own)
    # a set operation, LIMIT $n / LIMIT ALL, or FETCH FIRST: limit the whole query from outside
    why = ("a set operation" if isinstance(tree, exp.SetOperation)
           else "FETCH FIRST" if isinstance(limit, exp.Fetch)
           else f"LIMIT {_sql(count)}" if count is not None else "its own row limit")
    wrapped = exp.select("*").from_(tree.subquery(WRAP_ALIAS, copy=False)).limit(SUITE_LIMIT)
    # the outer SELECT * keeps the inner query's order (a subquery scan does not reorder)
    ordered = _fixes_total_order(tree, main)
    return QueryVariant("limit", _sql(wrapped), ordered=ordered,
                        exact=ordered and _limits_deterministic(tree, main),
                        note=f"wrapped in SELECT * FROM (…) AS {WRAP_ALIAS} LIMIT {SUITE_LIMIT} ({why})")


def _is_timestamp(data_type: str) -> bool:
    data_type = data_type.lower()
    return not data_type.endswith("]") and (data_type == "date" or data_type.startswith("timestamp"))


def _referenced(select: exp.Select, main: _Main) -> list[str]:
    """Columns of the main table used in the WHERE, then in the ORDER BY, of its SELECT."""
    names: list[str] = []
    for part in (select.args.get("where"), select.args.get("order")):
        if part is None:
            continue
        for column in part.find_all(exp.Column):
            if column.table in ("", main.ref_name) and column.name not in names:
                names.append(column.name)
    return names


def _parse_bound(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text.strip().strip('"'))
    except ValueError:  # infinity, BC dates, a non-ISO DateStyle
        return None


@dataclass(frozen=True)
class _Range:
    lo: datetime
    hi: datetime
    bounds: int
    share: float  # estimated share of the table's rows in [lo, hi)


def _recent_range(stats: ColumnStats) -> _Range | str:
    """[lo, hi) holding about the newest RECENT_SHARE of the histogram's rows.

    With m finite histogram bounds b[0] ≤ … ≤ b[m-1] (m-1 equal-frequency buckets),
    lo = b[i] with i = floor((1 - RECENT_SHARE) * (m - 1)), so the buckets from lo
    up hold (m-1-i)/(m-1) ≥ RECENT_SHARE of the histogram's rows; hi = b[m-1] +
    FILTER_PAST_END, just past the largest sampled value.
    """
    parsed = [b for b in (_parse_bound(text) for text in stats.histogram_bounds) if b is not None]
    if len(parsed) < 2:
        return "fewer than two usable histogram bounds" if stats.histogram_bounds else "no histogram"
    if len({b.tzinfo is None for b in parsed}) > 1:
        return "histogram bounds mix zoned and unzoned values"
    bounds = sorted(parsed)
    m = len(bounds)
    i = math.floor((1 - RECENT_SHARE) * (m - 1))
    lo = bounds[i]
    try:
        hi = bounds[-1] + FILTER_PAST_END
    except OverflowError:
        return "the last histogram bound is too close to the end of the calendar"
    hist_share = (m - 1 - i) / (m - 1)
    mcv_total = sum(stats.most_common_freqs)
    share = hist_share * max(0.0, 1.0 - stats.null_frac - mcv_total)
    for text, freq in zip(stats.most_common_vals, stats.most_common_freqs, strict=False):
        value = _parse_bound(text)
        if value is not None and (value.tzinfo is None) == (lo.tzinfo is None) and lo <= value < hi:
            share += freq
    return _Range(lo, hi, m, share)


def _literal(value: datetime, data_type: str) -> str:
    """Text PostgreSQL reads back as the same value of the column's type (ISO 8601)."""
    if data_type.lower() == "date":
        return value.date().isoformat()
    return value.isoformat(sep=" ")


def _identifier(name: str) -> exp.Identifier:
    return exp.to_identifier(name, quoted=not is_plain(name, keywords=KEYWORDS))


def _column(name: str, main: _Main) -> exp.Column:
    """`name` of the main table, qualified as its SELECT names the table."""
    return exp.Column(this=_identifier(name), table=main.ref.copy())


def _filter_variant(tree: exp.Query, main_table: TableInfo | None,
                    main_alias: str | None) -> QueryVariant | str:
    if main_table is None:
        return "the main table is unknown: no date-range predicate to add"
    stamps = [c for c in main_table.columns if _is_timestamp(c.data_type)]
    if not stamps:
        return f"no timestamp column on {main_table.name}: the suite has three queries"
    if isinstance(tree, exp.SetOperation):
        return "a set operation has no single scope for a date-range predicate"
    main = _locate_main(tree, main_table, main_alias)
    if main is None:
        return (f"{main_table.name} is not read by the FROM of the query, of its CTEs or of its "
                "FROM subqueries")
    by_name = {c.name: c for c in stamps}
    used = [name for name in _referenced(main.select, main) if name in by_name]
    preference = [*used, *(["created_at"] if "created_at" in by_name else []), *by_name]
    candidates = list(dict.fromkeys(preference))
    problems: list[str] = []
    for name in candidates:
        stats = main_table.column_stats.get(name)
        found = _recent_range(stats) if stats is not None else "no statistics"
        if isinstance(found, str):
            problems.append(f"{main_table.name}.{name}: {found}")
            continue
        column = by_name[name]
        lo, hi = _literal(found.lo, column.data_type), _literal(found.hi, column.data_type)

        predicate = exp.and_(
            exp.GTE(this=_column(name, main), expression=exp.Literal.string(lo)),
            exp.LT(this=_column(name, main), expression=exp.Literal.string(hi)),
        )
        main.select.where(predicate, append=True, copy=False)
        where = "in a CTE or subquery" if main.select is not tree else "in the WHERE"
        note = (f"{main.ref_name}.{name} >= '{lo}' AND < '{hi}' {where}: from the "
                f"{round((1 - RECENT_SHARE) * 100)}th percentile of "
                f"{found.bounds} histogram bounds to just past the last; keeps ≈{found.share:.0%} of rows")
        return QueryVariant("filter", _sql(tree), ordered=_fixes_total_order(tree, main),
                            exact=_limits_deterministic(tree, main), note=note)
    return "no usable statistics for a timestamp column (" + "; ".join(problems) + ") — run ANALYZE?"


def _ordered_items(items: Sequence[exp.Expr]) -> list[exp.Ordered]:
    return [exp.Ordered(this=item.copy(), nulls_first=False) for item in items]


def _selects_all_of(select: exp.Select, main: _Main) -> bool:
    """Whether the select list has `*` or `<main>.*`."""
    for output in select.expressions:
        if isinstance(output, exp.Star):
            return True
        if isinstance(output, exp.Column) and output.is_star and output.table == main.ref_name:
            return True
    return False


def _sort_targets(tree: exp.Query, main: _Main | None) -> tuple[list[exp.Expr], str] | str:
    """What the sort variant orders by (before dropping what the ORDER BY has), and why."""
    outputs = _outputs(tree)
    by_position: tuple[list[exp.Expr], str] | None = None
    if outputs is not None:
        by_position = [exp.Literal.number(i) for i in range(1, len(outputs) + 1)], "every output column"
    if isinstance(tree, exp.SetOperation):
        return by_position or "a set operation with * in its select list: no output column to sort by"
    assert isinstance(tree, exp.Select)
    group = tree.args.get("group")
    if _is_aggregate(tree) and not group:
        return "the query aggregates to a single row: nothing to sort"
    if isinstance(group, exp.Group):
        if _plain_group(group) and group.expressions:
            return list(group.expressions), "the GROUP BY keys"
        return by_position or "grouping sets with * in the select list: nothing to sort by"
    distinct = tree.args.get("distinct")
    keyed = main if main is not None and main.select is tree and main.info.primary_key else None
    if isinstance(distinct, exp.Distinct) and not distinct.args.get("on"):
        # SELECT DISTINCT may only order by what it selects: its outputs, or the key a * selects
        if by_position is not None:
            return by_position
        if keyed is None or not _selects_all_of(tree, keyed):
            return "SELECT DISTINCT with a * that does not select the main table's primary key"
    if keyed is not None:
        pk: list[exp.Expr] = [_column(col, keyed) for col in keyed.info.primary_key]
        on = distinct.args.get("on") if isinstance(distinct, exp.Distinct) else None
        if isinstance(on, exp.Tuple) and not tree.args.get("order"):
            return [*on.expressions, *pk], "the DISTINCT ON keys, then the primary key"
        return pk, f"the primary key of {keyed.info.name}"
    if by_position is not None:
        return by_position
    if not tree.args.get("order"):
        return [exp.Literal.number(1)], "the first output column"
    return "no primary key of the main table in scope and * in the select list: nothing to add"


def _sort_variant(tree: exp.Query, main_table: TableInfo | None,
                  main_alias: str | None) -> QueryVariant | str:
    main = _locate_main(tree, main_table, main_alias)
    found = _sort_targets(tree, main)
    if isinstance(found, str):
        return found
    targets, what = found
    keys = _Keys(tree)
    present = _order_keys(tree, keys)
    missing = [t for t in targets if not (keys.item(t) & present)]
    had_order = tree.args.get("order") is not None
    if not missing:
        return f"the query already orders by {what}: the sort variant would repeat the baseline"
    tree.order_by(*_ordered_items(missing), append=True, copy=False)
    shown = ", ".join(_sql(t) for t in missing)
    note = (f"ORDER BY … {shown} appended ({what}, as a tie-breaker)" if had_order
            else f"ORDER BY {shown} added ({what})")
    ordered = _fixes_total_order(tree, main)
    return QueryVariant("sort", _sql(tree), ordered=ordered,
                        exact=_limits_deterministic(tree, main), note=note)


_Builder = Callable[[exp.Query, TableInfo | None, str | None], QueryVariant | str]
_BUILDERS: tuple[tuple[str, _Builder], ...] = (
    ("limit", _limit_variant), ("filter", _filter_variant), ("sort", _sort_variant),
)
