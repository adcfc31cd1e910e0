"""What every strategist looks at, and what it decides (pure).

    Evidence      the plan (`afs.pg.plan`), the statistics and the query (`afs.query`, read once),
                  organised by table: scans, rows visited and returned, column uses, ranges
    Decision      one decision gives both the seed's AnalysisResult and the proposal
    nothing       the Decision to propose nothing, and why
    existing      covering_index (don't propose what exists), index_keys / index_method /
    indexes       index_predicate (read an index definition as pg_get_indexdef prints it)
    estimates     time_share, predicted_improvement, write_risk, range_estimate
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from sqlglot import exp

from afs.errors import InputError
from afs.models import (
    AnalysisContext,
    AnalysisResult,
    ColumnStats,
    ColumnUse,
    IndexInfo,
    OptimizationProposal,
    RiskLevel,
    TableInfo,
)
from afs.pg.plan import PlanNode, plan_insights, plan_nodes
from afs.pg.stats import DEFAULT_RANGE_SEL, range_fraction
from afs.query.opclasses import IndexKind, WhereTerm, catalog_type, choose, order_terms, supports, where_terms
from afs.query.query import Query
from afs.query.shape import IndexablePredicate, QueryShape, Resolver, query_shape

# -- tunables shared by the rule modules ---------------------------------------------------
FAST_MS: Final = 1.0  # a query this fast leaves nothing to measure
SMALL_TABLE_ROWS: Final = 10_000  # scanning fewer rows is cheap: no index for it
WRITE_HEAVY: Final = 1.0  # writes per read above which each index is a visible write cost
RANGE_OPS: Final = frozenset({"<", "<=", ">", ">=", "BETWEEN"})


# -- existing indexes ----------------------------------------------------------------------
def norm_column(text: str) -> str:
    text = re.sub(r"\s+(ASC|DESC)\b.*$", "", text.strip(), flags=re.IGNORECASE)
    return text.strip('"').lower()


def _norm_key(text: str) -> str:
    """An index key column or expression, comparable with what pg_get_indexdef prints:
    `lower(email)`, `(payload ->> 'kind'::text)` and `payload->>'kind'` all normalise alike."""
    return _norm_predicate(norm_column(text))


def index_keys(index: IndexInfo) -> tuple[list[str], str] | None:
    """The key items of an index definition as written, operator classes included, and what
    follows them (INCLUDE, WHERE …): `CREATE INDEX i ON t USING btree (email text_pattern_ops, id)
    WHERE x` → (["email text_pattern_ops", "id"], " WHERE x"). None when it has no key list."""
    definition = index.definition
    m = re.search(r"\bUSING\s+\w+\s*\(", definition, re.IGNORECASE)
    if not m:
        return None
    items: list[str] = []
    depth, start, quoted = 1, m.end(), False
    for i in range(m.end(), len(definition)):
        ch = definition[i]
        if ch == "'":
            quoted = not quoted
        elif quoted:
            continue
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                items.append(definition[start:i].strip())
                return items, definition[i + 1:]
        elif ch == "," and depth == 1:
            items.append(definition[start:i].strip())
            start = i + 1
    return None


def index_method(index: IndexInfo) -> str:
    m = re.search(r"\bUSING\s+(\w+)", index.definition, re.IGNORECASE)
    return m.group(1).lower() if m else "btree"


def index_predicate(index: IndexInfo) -> str | None:
    m = re.search(r"\bWHERE\s+(.*)$", index.definition, re.IGNORECASE | re.DOTALL)
    return m.group(1).strip() if m else None


def _norm_predicate(text: str) -> str:
    text = re.sub(r"::[a-z ]+(\([^)]*\))?(\[\])?", "", text.lower())
    return re.sub(r"[\s()\"]+", "", text)


def covering_index(table: TableInfo, equality: Iterable[str], rest: Sequence[str] = (),
                   predicate: str | None = None, method: str = "btree",
                   opclasses: Mapping[str, str] | None = None) -> IndexInfo | None:
    """An existing index that already serves this key, or None.

    It must start with the `equality` columns (in any order), then `rest` in order
    (columns or expressions such as `lower(email)`); a partial index counts only with the
    same predicate; a column of `opclasses` only with that operator class."""
    eq = {_norm_key(c) for c in equality}
    want = [_norm_key(c) for c in rest]
    classes = {_norm_key(c): o.lower() for c, o in (opclasses or {}).items()}
    width = len(eq) + len(want)
    if width == 0:
        return None
    for index in table.indexes:
        if index_method(index) != method:
            continue
        cols = [_norm_key(c) for c in index.columns]
        if len(cols) < width or set(cols[: len(eq)]) != eq or cols[len(eq): width] != want:
            continue
        if classes:
            found = index_keys(index)
            items = found[0] if found else []
            if any(c in classes and (p >= len(items) or classes[c] not in items[p].lower())
                   for p, c in enumerate(cols[:width])):
                continue
        theirs = index_predicate(index)
        if theirs is not None and (predicate is None
                                   or _norm_predicate(theirs) != _norm_predicate(predicate)):
            continue
        return index
    return None


# -- the operators of the WHERE clause -------------------------------------------------------
@dataclass(frozen=True)
class OperatorTerm:
    """A top-level WHERE term `<column or expression of one column> <operator> <constant>`, with
    the operator as PostgreSQL's parser reads it (`&&`, `@@`, `@>`, `<<`, …): what an index of
    the kind the catalog says serves that operator can answer."""

    table: str
    column: str  # the column it reads
    operator: str
    expression: str | None  # the key when the left side is an expression of the column, as
    #                         pg_get_indexdef prints it (AnalysisContext.index_expressions)
    data_type: str | None  # the left side's type as the catalog names it (None: not known)
    shown: str  # the term as written


# -- evidence: the plan, the statistics and the query, indexed by table ---------------------
def _reltuples(ctx: AnalysisContext) -> dict[str, float]:
    """Each table's row count (reltuples) by the relation name EXPLAIN prints (bare, unquoted):
    what a Seq Scan of a plan that was not run visits."""
    found: dict[str, float] = {}
    for name, info in ctx.tables.items():
        found.setdefault(name.rsplit(".", 1)[-1].strip('"'), float(max(info.rows, 0)))
    return found


class Evidence:
    """Everything a strategist looks at, organised by table."""

    def __init__(self, ctx: AnalysisContext) -> None:
        self.ctx = ctx
        try:  # the one reading of the query, shared by every strategist of every agent
            self.query: Query | None = Query.read(ctx.query)
        except InputError:
            self.query = None
        self.resolver = Resolver(ctx, self.query)
        self.shape = (query_shape(self.query, self.resolver) if self.query is not None
                      else QueryShape(tree=None))
        # a plan that was not run (a slow query) reads the planner's estimates (afs.pg.plan)
        self.nodes = plan_nodes(ctx.plan, reltuples=_reltuples(ctx), execution_ms=ctx.execution_ms)
        self._uses: dict[str, list[ColumnUse]] = {}
        for use in ctx.features.columns:
            table = (self.resolver.table_key(use.table) if use.table
                     else self.resolver.table_of(None, use.column))
            if table is not None:
                self._uses.setdefault(table, []).append(use)

    # tables
    def table(self, name: str) -> TableInfo | None:
        return self.ctx.tables.get(name)

    def query_tables(self) -> list[str]:
        """The query's tables, the most expensively scanned first, then the main table."""
        names = [t for t in dict.fromkeys(self.resolver.query_tables) if t in self.ctx.tables]
        names += [t for t in self.ctx.tables if t not in names]
        main = self.resolver.table_key(self.ctx.features.main_table)
        return sorted(names, key=lambda t: (-self.scanned_rows(t), t != main))

    def main_table(self) -> str | None:
        main = self.resolver.table_key(self.ctx.features.main_table)
        if main in self.ctx.tables:
            return main
        tables = self.query_tables()
        return tables[0] if tables else None

    # plan
    def scans(self, table: str) -> list[PlanNode]:
        return [n for n in self.nodes
                if n.is_scan and n.relation and self.resolver.table_key(n.relation) == table]

    def scanned_rows(self, table: str) -> float:
        return sum(n.scanned for n in self.scans(table))

    def visited_rows(self, table: str) -> float:
        """Rows the plan's scans of `table` visit; all its rows when the plan has none."""
        if self.scans(table):
            return self.scanned_rows(table)
        info = self.table(table)
        return float(max(info.rows, 1)) if info else 1.0

    def returned_rows(self, table: str) -> float | None:
        scans = self.scans(table)
        return sum(n.rows for n in scans) if scans else None

    def scan_ms(self, table: str) -> float:
        return sum(n.self_ms for n in self.scans(table))

    def seq_scanned(self, table: str) -> bool:
        return any(n.node_type == "Seq Scan" for n in self.scans(table))

    @property
    def analysed(self) -> bool:
        """EXPLAIN ran the plan (actual rows, loops, times); False: the planner's estimates only
        (a query slower than the statement timeout, `AnalysisContext.slow`)."""
        return bool(self.nodes) and self.nodes[0].analyzed

    def aggregated_columns(self, table: str) -> list[str]:
        """The columns of `table` the query reads inside an aggregate function."""
        if self.query is None or self.query.tree is None:
            return []
        found: list[str] = []
        for agg in self.query.tree.find_all(exp.AggFunc):
            for column in agg.find_all(exp.Column):
                if column.name and column.name not in found and (
                        self.resolver.table_key(self.query.table_of(column, self.ctx.tables)) == table):
                    found.append(column.name)
        return found

    def observed_fraction(self, table: str) -> float | None:
        """rows / (rows + removed) of the Seq Scans of `table` that filter (of a plan that was not
        run, those the planner runs least often: a SubPlan's scans filter on their outer row)."""
        seq = [n for n in self.scans(table) if n.node_type == "Seq Scan" and n.filter]
        if seq and not self.analysed:
            seq = [n for n in seq if n.loops == min(m.loops for m in seq)]
        scanned = sum(n.scanned for n in seq)
        return sum(n.rows for n in seq) / scanned if scanned else None

    # query
    def uses(self, table: str, *roles: str) -> list[ColumnUse]:
        return [u for u in self._uses.get(table, []) if not roles or u.role in roles]

    def ranges(self, table: str) -> dict[str, list[ColumnUse]]:
        """column → its range predicates (<, <=, >, >=, BETWEEN) on `table`."""
        by_column: dict[str, list[ColumnUse]] = {}
        for u in self.uses(table, "range"):
            if (u.operator or "").upper() in RANGE_OPS:
                by_column.setdefault(u.column, []).append(u)
        return by_column

    def stats(self, table: str, column: str) -> ColumnStats | None:
        info = self.table(table)
        return info.column_stats.get(column) if info else None

    def referenced_columns(self, table: str) -> list[str]:
        return list(dict.fromkeys(u.column for u in self.uses(table) if u.column != "*"))

    def writes_per_read(self, table: str | None) -> float:
        info = self.table(table) if table else None
        return info.writes_per_read if info else 0.0

    def only_filter(self, table: str) -> bool:
        """The WHERE clause has exactly one top-level term on `table`: what the plan's Seq Scan
        on it kept is that term's selectivity."""
        return self.shape.filters.get(table, 0) == 1

    def indexable(self, table: str) -> list[IndexablePredicate]:
        return [p for p in self.shape.indexable if p.table == table]

    @functools.cached_property
    def operator_terms(self) -> tuple[OperatorTerm, ...]:
        """The WHERE terms `column op constant` (or `f(column, constants) op constant`) of the
        query, with a symbolic operator (OperatorTerm)."""
        return self._operator_terms(where_terms(self.ctx.query))

    @functools.cached_property
    def ordering_terms(self) -> tuple[OperatorTerm, ...]:
        """The ORDER BY items `column op constant` of the query (a distance), as OperatorTerms."""
        return tuple(t for t in self._operator_terms(order_terms(self.ctx.query)) if t.expression is None)

    def _operator_terms(self, terms: Iterable[WhereTerm]) -> tuple[OperatorTerm, ...]:
        found: list[OperatorTerm] = []
        for term in terms:
            table = self.resolver.table_of(term.qualifier, term.column)
            info = self.table(table) if table else None
            if table is None or info is None or not any(c.name == term.column for c in info.columns):
                continue
            expression = term.expression
            if expression is None:
                data_type: str | None = catalog_type(
                    next(c.data_type for c in info.columns if c.name == term.column))
            else:
                known = self.ctx.index_expressions.get((table, expression))
                if known is None and self.catalog_read:
                    continue  # PostgreSQL does not take it as an index key (not immutable)
                data_type, expression = known if known is not None else (None, expression)
            found.append(OperatorTerm(table=table, column=term.column, operator=term.operator,
                                      expression=expression, data_type=data_type, shown=term.shown))
        return tuple(found)

    def catalog_kind(self, needs: Iterable[tuple[str, str | None]], *,
                     methods: Iterable[str] | None = None, ordered: bool = False,
                     purpose: str = "search") -> IndexKind | None:
        """The index kind the fork's catalog says serves `needs` (afs.query.opclasses.choose)."""
        return choose(self.ctx.operator_classes, needs, methods=methods, ordered=ordered, purpose=purpose)

    def catalog_serves(self, operator: str, left_type: str | None, method: str,
                       opclass: str | None) -> bool:
        """The class `opclass` of `method` (None: the type's default) serves the operator."""
        return any(s.method == method and (s.opclass == opclass if opclass else s.default)
                   for s in supports(self.ctx.operator_classes, operator, left_type))

    def catalog_serves_order(self, operator: str, left_type: str | None, index: IndexInfo,
                             method: str) -> bool:
        """An existing index's first key class orders by the operator (pg_amop, ordering purpose)."""
        found = index_keys(index)
        first = found[0][0].split() if found and found[0] else []
        opclass = first[1] if len(first) > 1 and first[1].upper() not in ("ASC", "DESC", "NULLS") else None
        return any(s.method == method and s.purpose == "order"
                   and (s.opclass == opclass if opclass else s.default)
                   for s in supports(self.ctx.operator_classes, operator, left_type))

    @property
    def catalog_read(self) -> bool:
        """The analysis read the operator classes from the fork's catalog."""
        return bool(self.ctx.operator_classes)


# -- what a strategist decides --------------------------------------------------------------
@dataclass(frozen=True)
class Decision:
    insights: tuple[str, ...]
    actions: tuple[str, ...]
    confidence: float
    target_table: str | None
    estimated_improvement: float  # percent, 0 when nothing is proposed
    proposal: OptimizationProposal | None  # the first choice
    alternatives: tuple[OptimizationProposal, ...] = ()  # other designs worth measuring, best first

    @property
    def candidates(self) -> tuple[OptimizationProposal, ...]:
        """Every design to screen and measure, the first choice first."""
        first = (self.proposal,) if self.proposal is not None else ()
        return (*first, *(p for p in self.alternatives if p != self.proposal))

    def analysis(self, ctx: AnalysisContext) -> AnalysisResult:
        impr = self.estimated_improvement
        estimate = f"{max(0, round(impr) - 10)}-{min(99, round(impr) + 5)}%" if impr > 0 else "0%"
        return AnalysisResult(
            insights=self.insights,
            proposed_actions=self.actions,
            confidence=round(min(0.95, max(0.05, self.confidence)), 2),
            metadata={
                "query_complexity": ctx.features.complexity,
                "estimated_improvement": estimate,
                "target_table": self.target_table,
                "proposal_type": self.proposal.proposal_type if self.proposal else None,
                "execution_ms": ctx.execution_ms,
            },
        )


def nothing(insights: Iterable[str], why: str, confidence: float, target: str | None) -> Decision:
    return Decision(insights=(*insights, why), actions=(f"No change proposed: {why}",),
                    confidence=confidence, target_table=target, estimated_improvement=0.0,
                    proposal=None)


def time_share(ev: Evidence, table: str, whole_join: bool = False) -> float:
    """The share of the execution time an access path change on `table` can remove.

    For a join-key index, or an index that delivers the ORDER BY, that is everything
    but reading the other tables: the hash join or the sort goes away with the scan."""
    total = ev.ctx.execution_ms
    if total <= 0 or not ev.nodes:
        return 0.8 if ev.seq_scanned(table) or not ev.nodes else 0.5
    if whole_join:
        others = sum(ev.scan_ms(t) for t in ev.query_tables() if t != table)
        return max(0.0, min(1.0, 1.0 - others / total))
    return min(1.0, ev.scan_ms(table) / total)


def predicted_improvement(ev: Evidence, table: str, fraction: float, whole_join: bool = False) -> float:
    """Predicted percent: the time share of the work replaced, times the rows no longer read."""
    share = time_share(ev, table, whole_join)
    cap = 90.0 if whole_join else 95.0
    return round(max(1.0, min(cap, 100.0 * share * (1.0 - min(1.0, fraction)))), 1)


def write_risk(ev: Evidence, table: str) -> tuple[RiskLevel, list[str]]:
    wpr = ev.writes_per_read(table)
    if wpr > WRITE_HEAVY:
        return "medium", [f"{table} is write-heavy ({wpr:.1f} writes per read): "
                          "every insert and update also maintains the new index"]
    return "low", []


def range_bounds(uses: Sequence[ColumnUse]) -> tuple[Any, Any] | None:
    """(lower, upper) of a column's range predicates (None: open); None when a bound is
    not a literal (`now() - interval '1 day'`), so that the histogram cannot tell."""
    lower: Any = None
    upper: Any = None
    for u in uses:
        op = (u.operator or "").upper()
        values = tuple(u.value) if isinstance(u.value, list | tuple) else (u.value,)
        if any(v is None for v in values):
            return None
        if op in (">", ">="):
            lower = u.value
        elif op in ("<", "<="):
            upper = u.value
        elif op == "BETWEEN" and len(values) == 2:
            lower, upper = values
    return lower, upper


def range_text(uses: Sequence[ColumnUse]) -> str:
    return " and ".join(f"{u.operator} {u.value!r}" if u.value is not None else f"{u.operator} <expression>"
                        for u in uses)


def range_estimate(ev: Evidence, table: str, column: str, uses: Sequence[ColumnUse],
                    only_filter: bool) -> tuple[float, str]:
    """The fraction of rows a column's range keeps, and where the number comes from:
    the histogram; else what the plan's Seq Scan kept, when this is its only filter."""
    bounds = range_bounds(uses)
    frac = range_fraction(ev.stats(table, column), *bounds) if bounds is not None else None
    if frac is not None:
        return frac, "histogram"
    observed = ev.observed_fraction(table)
    if observed is not None and only_filter:
        return observed, "observed in the plan"
    return DEFAULT_RANGE_SEL, "no estimate, assuming a third of the rows"




def insights_of(ev: Evidence) -> list[str]:
    """What the plan shows, the first insights of every strategist."""
    return plan_insights(ev.nodes, ev.ctx.execution_ms, large_rows=SMALL_TABLE_ROWS)
