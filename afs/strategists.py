"""Offline strategists: the agents' brains when no model is configured.

One strategist per specialisation of the seed (`AGENTS` in models.py)::

    gemini25pro    index design     composite keys (equality → range → sort), partial
                                    indexes for rare constants, INCLUDE for index-only
                                    scans, join-key indexes; `LIKE 'prefix%'` through a
                                    pattern operator class, expression indexes for
                                    `lower(col) = …` and `payload ->> 'key' = …`, GIN for
                                    jsonb containment (`@>`) and key tests (`?`)
    gemini25flash  structure        BRIN on time-correlated columns; monthly range
                                    partitioning with its migration, done in the fork
                                    (BRIN instead when foreign keys reference the table)
    gemini20flash  pre-computation  a materialized view of an aggregation plus the
                                    rewrite that reads it; otherwise one low-risk index

When the specialty of gemini25flash (or of gemini25pro on a complex query) finds
nothing for an aggregation, it proposes the summary view too (`with_rollup`), as
the seed's router and specialisations ask of them.

Every strategist is a pure function of the `AnalysisContext`: the query (parsed
with sqlglot), its EXPLAIN (ANALYZE, BUFFERS) plan and the table statistics. It
decides once (`Decision`) and that decision yields both the seed's
`AnalysisResult` and the `OptimizationProposal` (or None: nothing worth
proposing). A new strategist is one decide-function and one `STRATEGISTS` entry.

The evidence helpers are shared and public: `plan_nodes` (the plan, flattened,
with per-node self time and rows over all loops), `equality_selectivity` and
`range_fraction` (pg_stats arithmetic), `covering_index` (don't propose what
exists), `materialize` (the view + rewrite builder).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Literal

import sqlglot
from pglast.keywords import RESERVED_KEYWORDS, TYPE_FUNC_NAME_KEYWORDS
from sqlglot import exp
from sqlglot.errors import SqlglotError
from sqlglot.optimizer.normalize_identifiers import normalize_identifiers

from afs.errors import InputError
from afs.models import (
    AgentKey,
    AnalysisContext,
    AnalysisResult,
    ColumnStats,
    ColumnUse,
    EstimatedImpact,
    IndexInfo,
    OptimizationProposal,
    ProposalType,
    RiskLevel,
    TableInfo,
)

# -- tunables ---------------------------------------------------------------------------
FAST_MS: Final = 1.0  # a query this fast leaves nothing to measure
SMALL_TABLE_ROWS: Final = 10_000  # scanning fewer rows is cheap: no index for it
MIN_BENEFIT_ROWS: Final = 1_000  # an index must spare at least this many row visits
INDEX_MAX_FRACTION: Final = 0.2  # an index lookup beats a scan below ~20 % of the rows
JOIN_MAX_FRACTION: Final = 0.1  # a nested loop over an index beats a hash join below this
PARTIAL_MAX_FREQ: Final = 0.2  # a constant this rare is worth a partial index …
PARTIAL_MAX_DISTINCT: Final = 50  # … on a low-cardinality (enum-like) column
INCLUDE_MAX_COLUMNS: Final = 3
INCLUDE_MAX_TEXT_WIDTH: Final = 16  # avg bytes (pg_stats avg_width) of a text narrow enough to INCLUDE
BRIN_MIN_ROWS: Final = 100_000
BRIN_MIN_CORRELATION: Final = 0.9
BRIN_MAX_FRACTION: Final = 0.8  # a range keeping more leaves BRIN too little to skip
PARTITION_MIN_ROWS: Final = 1_000_000
PARTITION_MAX_FRACTION: Final = 0.25  # pruning must skip most of the table; else BRIN
MAX_PARTITIONS: Final = 36
MV_MIN_ROWS: Final = 10_000  # rows aggregated for a materialized view to pay off
NAME_MAX: Final = 63  # PostgreSQL's NAMEDATALEN - 1
DEFAULT_EQ_SEL: Final = 0.005  # PostgreSQL's DEFAULT_EQ_SEL, when there are no statistics
DEFAULT_RANGE_SEL: Final = 1 / 3  # PostgreSQL's DEFAULT_INEQ_SEL
DEFAULT_MATCH_SEL: Final = 0.005  # PostgreSQL's DEFAULT_MATCH_SEL (LIKE), when there are no statistics
DEFAULT_CONTAIN_SEL: Final = 0.01  # PostgreSQL's DEFAULT_MATCHING_SEL (jsonb @>, ?), likewise
JSON_VALUE_WIDTH: Final = 16  # bytes assumed for a value extracted from json (no statistics on it)
GIN_BYTES_PER_WIDTH: Final = {"jsonb_path_ops": 0.15, None: 0.22}  # GIN size per byte of jsonb, measured
MIN_IMPROVEMENT: Final = 10.0  # percent: the consensus gate; less is not worth proposing
WRITE_HEAVY: Final = 1.0  # writes per read above which each index is a visible write cost

EQUALITY_OPS: Final = frozenset({"=", "==", "IN", "IS NULL", "IS"})
RANGE_OPS: Final = frozenset({"<", "<=", ">", ">=", "BETWEEN"})
TIME_TYPES: Final = ("timestamp", "date")
# types too wide (or unsortable) to carry in an index as INCLUDE columns
WIDE_TYPES: Final = ("json", "jsonb", "bytea", "xml", "tsvector", "[]")
VOLATILE_FUNCTIONS: Final = frozenset({
    "now", "current_timestamp", "current_date", "current_time", "current_datetime",
    "localtime", "localtimestamp", "clock_timestamp", "statement_timestamp",
    "transaction_timestamp", "timeofday", "random", "rand", "setseed", "nextval",
    "currval", "lastval", "gen_random_uuid", "uuid", "uuid_generate_v4", "txid_current",
    "pg_current_xact_id", "random_normal",
})
_TYPE_WIDTH: Final = {
    "smallint": 2, "integer": 4, "int": 4, "bigint": 8, "boolean": 1, "date": 4, "real": 4,
    "double precision": 8, "timestamp": 8, "time": 8, "uuid": 16, "numeric": 10, "oid": 4,
}
# the B-tree operator class that serves `LIKE 'prefix%'` whatever the collation, by column type
PATTERN_OPCLASSES: Final = {
    "text": "text_pattern_ops", "character varying": "varchar_pattern_ops",
    "character": "bpchar_pattern_ops",
}
# casts of an extracted json value that are immutable, so that an index may hold them
_INDEXABLE_CASTS: Final = frozenset({
    "int", "integer", "bigint", "smallint", "numeric", "decimal", "boolean", "bool", "text",
    "double precision", "real", "float",
})


# -- formatting -----------------------------------------------------------------------
def _n(x: float) -> str:
    return f"{round(x):,}"


def _pct(fraction: float) -> str:
    p = 100.0 * fraction
    if p >= 10 or p == 0:
        return f"{p:.0f} %"
    if p >= 1:
        return f"{p:.1f} %"
    if p < 0.0001:
        return "< 0.0001 %"
    return f"{p:.2g} %"


def _ms(x: float) -> str:
    return f"{x:,.1f} ms" if x >= 1 else f"{x:.3f} ms"


def _short(text: str, limit: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- identifiers and names ----------------------------------------------------------------
_SIMPLE_IDENT = re.compile(r"^[a-z_][a-z0-9_$]*$")
# keywords that cannot name a column unquoted (col_name keywords can)
_RESERVED: Final = frozenset(RESERVED_KEYWORDS) | frozenset(TYPE_FUNC_NAME_KEYWORDS)


def ident(name: str) -> str:
    """`name` as a PostgreSQL identifier: bare when it can be, double-quoted otherwise."""
    if '"' in name:
        return name  # already quoted as the query spelled it
    if _SIMPLE_IDENT.match(name) and name not in _RESERVED:
        return name
    return '"' + name + '"'


def qualified(name: str) -> str:
    """A possibly schema-qualified table name, each part quoted as needed."""
    if '"' in name:
        return name
    return ".".join(ident(part) for part in name.split("."))


def _schema_and_rel(name: str) -> tuple[str | None, str]:
    if "." in name and '"' not in name:
        schema, rel = name.rsplit(".", 1)
        return schema, rel
    return None, name


def _rel(name: str) -> str:
    return _schema_and_rel(name)[1].strip('"')


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def _hash(text: str, n: int = 8) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:n]


def object_name(*parts: str, suffix: str, taken: Iterable[str] = ()) -> str:
    """A deterministic name of at most 63 bytes: the slugged parts joined by `_`, then `suffix`.

    Too long (or already taken) names are cut and get a short hash of the full name,
    so two different long keys never collide; a hashed name that is taken too is hashed again."""
    base = "_".join(s for s in (_slug(p) for p in parts) if s)
    name = f"{base}_{suffix}"
    taken = set(taken)
    seed = name
    while len(name) > NAME_MAX or name in taken:
        tag = _hash(seed, 8)
        room = NAME_MAX - len(suffix) - len(tag) - 2
        name = f"{base[:room].rstrip('_')}_{tag}_{suffix}"
        seed = name
    return name


def index_name(table: str, columns: Sequence[str], suffix: str = "idx",
               taken: Iterable[str] = ()) -> str:
    """`afs_<table>_<col>_…_<suffix>`, e.g. `afs_orders_user_id_created_at_idx`."""
    return object_name("afs", _rel(table), *columns, suffix=suffix, taken=taken)


# -- the plan ---------------------------------------------------------------------------
_SCAN_TYPES: Final = frozenset({
    "Seq Scan", "Index Scan", "Index Only Scan", "Bitmap Heap Scan", "Tid Scan", "Tid Range Scan",
})


@dataclass(frozen=True)
class PlanNode:
    """One node of an EXPLAIN ANALYZE plan, with totals over all its loops."""

    node_type: str
    relation: str | None
    index_name: str | None
    filter: str | None
    rows: float  # rows returned, over all loops
    removed: float  # rows removed by Filter and by index recheck, over all loops
    loops: float
    total_ms: float  # inclusive, as wall-clock time
    self_ms: float  # without the children
    input_rows: float  # rows returned by the first child, over all its loops
    sort_key: tuple[str, ...] = ()
    sort_method: str | None = None
    sort_space_kb: float = 0.0
    sort_on_disk: bool = False
    depth: int = 0

    @property
    def scanned(self) -> float:
        return self.rows + self.removed

    @property
    def is_scan(self) -> bool:
        return self.node_type in _SCAN_TYPES

    @property
    def label(self) -> str:
        if self.index_name and self.relation:
            return f"{self.node_type} using {self.index_name} on {self.relation}"
        if self.relation:
            return f"{self.node_type} on {self.relation}"
        return self.node_type


def _num(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def plan_nodes(plan: Mapping[str, Any]) -> tuple[PlanNode, ...]:
    """The plan's nodes, parents before children (accepts the node or its {"Plan": …} wrapper).

    Rows are multiplied by loops (EXPLAIN prints per-loop averages); under Gather the
    time of a node is divided by the number of processes sharing it."""
    root = plan.get("Plan", plan) if isinstance(plan.get("Plan"), Mapping) else plan
    if not root or "Node Type" not in root:
        return ()

    def visit(node: Mapping[str, Any], processes: float, depth: int) -> list[PlanNode]:
        children = [c for c in node.get("Plans") or () if isinstance(c, Mapping)]
        node_type = str(node.get("Node Type", "?"))
        inner = processes
        if node_type in ("Gather", "Gather Merge"):
            inner = _num(node.get("Workers Launched", node.get("Workers Planned", 0))) + 1
        kids = [visit(c, inner, depth + 1) for c in children]
        loops = _num(node.get("Actual Loops", 1)) or 1.0
        total = _num(node.get("Actual Total Time")) * loops / max(processes, 1.0)
        kids_ms = sum(k[0].total_ms for k in kids if k)
        index_name = node.get("Index Name")
        if index_name is None and node_type == "Bitmap Heap Scan":
            index_name = next((n.index_name for k in kids for n in k if n.index_name), None)
        removed = (_num(node.get("Rows Removed by Filter"))
                   + _num(node.get("Rows Removed by Index Recheck"))) * loops
        me = PlanNode(
            node_type=node_type,
            relation=node.get("Relation Name"),
            index_name=str(index_name) if index_name else None,
            filter=node.get("Filter"),
            rows=_num(node.get("Actual Rows")) * loops,
            removed=removed,
            loops=loops,
            total_ms=total,
            self_ms=max(0.0, total - kids_ms),
            input_rows=kids[0][0].rows if kids and kids[0] else 0.0,
            sort_key=tuple(str(k) for k in node.get("Sort Key") or ()),
            sort_method=node.get("Sort Method"),
            sort_space_kb=_num(node.get("Sort Space Used")),
            sort_on_disk=node.get("Sort Space Type") == "Disk",
            depth=depth,
        )
        return [me, *(n for k in kids for n in k)]

    return tuple(visit(root, 1.0, 0))


def plan_insights(nodes: Sequence[PlanNode], execution_ms: float) -> list[str]:
    """Concrete observations about a plan, with its numbers."""
    out: list[str] = []
    scans = sorted((n for n in nodes if n.is_scan), key=lambda n: -n.scanned)
    for n in scans[:3]:
        loops = f" over {_n(n.loops)} loops" if n.loops > 1 and n.node_type != "Seq Scan" else ""
        if n.removed > 0 and n.scanned > 0:
            what = f" (Filter: {_short(n.filter, 90)})" if n.filter else ""
            out.append(f"{n.label} removes {_n(n.removed)} rows to return {_n(n.rows)} "
                       f"({_pct(n.rows / n.scanned)}){loops}{what}")
        elif n.node_type == "Seq Scan" and n.rows >= SMALL_TABLE_ROWS:
            out.append(f"Seq Scan on {n.relation} reads all {_n(n.rows)} rows")
        elif n.index_name:
            out.append(f"{n.label} returns {_n(n.rows)} rows{loops}")
    for n in nodes:
        if n.node_type in ("Sort", "Incremental Sort") and n.sort_key:
            where = f"on disk, {_n(n.sort_space_kb)} kB" if n.sort_on_disk else "in memory"
            method = f"{n.sort_method}, " if n.sort_method else ""
            out.append(f"Sort by {', '.join(n.sort_key)} over {_n(n.input_rows)} rows "
                       f"({method}{where})")
    timed = [n for n in nodes if n.self_ms > 0]
    if timed and execution_ms > 0:
        top = max(timed, key=lambda n: n.self_ms)
        share = min(1.0, top.self_ms / execution_ms)
        out.append(f"Most time goes to {top.label}: {_ms(top.self_ms)} of {_ms(execution_ms)} "
                   f"({_pct(share)})")
    elif execution_ms > 0:
        out.append(f"Execution time {_ms(execution_ms)}")
    return out


# -- statistics ----------------------------------------------------------------------
def distinct_values(stats: ColumnStats, rows: float) -> float | None:
    """pg_stats.n_distinct as a count (negative values are a fraction of the rows)."""
    if stats.n_distinct > 0:
        return stats.n_distinct
    if stats.n_distinct < 0:
        return max(1.0, -stats.n_distinct * rows)
    return None


def _text_matches(value: Any, text: str) -> bool:
    if isinstance(value, bool):
        return text.lower() in (("t", "true") if value else ("f", "false"))
    if isinstance(value, int | float):
        try:
            return float(text) == float(value)
        except ValueError:
            return False
    return str(value).strip("'") == text


def equality_selectivity(stats: ColumnStats | None, rows: float, value: Any = None) -> float | None:
    """Fraction of rows where the column equals `value` (a list/tuple: any of them, as IN).

    `value` in the MCV list → its frequency; otherwise the rest spread evenly over the
    other distinct values, (1 − Σ mcv freqs − null_frac) / (n_distinct − len(mcv)).
    `value=None` (a parameter) → the average, (1 − null_frac) / n_distinct.
    None when there are no usable statistics."""
    if stats is None:
        return None
    nd = distinct_values(stats, rows)
    if value is None:
        return (1.0 - stats.null_frac) / nd if nd else None
    values = list(value) if isinstance(value, list | tuple | set | frozenset) else [value]
    mcv = list(zip(stats.most_common_vals, stats.most_common_freqs, strict=False))
    rest = max(0.0, 1.0 - sum(f for _, f in mcv) - stats.null_frac)
    total = 0.0
    for v in values:
        freq = next((f for text, f in mcv if _text_matches(v, text)), None)
        if freq is not None:
            total += freq
        elif nd is None:
            if not mcv:
                return None
            total += min(rest, DEFAULT_EQ_SEL)
        else:
            others = nd - len(mcv)
            total += rest / others if others >= 1 else 1.0 / max(rows, 1.0)
    return min(1.0, max(total, 1.0 / max(rows, 1.0)))


def _ordinal(value: Any) -> float | None:
    """A number to compare a histogram bound with: numbers as such, dates as epoch seconds."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()
    text = str(value).strip().strip("'")
    try:
        return float(text)
    except ValueError:
        pass
    moment = parse_timestamp(text)
    return moment.timestamp() if moment else None


_TIMESTAMP = re.compile(
    r"^(\d{4}-\d{2}-\d{2})(?:[ T](\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?))?\s*([+-]\d{2}(?::?\d{2})?)?$")


def parse_timestamp(text: str) -> datetime | None:
    """A timestamp or date as pg_stats prints it (UTC when no offset is given)."""
    text = text.strip().strip("'").strip('"')
    m = _TIMESTAMP.match(text)
    if not m:
        return None
    day, clock, offset = m.groups()
    iso = day + (f" {clock}" if clock else " 00:00:00")
    if offset:
        iso += offset if len(offset) > 3 else offset + ":00"
    try:
        moment = datetime.fromisoformat(iso)
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def range_fraction(stats: ColumnStats | None, lower: Any = None, upper: Any = None) -> float | None:
    """Fraction of rows between `lower` and `upper` (either open), as PostgreSQL reckons it:
    the MCVs in the range with their frequencies, plus the histogram's share of the other
    rows, (1 − Σ mcv freqs − null_frac) × (buckets in the range / buckets)."""
    if stats is None or len(stats.histogram_bounds) < 2:
        return None
    bounds = [_ordinal(b) for b in stats.histogram_bounds]
    if any(b is None for b in bounds):
        return None
    points = [b for b in bounds if b is not None]

    def cdf(x: float) -> float:
        if x <= points[0]:
            return 0.0
        if x >= points[-1]:
            return 1.0
        for i in range(len(points) - 1):
            lo, hi = points[i], points[i + 1]
            if lo <= x < hi:
                inside = (x - lo) / (hi - lo) if hi > lo else 0.0
                return (i + inside) / (len(points) - 1)
        return 1.0

    lo = _ordinal(lower) if lower is not None else None
    hi = _ordinal(upper) if upper is not None else None
    if (lower is not None and lo is None) or (upper is not None and hi is None):
        return None
    share = (cdf(hi) if hi is not None else 1.0) - (cdf(lo) if lo is not None else 0.0)
    mcv = list(zip(stats.most_common_vals, stats.most_common_freqs, strict=False))
    rest = max(0.0, 1.0 - sum(f for _, f in mcv) - stats.null_frac)
    in_range = 0.0
    for text, freq in mcv:
        value = _ordinal(text)
        if value is not None and (lo is None or value >= lo) and (hi is None or value <= hi):
            in_range += freq
    return min(1.0, in_range + max(0.0, share) * rest)


def like_prefix(pattern: str) -> str:
    """The fixed start of a LIKE pattern: up to the first unescaped `%` or `_`."""
    out: list[str] = []
    escaped = False
    for ch in pattern:
        if escaped:
            out.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch in "%_":
            break
        else:
            out.append(ch)
    return "".join(out)


def prefix_fraction(stats: ColumnStats | None, prefix: str, rows: float) -> float | None:
    """Fraction of rows whose text starts with `prefix`, from the MCV list and the histogram.

    The MCVs that start with it count with their frequency; of the other rows, each
    histogram bound that starts with it stands for about one bucket (a prefix that falls
    between two bounds, for half a bucket). None without statistics to tell."""
    if stats is None or not prefix:
        return None
    mcv = list(zip(stats.most_common_vals, stats.most_common_freqs, strict=False))
    matched = sum(f for v, f in mcv if v.startswith(prefix))
    rest = max(0.0, 1.0 - sum(f for _, f in mcv) - stats.null_frac)
    bounds = stats.histogram_bounds
    if len(bounds) >= 2:
        inside = sum(1 for b in bounds if b.startswith(prefix))
        share = min(1.0, max(inside, 0.5) / (len(bounds) - 1))
    elif mcv and rest < 0.01:  # the MCVs are (nearly) all the values
        share = 0.0
    else:
        return None
    return min(1.0, max(matched + rest * share, 1.0 / max(rows, 1.0)))


# -- existing indexes ----------------------------------------------------------------------
def _norm_col(text: str) -> str:
    text = re.sub(r"\s+(ASC|DESC)\b.*$", "", text.strip(), flags=re.IGNORECASE)
    return text.strip('"').lower()


def _norm_key(text: str) -> str:
    """An index key column or expression, comparable with what pg_get_indexdef prints:
    `lower(email)`, `(payload ->> 'kind'::text)` and `payload->>'kind'` all normalise alike."""
    return _norm_predicate(_norm_col(text))


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


def _column_type(table: TableInfo, column: str) -> str | None:
    for c in table.columns:
        if c.name == column:
            return c.data_type
    return None


def _base_type(data_type: str) -> str:
    return re.sub(r"\(.*\)", "", data_type).split(" with")[0].split(" without")[0].strip()


def _width(data_type: str | None) -> int:
    if data_type is None:
        return 16
    return _TYPE_WIDTH.get(_base_type(data_type), 16)


def _column_width(table: TableInfo | None, column: str) -> int:
    """Bytes per value: pg_stats avg_width when known, else by the type."""
    stats = table.column_stats.get(column) if table else None
    if stats is not None and stats.avg_width:
        return stats.avg_width
    return _width(_column_type(table, column) if table else None)


def _pattern_opclass(data_type: str | None) -> str | None:
    """The operator class that lets a B-tree serve `LIKE 'prefix%'` on this type, if any."""
    if data_type is None or data_type.endswith("]"):
        return None
    return PATTERN_OPCLASSES.get(_base_type(data_type))


def _btree_mb(rows: float, widths: Iterable[int]) -> float:
    """IndexTuple header + MAXALIGNed key + line pointer, leaf pages ~90 % full."""
    key = sum(widths)
    per_row = 8 + 8 * math.ceil(key / 8) + 4
    return round(rows * per_row / 0.9 / 1024 / 1024, 2)


def _gin_mb(rows: float, width: int, opclass: str | None) -> float:
    """A GIN index on jsonb: compressed posting lists, about a fifth of the column's bytes."""
    per_byte = GIN_BYTES_PER_WIDTH.get(opclass, GIN_BYTES_PER_WIDTH[None])
    return round(max(0.01, rows * max(width, 8) * per_byte / 1024 / 1024), 2)


# -- the query --------------------------------------------------------------------------
@dataclass(frozen=True)
class SortItem:
    table: str | None
    column: str | None  # None when the ORDER BY item is not a plain column of a table
    desc: bool
    nulls_first: bool  # as sqlglot normalises it: PostgreSQL's default is NULLS FIRST for DESC
    sql: str


@dataclass(frozen=True)
class IndexablePredicate:
    """A top-level WHERE term that an expression index or a GIN index can serve (QueryFeatures
    calls its column's use "other"): `lower(email) = 'x'`, `payload ->> 'kind' = 'x'`,
    `lower(email) LIKE 'ab%'`, `payload @> '{…}'`, `payload ? 'key'`."""

    table: str
    column: str  # the column the term reads
    kind: Literal["equality", "prefix", "containment", "key_exists"]
    expression: str | None  # the index key expression; None: the column itself (GIN)
    label: str  # what the index name calls the key, e.g. "lower_email"
    method: Literal["btree", "gin"]
    opclass: str | None
    shown: str  # the term as written
    values: int = 1  # how many constants it compares with (IN lists)
    prefix: str | None = None  # the fixed start of a LIKE pattern
    from_json: bool = False  # the expression extracts a value from json


@dataclass(frozen=True)
class QueryShape:
    """What sqlglot tells about the query beyond QueryFeatures."""

    tree: exp.Expr | None
    sort: tuple[SortItem, ...] = ()
    # (table, column) → the predicate as an index WHERE clause, for top-level AND conjuncts
    # `col = <constant>` and `col IS NULL` only: those a partial index may rely on.
    constant_predicates: Mapping[tuple[str, str], str] = field(default_factory=dict)
    join_pairs: tuple[tuple[tuple[str, str], tuple[str, str]], ...] = ()
    star_tables: frozenset[str] = frozenset()  # tables whose every column is selected
    grouped: bool = False  # GROUP BY, aggregates or DISTINCT at the top
    limit: int | None = None
    indexable: tuple[IndexablePredicate, ...] = ()
    filters: Mapping[str, int] = field(default_factory=dict)  # top-level WHERE terms on one table
    # (table, column, pattern) of the top-level `col LIKE 'pattern'` terms (not NOT LIKE, not in OR)
    like_terms: frozenset[tuple[str, str, str]] = frozenset()


def _parse(query: str) -> exp.Expr | None:
    """The one statement of `query`, unquoted identifiers folded to lower case as PostgreSQL
    (and QueryFeatures) folds them; None unless sqlglot reads exactly one statement."""
    try:
        statements = [s for s in sqlglot.parse(query, read="postgres") if s is not None]
    except (SqlglotError, ValueError):
        return None
    return normalize_identifiers(statements[0], dialect="postgres") if len(statements) == 1 else None


def conjuncts(node: exp.Expr | None) -> list[exp.Expr]:
    """The top-level AND terms of a condition."""
    if node is None:
        return []
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.And):
        return conjuncts(node.left) + conjuncts(node.right)
    return [node]


def _is_constant(node: exp.Expr) -> bool:
    if isinstance(node, exp.Literal | exp.Boolean):
        return True
    if isinstance(node, exp.Cast | exp.Neg | exp.Paren):
        return _is_constant(node.this)
    return False


def _func_name(node: exp.Func) -> str:
    if isinstance(node, exp.Anonymous):
        return str(node.name).lower()
    return node.sql_name().lower()


def _constant_or_array(node: exp.Expr) -> bool:
    """A literal, a cast literal or an ARRAY of them."""
    if isinstance(node, exp.Array):
        return all(_constant_or_array(e) for e in node.expressions)
    return _is_constant(node)


def _sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _index_expression(node: exp.Expr, resolver: _Resolver) -> tuple[str, str, str, str, bool] | None:
    """(table, column, expression SQL, label, from json) when `node` is an expression an index
    can hold and the planner will match: lower/upper of a text column; `->` / `->>` with
    literal keys on a json(b) column; an immutable cast of such an extracted value."""
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.Lower | exp.Upper) and isinstance(node.this, exp.Column):
        typed = resolver.typed_column(node.this)
        if typed is None or _pattern_opclass(typed[2]) is None:
            return None
        table, column, _ = typed
        fn = "lower" if isinstance(node, exp.Lower) else "upper"
        return table, column, f"{fn}({ident(column)})", f"{fn}_{column}", False
    if isinstance(node, exp.Cast):
        inner = _index_expression(node.this, resolver)
        to = node.to.sql(dialect="postgres").lower()
        if inner is None or not inner[4] or _base_type(to) not in _INDEXABLE_CASTS:
            return None
        table, column, sql, label, _ = inner
        return table, column, f"({sql})::{to}", label, True
    if isinstance(node, exp.JSONExtract | exp.JSONExtractScalar):
        path = node.expression
        parts = path.expressions if isinstance(path, exp.JSONPath) else []
        if (len(parts) != 2 or not isinstance(parts[0], exp.JSONPathRoot)
                or not isinstance(parts[1], exp.JSONPathKey) or not isinstance(parts[1].this, str)):
            return None
        key = parts[1].this
        op = "->>" if isinstance(node, exp.JSONExtractScalar) else "->"
        base = node.this
        while isinstance(base, exp.Paren):
            base = base.this
        if isinstance(base, exp.Column):
            typed = resolver.typed_column(base)
            if typed is None or typed[2] not in ("json", "jsonb"):
                return None
            table, column, _ = typed
            sql, label = ident(column), column
        elif isinstance(base, exp.JSONExtract):
            inner = _index_expression(base, resolver)
            if inner is None:
                return None
            table, column, sql, label, _ = inner
        else:
            return None
        return table, column, f"{sql} {op} {_sql_string(key)}", f"{label}_{key}", True
    return None


_KEY_TESTS = (exp.JSONBContainsTopKey, exp.JSONBContainsAnyTopKeys, exp.JSONBContainsAllTopKeys)


def _indexable_predicate(term: exp.Expr, resolver: _Resolver) -> IndexablePredicate | None:
    """The index that can serve one top-level WHERE term, when QueryFeatures' plain-column
    roles cannot describe it (see IndexablePredicate)."""
    if term.args.get("negate"):
        return None  # `NOT LIKE`, `NOT IN`: an index cannot find what is absent
    shown = _shown(term)
    if isinstance(term, exp.EQ | exp.In):
        if isinstance(term, exp.EQ):
            left, right = term.this, term.expression
            if _constant_or_array(left):
                left, right = right, left
            if not _constant_or_array(right):
                return None
            values = 1
        else:
            if term.args.get("query") is not None or not term.expressions or not all(
                    _constant_or_array(e) for e in term.expressions):
                return None
            left, values = term.this, len(term.expressions)
        found = _index_expression(left, resolver)
        if found is None:
            return None
        table, column, sql, label, from_json = found
        return IndexablePredicate(table, column, "equality", sql, label, "btree", None, shown,
                                  values=values, from_json=from_json)
    if isinstance(term, exp.Like) and isinstance(term.expression, exp.Literal) and term.expression.is_string:
        prefix = like_prefix(str(term.expression.this))
        found = _index_expression(term.this, resolver)
        if not prefix or found is None or "::" in found[2]:
            return None
        table, column, sql, label, from_json = found
        return IndexablePredicate(table, column, "prefix", sql, f"{label}_pattern", "btree",
                                  "text_pattern_ops", shown, prefix=prefix, from_json=from_json)
    column_node: exp.Expr | None = None
    kind: Literal["containment", "key_exists"] = "containment"
    if isinstance(term, exp.ArrayContainsAll) and _constant_or_array(term.expression):
        column_node = term.this
    elif isinstance(term, exp.ArrayContainedBy) and _constant_or_array(term.this):
        column_node = term.expression
    elif isinstance(term, _KEY_TESTS) and _constant_or_array(term.expression):
        column_node, kind = term.this, "key_exists"
    while isinstance(column_node, exp.Paren):
        column_node = column_node.this
    if not isinstance(column_node, exp.Column):
        return None
    typed = resolver.typed_column(column_node)
    if typed is None:
        return None
    table, column, data_type = typed
    if data_type == "jsonb":
        # jsonb_path_ops: smaller and faster for @>, but it has no operator for `?`
        opclass = "jsonb_path_ops" if kind == "containment" else None
    elif data_type.endswith("[]") and kind == "containment":
        opclass = None
    else:
        return None
    return IndexablePredicate(table, column, kind, None, column, "gin", opclass, shown)


def _shown(term: exp.Expr) -> str:
    return term.sql(dialect="postgres", normalize_functions="lower")


def _aggregates(select: exp.Select) -> bool:
    """The select list calls an aggregate (not as a window function)."""
    return any(agg.find_ancestor(exp.Window) is None
               for item in select.expressions for agg in item.find_all(exp.AggFunc))


def _volatile(tree: exp.Expr) -> tuple[str, ...]:
    found = {_func_name(f) for f in tree.find_all(exp.Func)}
    return tuple(sorted(found & VOLATILE_FUNCTIONS))


class _Resolver:
    """Column → base table, through the query's aliases and the tables' column lists."""

    def __init__(self, ctx: AnalysisContext) -> None:
        self.tables = ctx.tables
        self.query_tables = tuple(ctx.features.tables) or tuple(ctx.tables)
        self.aliases = {k.lower(): v for k, v in ctx.features.aliases.items()}

    def table_key(self, name: str | None) -> str | None:
        if not name:
            return None
        if name in self.tables:
            return name
        low = name.lower()
        if low in self.aliases and self.aliases[low] in self.tables:
            return self.aliases[low]
        for key in self.tables:
            if key.lower() == low or _rel(key).lower() == low:
                return key
        return self.aliases.get(low)

    def has_column(self, table: str, column: str) -> bool:
        info = self.tables.get(table)
        return info is None or not info.columns or any(c.name == column for c in info.columns)

    def table_of(self, qualifier: str | None, column: str) -> str | None:
        if qualifier:
            return self.table_key(qualifier)
        owners = [t for t in self.query_tables
                  if t in self.tables and any(c.name == column for c in self.tables[t].columns)]
        if len(owners) == 1:
            return owners[0]
        if len(self.query_tables) == 1:
            return self.table_key(self.query_tables[0])
        return None

    def column(self, node: exp.Column) -> tuple[str, str] | None:
        table = self.table_of(node.table or None, node.name)
        if table is None or not self.has_column(table, node.name):
            return None
        return table, node.name

    def typed_column(self, node: exp.Column) -> tuple[str, str, str] | None:
        """(table, column, data type) of a column whose table the catalog describes."""
        resolved = self.column(node)
        info = self.tables.get(resolved[0]) if resolved else None
        data_type = _column_type(info, resolved[1]) if resolved and info else None
        return (*resolved, data_type) if resolved and data_type else None


def query_shape(query: str, resolver: _Resolver) -> QueryShape:
    tree = _parse(query)
    if tree is None:
        return QueryShape(tree=None)
    select = tree if isinstance(tree, exp.Select) else None
    sort: list[SortItem] = []
    constants: dict[tuple[str, str], str] = {}
    star: set[str] = set()
    grouped = False
    limit: int | None = None
    indexable: list[IndexablePredicate] = []
    filters: dict[str, int] = {}
    likes: set[tuple[str, str, str]] = set()
    if select is not None:
        order = select.args.get("order")
        for item in order.expressions if order else ():
            target = item.this
            resolved = resolver.column(target) if isinstance(target, exp.Column) else None
            sort.append(SortItem(
                table=resolved[0] if resolved else None, column=resolved[1] if resolved else None,
                desc=bool(item.args.get("desc")), nulls_first=bool(item.args.get("nulls_first")),
                sql=item.sql(dialect="postgres")))
        where = select.args.get("where")
        for term in conjuncts(where.this if where else None):
            owners = {r[0] for r in (resolver.column(c) for c in term.find_all(exp.Column)) if r}
            if len(owners) == 1:
                owner = owners.pop()
                filters[owner] = filters.get(owner, 0) + 1
            found = _indexable_predicate(term, resolver)
            if found is not None:
                indexable.append(found)
            if (isinstance(term, exp.Like) and not term.args.get("negate")
                    and isinstance(term.this, exp.Column)
                    and isinstance(term.expression, exp.Literal) and term.expression.is_string):
                resolved = resolver.column(term.this)
                if resolved:
                    likes.add((*resolved, str(term.expression.this)))
            if isinstance(term, exp.EQ):
                left, right = term.this, term.expression
                if isinstance(right, exp.Column) and _is_constant(left):
                    left, right = right, left
                if isinstance(left, exp.Column) and _is_constant(right):
                    resolved = resolver.column(left)
                    if resolved:
                        constants[resolved] = f"{ident(left.name)} = {right.sql(dialect='postgres')}"
            elif (isinstance(term, exp.Is) and isinstance(term.expression, exp.Null)
                  and isinstance(term.this, exp.Column)):
                resolved = resolver.column(term.this)
                if resolved:
                    constants[resolved] = f"{ident(term.this.name)} IS NULL"
        for item in select.expressions:
            if isinstance(item, exp.Star):
                star.update(resolver.query_tables)
            elif isinstance(item, exp.Column) and isinstance(item.this, exp.Star):
                key = resolver.table_key(item.table)
                if key:
                    star.add(key)
        grouped = bool(select.args.get("group") or select.args.get("distinct")) or _aggregates(select)
        lim = select.args.get("limit")
        if isinstance(lim, exp.Limit) and isinstance(lim.expression, exp.Literal):
            try:
                limit = int(lim.expression.this)
            except ValueError:
                limit = None
    pairs: list[tuple[tuple[str, str], tuple[str, str]]] = []
    for eq in tree.find_all(exp.EQ):
        if isinstance(eq.this, exp.Column) and isinstance(eq.expression, exp.Column):
            a, b = resolver.column(eq.this), resolver.column(eq.expression)
            if a and b and a[0] != b[0] and (a, b) not in pairs:
                pairs.append((a, b))
    return QueryShape(
        tree=tree, sort=tuple(sort), constant_predicates=constants, join_pairs=tuple(pairs),
        star_tables=frozenset(star), grouped=grouped, limit=limit,
        indexable=tuple(indexable), filters=filters, like_terms=frozenset(likes))


# -- evidence: the plan, the statistics and the query, indexed by table ---------------------
class Evidence:
    """Everything a strategist looks at, organised by table."""

    def __init__(self, ctx: AnalysisContext) -> None:
        self.ctx = ctx
        self.resolver = _Resolver(ctx)
        self.shape = query_shape(ctx.query, self.resolver)
        self.nodes = plan_nodes(ctx.plan)
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

    def observed_fraction(self, table: str) -> float | None:
        """rows / (rows + removed) of the Seq Scans of `table` that filter."""
        seq = [n for n in self.scans(table) if n.node_type == "Seq Scan" and n.filter]
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


# -- what a strategist decides --------------------------------------------------------------
@dataclass(frozen=True)
class Decision:
    insights: tuple[str, ...]
    actions: tuple[str, ...]
    confidence: float
    target_table: str | None
    estimated_improvement: float  # percent, 0 when nothing is proposed
    proposal: OptimizationProposal | None

    def analysis(self, ctx: AnalysisContext) -> AnalysisResult:
        table = ctx.tables.get(self.target_table) if self.target_table else None
        impr = self.estimated_improvement
        estimate = f"{max(0, round(impr) - 10)}-{min(99, round(impr) + 5)}%" if impr > 0 else "0%"
        return AnalysisResult(
            insights=self.insights,
            proposed_actions=self.actions,
            confidence=round(min(0.95, max(0.05, self.confidence)), 2),
            metadata={
                "query_complexity": ctx.features.complexity,
                "estimated_improvement": estimate,
                "writes_per_read": table.writes_per_read if table else 0.0,
                "target_table": self.target_table,
                "proposal_type": self.proposal.proposal_type if self.proposal else None,
                "execution_ms": ctx.execution_ms,
            },
        )


def _nothing(insights: Iterable[str], why: str, confidence: float, target: str | None) -> Decision:
    return Decision(insights=(*insights, why), actions=(f"No change proposed: {why}",),
                    confidence=confidence, target_table=target, estimated_improvement=0.0,
                    proposal=None)


def _time_share(ev: Evidence, table: str, whole_join: bool = False) -> float:
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


def _improvement(ev: Evidence, table: str, fraction: float, whole_join: bool = False) -> float:
    """Predicted percent: the time share of the work replaced, times the rows no longer read."""
    share = _time_share(ev, table, whole_join)
    cap = 90.0 if whole_join else 95.0
    return round(max(1.0, min(cap, 100.0 * share * (1.0 - min(1.0, fraction)))), 1)


def _write_risk(ev: Evidence, table: str) -> tuple[RiskLevel, list[str]]:
    wpr = ev.writes_per_read(table)
    if wpr > WRITE_HEAVY:
        return "medium", [f"{table} is write-heavy ({wpr:.1f} writes per read): "
                          "every insert and update also maintains the new index"]
    return "low", []


# -- gemini-2.5-pro: index design -------------------------------------------------------------
@dataclass(frozen=True)
class KeyColumn:
    name: str  # the column; for an expression, the column it reads
    desc: bool = False
    nulls_first: bool | None = None  # None: the default for the direction
    expression: str | None = None  # an expression key, e.g. "lower(email)"
    opclass: str | None = None  # a non-default operator class, e.g. "text_pattern_ops"
    label: str | None = None  # what the index name calls the key, when not `name`

    @property
    def target(self) -> str:
        """What an existing index's key must be to serve the same lookups."""
        return self.expression or self.name

    def sql(self) -> str:
        text = f"({self.expression})" if self.expression else ident(self.name)
        if self.opclass:
            text += f" {self.opclass}"
        text += " DESC" if self.desc else ""
        if self.nulls_first is not None and self.nulls_first != self.desc:
            text += " NULLS FIRST" if self.nulls_first else " NULLS LAST"
        return text


@dataclass(frozen=True)
class IndexDesign:
    table: str
    key: tuple[KeyColumn, ...]
    kind: Literal["filter", "join", "sort"]
    fraction: float  # of the table's rows the index leads to
    benefit: float  # row visits it spares
    include: tuple[str, ...] = ()
    where: str | None = None
    where_fraction: float = 1.0  # the share of rows a partial index keeps
    reasons: tuple[str, ...] = ()
    sort_served: bool = False
    method: Literal["btree", "gin"] = "btree"
    analyze: bool = False  # an expression key: ANALYZE gives the planner statistics on it

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.key)

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(k.label or k.name for k in self.key)

    def clauses(self, include: Sequence[str]) -> str:
        """What follows the table name: method, key, INCLUDE (names as given), WHERE."""
        using = f" USING {self.method}" if self.method != "btree" else ""
        text = f"{using} ({', '.join(k.sql() for k in self.key)})"
        if include:
            text += f" INCLUDE ({', '.join(include)})"
        if self.where:
            text += f" WHERE {self.where}"
        return text

    def describe(self) -> str:
        return f"{self.table}{self.clauses(self.include)}"


def _scan_reason(ev: Evidence, table: str, rows: float) -> str:
    """What reading `table` costs now: its scans in the plan, else its size."""
    scans = ev.scans(table)
    if not scans:
        return f"{table} has {_n(rows)} rows"
    return (f"{scans[0].label} visits {_n(ev.scanned_rows(table))} rows to return "
            f"{_n(sum(n.rows for n in scans))}")


def _planner_verdict(ev: Evidence, table: str) -> str:
    """How the plan treats `table`, said of an index that already fits."""
    return "yet the planner still chose a Seq Scan" if ev.seq_scanned(table) else "and the plan uses it"


def _selectivity_note(ev: Evidence, table: str, use: ColumnUse) -> tuple[float, str]:
    """The fraction of rows an equality predicate keeps, and where the number comes from."""
    info = ev.table(table)
    rows = float(info.rows) if info else 0.0
    stats = ev.stats(table, use.column)
    op = (use.operator or "=").upper()
    shown = f"{use.column} {op} {use.value!r}" if use.value is not None else f"{use.column} {op} ?"
    if op in ("IS NULL", "IS"):
        if stats is not None:
            return stats.null_frac, (f"{use.column} IS NULL matches {_pct(stats.null_frac)} of rows "
                                     "(pg_stats null_frac)")
        return DEFAULT_EQ_SEL, f"{use.column} IS NULL: no statistics"
    if isinstance(use.value, str):
        shown = f"{use.column} = '{use.value}'"
    sel = equality_selectivity(stats, rows, use.value)
    if sel is not None and stats is not None:
        value = use.value
        in_mcv = value is not None and any(
            _text_matches(v, t) for v in (value if isinstance(value, list | tuple) else [value])
            for t in stats.most_common_vals)
        source = "pg_stats MCV" if in_mcv else "pg_stats n_distinct"
        return sel, f"{shown} matches {_pct(sel)} of rows ({source})"
    if info and (tuple(info.primary_key) == (use.column,) or any(
            ix.unique and tuple(_norm_col(c) for c in ix.columns) == (use.column.lower(),)
            for ix in info.indexes)):
        return 1.0 / max(rows, 1.0), f"{shown} matches at most one row (unique)"
    return DEFAULT_EQ_SEL, f"{shown}: no statistics, assuming {_pct(DEFAULT_EQ_SEL)}"


def _range_bounds(uses: Sequence[ColumnUse]) -> tuple[Any, Any] | None:
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


def _span(uses: Sequence[ColumnUse]) -> str:
    return " and ".join(f"{u.operator} {u.value!r}" if u.value is not None else f"{u.operator} <expression>"
                        for u in uses)


def _range_estimate(ev: Evidence, table: str, column: str, uses: Sequence[ColumnUse],
                    only_filter: bool) -> tuple[float, str]:
    """The fraction of rows a column's range keeps, and where the number comes from:
    the histogram; else what the plan's Seq Scan kept, when this is its only filter."""
    bounds = _range_bounds(uses)
    frac = range_fraction(ev.stats(table, column), *bounds) if bounds is not None else None
    if frac is not None:
        return frac, "histogram"
    observed = ev.observed_fraction(table)
    if observed is not None and only_filter:
        return observed, "observed in the plan"
    return DEFAULT_RANGE_SEL, "no estimate, assuming a third of the rows"


@dataclass(frozen=True)
class RangeChoice:
    column: str
    fraction: float
    note: str
    opclass: str | None = None  # a LIKE prefix: the pattern operator class that serves it


def _range_choice(ev: Evidence, table: str, exclude: set[str]) -> RangeChoice | None:
    """The most selective range-filtered column: a range of values, or a `LIKE 'prefix%'`
    on a text column (served by the type's pattern operator class, whatever the collation)."""
    info = ev.table(table)
    rows = float(info.rows) if info else 0.0
    by_column = {c: uses for c, uses in ev.ranges(table).items() if c not in exclude}
    patterns = _like_patterns(ev, table, exclude)
    alone = not exclude and len(by_column) + len(patterns) == 1
    best: RangeChoice | None = None
    for column, uses in by_column.items():
        frac, source = _range_estimate(ev, table, column, uses, only_filter=alone)
        note = f"{column} {_span(uses)} keeps ~{_pct(frac)} of rows (~{_n(frac * rows)}, {source})"
        if best is None or frac < best.fraction:
            best = RangeChoice(column, frac, note)
    for choice in _pattern_choices(ev, table, patterns, alone):
        if best is None or choice.fraction < best.fraction:
            best = choice
    return best


def _like_patterns(ev: Evidence, table: str, exclude: Iterable[str] = ()) -> dict[str, list[str]]:
    """column → its `LIKE 'prefix%'` patterns, for text columns a pattern operator class serves;
    only patterns the WHERE clause requires (top-level terms, not negated, not inside OR)."""
    info = ev.table(table)
    patterns: dict[str, list[str]] = {}
    for u in ev.uses(table, "range"):
        if ((u.operator or "").upper() == "LIKE" and isinstance(u.value, str) and like_prefix(u.value)
                and (table, u.column, u.value) in ev.shape.like_terms
                and u.column not in exclude and info is not None
                and _pattern_opclass(_column_type(info, u.column))):
            patterns.setdefault(u.column, []).append(u.value)
    return patterns


def _pattern_choices(ev: Evidence, table: str, patterns: Mapping[str, list[str]],
                     alone: bool) -> list[RangeChoice]:
    """One RangeChoice per LIKE-prefixed column: the longest prefix, its estimated fraction."""
    info = ev.table(table)
    if info is None:
        return []
    rows = float(info.rows)
    out: list[RangeChoice] = []
    for column, values in patterns.items():
        pattern = max(values, key=lambda v: len(like_prefix(v)))
        estimate = prefix_fraction(ev.stats(table, column), like_prefix(pattern), rows)
        observed = ev.observed_fraction(table) if alone else None
        if estimate is not None:
            frac, source = estimate, "pg_stats histogram"
        elif observed is not None:
            frac, source = observed, "observed in the plan"
        else:
            frac, source = DEFAULT_MATCH_SEL, f"no statistics, assuming {_pct(DEFAULT_MATCH_SEL)}"
        opclass = _pattern_opclass(_column_type(info, column))
        note = (f"{column} LIKE {_sql_string(pattern)} keeps ~{_pct(frac)} of rows (~{_n(frac * rows)}, "
                f"{source}); a B-tree serves the prefix with {opclass}, whatever the collation")
        out.append(RangeChoice(column, frac, note, opclass))
    return out


def _sort_columns(ev: Evidence, table: str) -> tuple[KeyColumn, ...]:
    """ORDER BY as index key columns, when an index on `table` can deliver that order."""
    sort = ev.shape.sort
    if not sort or ev.shape.grouped or ev.ctx.features.join_count > 0:
        return ()
    if not all(s.table == table and s.column for s in sort):
        return ()
    return tuple(KeyColumn(s.column or "", s.desc, s.nulls_first) for s in sort)


def _include_columns(ev: Evidence, table: str, taken: set[str]) -> tuple[str, ...]:
    if table in ev.shape.star_tables:
        return ()
    info = ev.table(table)
    others = [c for c in ev.referenced_columns(table) if c not in taken]
    if not others or len(others) > INCLUDE_MAX_COLUMNS or info is None:
        return ()
    for c in others:
        data_type = _column_type(info, c)
        if data_type is None or any(w in data_type for w in WIDE_TYPES):
            return ()
        if _pattern_opclass(data_type) and not _narrow_text(info, c, data_type):
            return ()
    return tuple(others)


def _narrow_text(info: TableInfo, column: str, data_type: str) -> bool:
    """A text column narrow enough to carry in INCLUDE: by pg_stats avg_width, else by its
    declared length (`varchar(8)`); plain text without statistics is not."""
    stats = info.column_stats.get(column)
    if stats is not None and stats.avg_width is not None:
        return stats.avg_width <= INCLUDE_MAX_TEXT_WIDTH
    declared = re.search(r"\((\d+)\)", data_type)
    return declared is not None and int(declared.group(1)) + 1 <= INCLUDE_MAX_TEXT_WIDTH


def _filter_design(ev: Evidence, table: str, notes: list[str]) -> IndexDesign | None:
    info = ev.table(table)
    if info is None:
        return None
    rows = float(max(info.rows, 1))
    scans = ev.scans(table)
    scanned = ev.visited_rows(table)
    first_note = len(notes)
    eq: dict[str, tuple[float, ColumnUse]] = {}
    for use in ev.uses(table, "equality"):
        if (use.operator or "=").upper() in EQUALITY_OPS and use.column not in eq:
            sel, note = _selectivity_note(ev, table, use)
            eq[use.column] = (sel, use)
            notes.append(note)
    ordered_eq = sorted(eq.items(), key=lambda kv: kv[1][0])  # most selective first
    rng = _range_choice(ev, table, set(eq))
    if rng:
        notes.append(rng.note)
    sort = tuple(s for s in _sort_columns(ev, table) if s.name not in eq)
    # a rare constant on an enum-like column becomes the partial index's WHERE
    partial: tuple[str, str, float] | None = None
    for column, (sel, use) in ordered_eq:
        predicate = ev.shape.constant_predicates.get((table, column))
        stats = ev.stats(table, column)
        nd = distinct_values(stats, rows) if stats else None
        enum_like = (use.operator or "=").upper() in ("IS NULL", "IS") or (
            nd is not None and nd <= PARTIAL_MAX_DISTINCT)
        others = len(eq) - 1 + (1 if rng else 0) + len(sort)
        if predicate and enum_like and sel <= PARTIAL_MAX_FREQ and others > 0:
            partial = (column, predicate, sel)
            notes.append(f"{column} is enum-like ({_n(nd or 0)} distinct values) and the constant is rare: "
                         f"WHERE {predicate} makes the index {_pct(sel)} of a full one")
            break
    key_eq = [c for c, _ in ordered_eq if partial is None or c != partial[0]]
    key = [KeyColumn(c) for c in key_eq]
    sort_served = False
    if rng and sort and sort[0].name == rng.column and rng.opclass is None:
        key.extend(sort)
        sort_served = True
    elif rng:
        key.append(KeyColumn(rng.column, opclass=rng.opclass,
                             label=f"{rng.column}_pattern" if rng.opclass else None))
        if sort and rng.opclass:
            order = ", ".join(s.sql() for s in sort)
            notes.append(f"{rng.opclass} orders {rng.column} byte by byte, not by the collation: "
                         f"the index narrows the rows and the sort by {order} stays")
        elif sort:
            notes.append(f"ORDER BY {', '.join(s.sql() for s in sort)} differs from the range "
                         f"column {rng.column}: the index narrows the rows and the sort stays")
    elif sort:
        key.extend(sort)
        sort_served = True
    if not key:
        return None
    fraction = math.prod(sel for sel, _ in eq.values()) * (rng.fraction if rng else 1.0)
    limit = ev.shape.limit
    if not eq and not rng:  # ORDER BY only
        if limit is None:
            notes.append(f"ORDER BY on {table} without LIMIT reads every row: an index would not help")
            return None
        fraction = min(1.0, limit / rows)
    if fraction > INDEX_MAX_FRACTION and not (sort_served and limit is not None):
        notes.append(f"the filters on {table} keep ~{_pct(fraction)} of its {_n(rows)} rows: "
                     "an index would not beat a sequential scan")
        return None
    where = partial[1] if partial else None
    eq_names = [*key_eq, *([partial[0]] if partial else [])]
    rest = [k.name for k in key[len(key_eq):]]
    classes = {k.name: k.opclass for k in key if k.opclass}
    existing = (covering_index(info, eq_names, rest, opclasses=classes)
                or covering_index(info, key_eq, rest, where, opclasses=classes))
    if existing is not None:
        notes.append(f"{existing.name} already covers ({', '.join(existing.columns)}) on {table}, "
                     f"{_planner_verdict(ev, table)}")
        return None
    benefit = scanned - fraction * rows
    indexed = [n for n in scans if n.index_name]
    if indexed and benefit < MIN_BENEFIT_ROWS:
        narrowed = sum(n.rows for n in indexed)
        notes.append(f"{indexed[0].label} already narrows {table} to {_n(narrowed)} rows; "
                     "a better index would save little")
        return None
    include = _include_columns(ev, table, {*eq_names, *rest})
    if include:
        notes.append(f"INCLUDE ({', '.join(include)}) carries the other columns the query reads from "
                     f"{table}, for an Index Only Scan")
    return IndexDesign(table=table, key=tuple(key), kind="filter" if eq or rng else "sort",
                       fraction=fraction, benefit=benefit, include=include, where=where,
                       where_fraction=partial[2] if partial else 1.0,
                       reasons=(_scan_reason(ev, table, rows), *notes[first_note:]),
                       sort_served=sort_served)


def _partner_rows(ev: Evidence, partner: str) -> float:
    rows = ev.returned_rows(partner)
    if rows is not None:
        return rows
    info = ev.table(partner)
    if info is None:
        return 0.0
    sel = 1.0
    for use in ev.uses(partner, "equality"):
        sel *= _selectivity_note(ev, partner, use)[0]
    return info.rows * sel


def _join_designs(ev: Evidence, table: str, notes: list[str]) -> list[IndexDesign]:
    info = ev.table(table)
    if info is None:
        return []
    out: list[IndexDesign] = []
    rows = float(max(info.rows, 1))
    seen: set[str] = set()
    for a, b in ev.shape.join_pairs:
        for (t, column), (partner, partner_col) in ((a, b), (b, a)):
            if t != table or column in seen:
                continue
            seen.add(column)
            if covering_index(info, [column]) is not None:
                continue
            if rows < SMALL_TABLE_ROWS:
                continue
            outer = _partner_rows(ev, partner)
            stats = ev.stats(table, column)
            nd = distinct_values(stats, rows) if stats else None
            partner_info = ev.table(partner)
            if nd is None:
                nd = float(partner_info.rows) if partner_info and partner_info.rows else rows
            expected = outer * rows / max(nd, 1.0)
            if expected > JOIN_MAX_FRACTION * rows:
                notes.append(f"join {table}.{column} = {partner}.{partner_col}: ~{_n(outer)} {partner} rows "
                             f"match ~{_n(expected)} of {_n(rows)} {table} rows, a hash join is right")
                continue
            scanned = ev.visited_rows(table)
            note = (f"join {table}.{column} = {partner}.{partner_col}: only ~{_n(outer)} {partner} rows "
                    f"reach it, matching ~{_n(expected)} of {_n(rows)} {table} rows, "
                    f"but {table}.{column} has no index")
            notes.append(note)
            out.append(IndexDesign(
                table=table, key=(KeyColumn(column),), kind="join", fraction=expected / rows,
                benefit=scanned - expected,
                reasons=(f"{table} is scanned for {_n(scanned)} rows to join {_n(outer)} {partner} rows",
                         note + "; with one, the join becomes a nested loop of index lookups")))
    return out


def _indexable_fraction(ev: Evidence, table: str, pred: IndexablePredicate) -> tuple[float, str]:
    """The fraction of rows an expression or containment term keeps, and where the number comes
    from. pg_stats describes columns, not expressions: what the plan's Seq Scan kept comes first
    when the term is the table's only filter; then the column's statistics; then PostgreSQL's
    own defaults."""
    info = ev.table(table)
    rows = float(info.rows) if info else 0.0
    observed = ev.observed_fraction(table) if ev.only_filter(table) else None
    if observed is not None:
        return observed, "observed in the plan"
    stats = ev.stats(table, pred.column)
    if pred.kind == "equality" and not pred.from_json:
        sel = equality_selectivity(stats, rows)
        if sel is not None:
            return min(1.0, sel * pred.values), f"pg_stats n_distinct of {pred.column}"
        return min(1.0, DEFAULT_EQ_SEL * pred.values), f"no statistics, assuming {_pct(DEFAULT_EQ_SEL)}"
    if pred.kind == "equality":
        return min(1.0, DEFAULT_EQ_SEL * pred.values), f"no statistics on it, assuming {_pct(DEFAULT_EQ_SEL)}"
    if pred.kind == "prefix":
        estimate = (prefix_fraction(stats, pred.prefix or "", rows) if not pred.from_json
                    and pred.expression and pred.expression.startswith("lower") else None)
        if estimate is not None:
            return estimate, f"pg_stats histogram of {pred.column}"
        return DEFAULT_MATCH_SEL, f"no statistics on it, assuming {_pct(DEFAULT_MATCH_SEL)}"
    return DEFAULT_CONTAIN_SEL, f"no statistics on it, assuming {_pct(DEFAULT_CONTAIN_SEL)}"


def _indexable_designs(ev: Evidence, table: str, notes: list[str]) -> list[IndexDesign]:
    """Expression indexes (`lower(email)`, `payload ->> 'kind'`, with text_pattern_ops for a
    LIKE prefix) and GIN indexes on jsonb or arrays (`@>`, `?`), one per term the WHERE clause
    tests alone. Terms are not combined into composite keys: each design serves one term."""
    info = ev.table(table)
    if info is None:
        return []
    rows = float(max(info.rows, 1))
    scans = ev.scans(table)
    scanned = ev.visited_rows(table)
    out: list[IndexDesign] = []
    seen: set[tuple[str, str | None, str | None]] = set()
    for pred in ev.indexable(table):
        key = KeyColumn(pred.column, expression=pred.expression, opclass=pred.opclass, label=pred.label)
        if (key.target, key.opclass, pred.method) in seen:
            continue
        seen.add((key.target, key.opclass, pred.method))
        fraction, source = _indexable_fraction(ev, table, pred)
        note = f"{pred.shown} keeps ~{_pct(fraction)} of rows (~{_n(fraction * rows)}, {source})"
        notes.append(note)
        if fraction > INDEX_MAX_FRACTION:
            notes.append(f"{pred.shown} keeps too many rows of {table} for an index to beat a "
                         "sequential scan")
            continue
        if pred.method == "gin":
            existing = covering_index(info, [], [pred.column], method="gin")
            if existing is not None and pred.kind == "key_exists" and "jsonb_path_ops" in existing.definition:
                existing = None  # jsonb_path_ops has no operator for `?`
        else:
            existing = covering_index(info, [], [key.target],
                                      opclasses={key.target: pred.opclass} if pred.opclass else None)
        if existing is not None:
            notes.append(f"{existing.name} already serves {pred.shown} on {table}, "
                         f"{_planner_verdict(ev, table)}")
            continue
        benefit = scanned - fraction * rows
        indexed = [n for n in scans if n.index_name]
        if indexed and benefit < MIN_BENEFIT_ROWS:
            notes.append(f"{indexed[0].label} already narrows {table}; an index for {pred.shown} "
                         "would save little")
            continue
        if pred.method == "gin":
            how = (f"a GIN index on {pred.column}"
                   + (f" with {pred.opclass} (smaller and faster than the default jsonb_ops for @>)"
                      if pred.opclass else "")
                   + " answers it with a Bitmap Index Scan")
        else:
            what = f"the expression {pred.expression}" + (f" with {pred.opclass}" if pred.opclass else "")
            how = (f"an index on {what} serves it (a plain index on {pred.column} cannot); ANALYZE then "
                   "gives the planner statistics on the expression")
        out.append(IndexDesign(
            table=table, key=(key,), kind="filter", fraction=fraction, benefit=benefit,
            reasons=(_scan_reason(ev, table, rows), note, f"{pred.shown}: {how}"), method=pred.method,
            analyze=pred.expression is not None))
    return out


def _key_width(info: TableInfo | None, key: KeyColumn) -> int:
    if key.expression is not None and info is not None and _column_type(info, key.name) in ("json", "jsonb"):
        return JSON_VALUE_WIDTH
    return _column_width(info, key.name)


def _drop_index(table: str, name: str) -> str:
    """The rollback of an index named `name` on `table` (an index lives in its table's schema)."""
    schema, _ = _schema_and_rel(table)
    return f"DROP INDEX IF EXISTS {ident(schema) + '.' if schema else ''}{ident(name)}"


def _index_proposal(agent: AgentKey, ev: Evidence, design: IndexDesign,
                    improvement: float) -> OptimizationProposal:
    info = ev.table(design.table)
    taken = [ix.name for ix in info.indexes] if info else []
    gin = design.method == "gin"
    name = index_name(design.table, design.labels, suffix="gin" if gin else "idx", taken=taken)
    sql = (f"CREATE INDEX {ident(name)} ON {qualified(design.table)}"
           f"{design.clauses([ident(c) for c in design.include])}")
    ptype: ProposalType = ("partial_index" if design.where
                           else "composite_index" if len(design.key) + len(design.include) > 1
                           else "index")
    rows = float(info.rows) if info else 0.0
    entries = rows * design.where_fraction
    widths = [_key_width(info, k) for k in design.key] + [_column_width(info, c) for c in design.include]
    if gin:
        storage = _gin_mb(entries, _column_width(info, design.key[0].name), design.key[0].opclass)
    else:
        storage = _btree_mb(entries, widths)
    risk, warnings = _write_risk(ev, design.table)
    if gin:
        risk = "medium"
        warnings.append("A GIN index costs more on writes than a B-tree: each row adds several entries, "
                        "batched in a pending list that reads must also scan until it is merged.")
    scan = ("Bitmap Index Scan" if gin else "Index Only Scan" if design.include
            else "Index Scan (or Bitmap Index Scan)")
    steps = [f"EXPLAIN shows {scan} using {name} on {_rel(design.table)}"]
    commands = [sql]
    if design.analyze:
        commands.append(f"ANALYZE {qualified(design.table)}")
        steps.insert(0, f"ANALYZE {_rel(design.table)} collects statistics on the indexed expression")
    if design.sort_served:
        steps.append("EXPLAIN shows no Sort node above that scan")
    steps.append("the query returns the same rows as before (count and checksum)")
    rationale = " ".join([
        *(w.rstrip(".") + "." for w in design.reasons),
        f"Proposed: CREATE INDEX on {design.describe()} ({ptype}), about {_n(entries)} entries, "
        f"~{storage:.1f} MB; expected to read ~{_pct(design.fraction)} of {_n(rows)} rows.",
        *warnings,
    ])
    return OptimizationProposal(
        agent=agent, proposal_type=ptype, sql_commands=tuple(commands),
        rollback_commands=(_drop_index(design.table, name),),
        rationale=rationale,
        estimated_impact=EstimatedImpact(query_time_improvement=improvement,
                                         storage_overhead_mb=storage, complexity="low", risk=risk),
        validation_steps=tuple(steps))


def decide_index_design(ctx: AnalysisContext, agent: AgentKey = "gemini25pro") -> Decision:
    """gemini-2.5-pro: the best index for the most expensive access in the plan: a B-tree on
    columns or expressions (with a pattern operator class for LIKE prefixes), or GIN for jsonb."""
    ev = Evidence(ctx)
    insights = plan_insights(ev.nodes, ctx.execution_ms)
    notes: list[str] = []
    if 0 < ctx.execution_ms < FAST_MS and not any(n.node_type == "Seq Scan" and n.removed > MIN_BENEFIT_ROWS
                                                  for n in ev.nodes):
        return _nothing(insights, f"the query already runs in {_ms(ctx.execution_ms)}", 0.8,
                        ev.main_table())
    designs: list[IndexDesign] = []
    for table in ev.query_tables():
        info = ev.table(table)
        if info is None:
            continue
        if max(info.rows, ev.scanned_rows(table)) < SMALL_TABLE_ROWS:
            if ev.uses(table, "equality", "range", "join") or ev.indexable(table):
                notes.append(f"{table} has {_n(info.rows)} rows: scanning it is cheap")
            continue
        found = _filter_design(ev, table, notes)
        if found:
            designs.append(found)
        designs.extend(_join_designs(ev, table, notes))
        designs.extend(_indexable_designs(ev, table, notes))
    insights.extend(dict.fromkeys(notes))
    best = max(designs, key=lambda d: d.benefit, default=None)
    if best is None or best.benefit < MIN_BENEFIT_ROWS:
        why = ("no filter, sort or join column of a large table lacks a fitting index"
               if best is None else f"the best index would spare too few row visits (~{_n(best.benefit)})")
        confident = any("already" in n for n in notes)
        return _nothing(insights, why, 0.85 if confident else 0.6, ev.main_table())
    improvement = _improvement(ev, best.table, best.fraction,
                               whole_join=best.kind == "join" or best.sort_served)
    evidence_strength = 0.55
    observed = ev.observed_fraction(best.table)
    if ev.seq_scanned(best.table) or best.kind == "join":
        evidence_strength += 0.2
    if observed is not None and observed <= INDEX_MAX_FRACTION:
        evidence_strength += 0.1
    if all(ev.stats(best.table, c) is not None for c in best.columns):
        evidence_strength += 0.1
    if ev.writes_per_read(best.table) > WRITE_HEAVY:
        evidence_strength -= 0.15
    action = f"Create index on {best.describe()}"
    if best.kind == "join":
        action += " to turn the join into a nested loop over the index"
    proposal = _index_proposal(agent, ev, best, improvement)
    return Decision(insights=tuple(insights), actions=(action,), confidence=evidence_strength,
                    target_table=best.table, estimated_improvement=improvement, proposal=proposal)


# -- gemini-2.5-flash: structure for large tables ------------------------------------------
def _time_columns(ev: Evidence, table: str) -> list[tuple[str, str, list[ColumnUse]]]:
    info = ev.table(table)
    if info is None:
        return []
    out: list[tuple[str, str, list[ColumnUse]]] = []
    for column, uses in ev.ranges(table).items():
        data_type = _column_type(info, column) or ""
        if data_type.startswith(TIME_TYPES):
            out.append((column, data_type, uses))
    return out


def _month_floor(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def _add_months(moment: datetime, months: int) -> datetime:
    index = moment.year * 12 + moment.month - 1 + months
    return moment.replace(year=index // 12, month=index % 12 + 1)


def _bound_literal(moment: datetime, data_type: str) -> str:
    if data_type == "date":
        return f"'{moment:%Y-%m-%d}'"
    if "with time zone" in data_type:
        return f"'{moment:%Y-%m-%d %H:%M:%S}+00'"
    return f"'{moment:%Y-%m-%d %H:%M:%S}'"


def _reindex_on(index: IndexInfo, new_table: str, partition_column: str, old_table: str,
                taken: set[str]) -> str | None:
    """The CREATE INDEX that gives the partitioned copy what `index` gave the old table; its
    name joins `taken`, so two indexes on the same columns (say B-tree and BRIN) get two names."""
    found = index_keys(index)
    if found is None:
        return None
    keys, tail = found
    unique = index.unique or index.primary
    if unique and partition_column not in [_norm_col(c) for c in index.columns]:
        keys.append(ident(partition_column))  # unique keys of a partitioned table include its key
    name = object_name("afs", _rel(old_table), "p", *index.columns, suffix="key" if unique else "idx",
                       taken=taken)
    taken.add(name)
    return (f"CREATE {'UNIQUE ' if unique else ''}INDEX {ident(name)} ON {new_table} "
            f"USING {index_method(index)} ({', '.join(keys)}){tail}")


def _migration_name(table: str, role: Literal["part", "old"]) -> str:
    """`<table>_afs_part`, the partitioned copy, or `<table>_afs_old`, the table kept for
    rollback: distinct even when a long table name must be cut to 63 bytes."""
    return object_name(_rel(table), "afs", suffix=role)


def _partitioning(ev: Evidence, table: str, column: str, data_type: str,
                  low: datetime, high: datetime) -> tuple[list[str], list[str], int, str]:
    """The migration recipe: commands, rollback, number of partitions, period."""
    info = ev.table(table)
    assert info is not None
    schema, rel = _schema_and_rel(table)
    prefix = f"{ident(schema)}." if schema else ""
    part, old = _migration_name(table, "part"), _migration_name(table, "old")
    start, stop = _month_floor(low), _add_months(_month_floor(high), 1)
    months = (stop.year - start.year) * 12 + stop.month - start.month
    periods = ((1, "month"), (3, "quarter"))
    step, period = next(((n, p) for n, p in periods if math.ceil(months / n) <= MAX_PARTITIONS), (12, "year"))
    count = min(MAX_PARTITIONS, math.ceil(months / step))
    if count * step < months:  # even yearly is too many: keep the newest, the rest goes to DEFAULT
        start = _add_months(stop, -count * step)
    target = f"{prefix}{ident(part)}"
    commands = [f"CREATE TABLE {target} (LIKE {qualified(table)} INCLUDING DEFAULTS INCLUDING CONSTRAINTS) "
                f"PARTITION BY RANGE ({ident(column)})"]
    for i in range(count):
        lo, hi = _add_months(start, i * step), _add_months(start, (i + 1) * step)
        label = f"{lo:%Y_%m}" if step < 12 else f"{lo:%Y}"
        name = object_name(rel, "afs", label, suffix="p")
        commands.append(f"CREATE TABLE {prefix}{ident(name)} PARTITION OF {target} "
                        f"FOR VALUES FROM ({_bound_literal(lo, data_type)}) "
                        f"TO ({_bound_literal(hi, data_type)})")
    commands.append(f"CREATE TABLE {prefix}{ident(object_name(rel, 'afs', suffix='default'))} "
                    f"PARTITION OF {target} DEFAULT")
    commands.append(f"INSERT INTO {target} SELECT * FROM {qualified(table)}")
    index_names: set[str] = set()
    for index in info.indexes:
        statement = _reindex_on(index, target, column, table, index_names)
        if statement:
            commands.append(statement)
    commands += [f"ALTER TABLE {qualified(table)} RENAME TO {ident(old)}",
                 f"ALTER TABLE {target} RENAME TO {ident(rel)}",
                 f"ANALYZE {qualified(table)}"]
    rollback = [f"ALTER TABLE {qualified(table)} RENAME TO {ident(part)}",
                f"ALTER TABLE {prefix}{ident(old)} RENAME TO {ident(rel)}",
                f"DROP TABLE IF EXISTS {target}"]
    return commands, rollback, count + 1, period


def _names(tables: Sequence[str]) -> str:
    return ", ".join(tables[:-1]) + " and " + tables[-1] if len(tables) > 1 else "".join(tables)


def _fallback_index(agent: AgentKey, ev: Evidence, insights: list[str], why: str) -> Decision:
    """One index, or nothing: a low-risk B-tree on the most selective equality column,
    LIKE-prefixed column (with its pattern operator class) or equality-tested expression;
    GIN (medium risk) only when no B-tree fits, for jsonb containment or key tests."""
    best: IndexDesign | None = None
    for table in ev.query_tables():
        info = ev.table(table)
        if info is None or max(info.rows, ev.scanned_rows(table)) < SMALL_TABLE_ROWS:
            continue
        rows = float(info.rows)
        visited = max(ev.scanned_rows(table), rows)
        candidates: list[IndexDesign] = []
        for use in ev.uses(table, "equality"):
            if (use.operator or "=").upper() not in EQUALITY_OPS:
                continue
            if covering_index(info, [use.column]):
                insights.append(f"{use.column} on {table} is already indexed")
                continue
            sel, note = _selectivity_note(ev, table, use)
            insights.append(note)
            candidates.append(IndexDesign(
                table=table, key=(KeyColumn(use.column),), kind="filter", fraction=sel,
                benefit=visited * (1 - sel),
                reasons=(f"{use.column} is the most selective equality filter on {table} "
                         f"(~{_pct(sel)} of {_n(info.rows)} rows).",)))
        for choice in _pattern_choices(ev, table, _like_patterns(ev, table), ev.only_filter(table)):
            classes = {choice.column: choice.opclass or ""}
            if covering_index(info, [], [choice.column], opclasses=classes):
                insights.append(f"{choice.column} on {table} is already indexed with {choice.opclass}")
                continue
            insights.append(choice.note)
            candidates.append(IndexDesign(
                table=table, key=(KeyColumn(choice.column, opclass=choice.opclass,
                                            label=f"{choice.column}_pattern"),),
                kind="filter", fraction=choice.fraction, benefit=visited * (1 - choice.fraction),
                reasons=(choice.note,)))
        notes: list[str] = []
        candidates.extend(_indexable_designs(ev, table, notes))
        insights.extend(n for n in dict.fromkeys(notes) if n not in insights)
        for design in candidates:
            rank = (design.method != "btree", design.fraction)
            if design.fraction <= INDEX_MAX_FRACTION and (
                    best is None or rank < (best.method != "btree", best.fraction)):
                best = design
    insights.append(why)
    if best is None:
        return _nothing(insights, "no selective equality, LIKE-prefix or expression filter on a large "
                        "table lacks an index", 0.6, ev.main_table())
    design, table = best, best.table
    if design.benefit < MIN_BENEFIT_ROWS:
        return _nothing(insights, "an index would spare too few row visits", 0.6, table)
    improvement = _improvement(ev, table, design.fraction)
    if improvement < MIN_IMPROVEMENT:
        share = _time_share(ev, table)
        key = ", ".join(k.sql() for k in design.key)
        return _nothing(insights, f"an index on {table} ({key}) would save at most ~{_pct(share)} of "
                        "the time: the cost is elsewhere in the plan", 0.6, table)
    proposal = _index_proposal(agent, ev, design, improvement)
    return Decision(insights=tuple(insights), actions=(f"Create index on {design.describe()}",),
                    confidence=0.55, target_table=table, estimated_improvement=improvement,
                    proposal=proposal)


def decide_structure(ctx: AnalysisContext, agent: AgentKey = "gemini25flash") -> Decision:
    """gemini-2.5-flash: BRIN or range partitioning for a large table filtered by time."""
    ev = Evidence(ctx)
    insights = plan_insights(ev.nodes, ctx.execution_ms)
    candidates: list[tuple[float, str, str, str, list[ColumnUse]]] = []
    for table in ev.query_tables():
        info = ev.table(table)
        if info is None:
            continue
        for column, data_type, uses in _time_columns(ev, table):
            candidates.append((-max(info.rows, ev.scanned_rows(table)), table, column, data_type, uses))
    if not candidates:
        return _fallback_index(agent, ev, insights, "no range filter on a timestamp column: "
                               "structure changes (BRIN, partitioning) aren't warranted")
    _, table, column, data_type, uses = min(candidates, key=lambda c: c[0])
    info = ev.table(table)
    assert info is not None
    rows = float(info.rows)
    stats = ev.stats(table, column)
    only_filter = len({u.column for u in ev.uses(table, "equality", "range")}) == 1
    fraction, source = _range_estimate(ev, table, column, uses, only_filter)
    corr = stats.correlation if stats and stats.correlation is not None else None
    span = _span(uses)
    insights.append(f"{table} has {_n(rows)} rows ({info.size_mb:,.0f} MB); {column} {span} "
                    f"keeps ~{_pct(fraction)} of them ({source})")
    if corr is not None:
        insights.append(f"{column} correlation with the physical row order is {corr:.2f}")
    bounds = [parse_timestamp(b) for b in stats.histogram_bounds] if stats else []
    moments = [b for b in bounds if b is not None]
    referenced = info.referenced_by
    old_copy = _migration_name(table, "old")
    if referenced:
        fk_note = (f"Foreign keys of {_names(referenced)} reference {table}: after the swap they still "
                   f"point at the renamed old copy {old_copy}, and they cannot simply be recreated on "
                   f"the partitioned table, whose unique keys must include {column}. LIKE copies "
                   f"neither the primary key nor {table}'s own foreign keys; views on it follow the old "
                   "copy too. Fine in a fork; a production migration must rework them.")
    else:
        fk_note = (f"No foreign key references {table}. LIKE copies neither its primary key nor its own "
                   "foreign keys, and views on it follow the old copy. Fine in a fork; a production "
                   "migration must recreate them.")
    can_partition = rows >= PARTITION_MIN_ROWS and fraction <= PARTITION_MAX_FRACTION and len(moments) >= 2
    can_brin = rows >= BRIN_MIN_ROWS and corr is not None and abs(corr) >= BRIN_MIN_CORRELATION
    if can_partition and referenced and can_brin:
        insights.append(f"{table} is referenced by foreign keys of {_names(referenced)}: partitioning it "
                        f"would leave them on the old copy (a partitioned table's unique keys must include "
                        f"{column}), so BRIN, which prunes as well on this correlated column, is preferred")
        can_partition = False
    elif can_partition and referenced:
        insights.append(f"{table} is referenced by foreign keys of {_names(referenced)}, but BRIN would not "
                        f"prune here: partitioning, with the foreign keys to rework")
    if can_partition:
        commands, rollback, parts, period = _partitioning(ev, table, column, data_type,
                                                          min(moments), max(moments))
        improvement = round(max(10.0, min(90.0, 90.0 * (1.0 - fraction))), 1)
        insights.append(f"range partitioning by {period} on {column} lets the planner prune all but "
                        f"~{_pct(fraction)} of {table}")
        rationale = (f"{table} holds {_n(rows)} rows and the query reads a time range of {column} that "
                     f"keeps ~{_pct(fraction)} of them; the plan scans "
                     f"{_n(max(ev.scanned_rows(table), rows))} rows. Partitioning {table} by {period} "
                     f"on {column} ({parts} partitions "
                     f"incl. DEFAULT, from {min(moments):%Y-%m} to {max(moments):%Y-%m}) lets partition "
                     f"pruning skip the rest, and keeps old data cheap to archive. The migration copies "
                     f"the table in the fork and renames it into place; the old copy stays as "
                     f"{old_copy} for rollback. {fk_note}")
        proposal = OptimizationProposal(
            agent=agent, proposal_type="partitioning", sql_commands=tuple(commands),
            rollback_commands=tuple(rollback), rationale=rationale,
            estimated_impact=EstimatedImpact(query_time_improvement=improvement,
                                             storage_overhead_mb=round(info.size_mb, 1),
                                             complexity="high", risk="high" if referenced else "medium"),
            validation_steps=(f"EXPLAIN shows only the partitions of {_rel(table)} that overlap the range",
                              f"SELECT count(*) FROM {qualified(table)} equals the count before",
                              "the query returns the same rows as before (count and checksum)"))
        confidence = (0.7 if corr is not None else 0.6) - (0.15 if referenced else 0.0)
        return Decision(insights=tuple(insights),
                        actions=(f"Partition {table} by RANGE ({column}), one partition per {period}",),
                        confidence=confidence, target_table=table,
                        estimated_improvement=improvement, proposal=proposal)
    if can_brin and corr is not None:
        existing = covering_index(info, [], [column], method="brin")
        if existing is not None:
            return _nothing(insights, f"{existing.name} is already a BRIN index on {column}", 0.8, table)
        if fraction > BRIN_MAX_FRACTION:
            return _fallback_index(agent, ev, insights, f"the range keeps {_pct(fraction)} of rows: a BRIN "
                                   "index would skip too little")
        name = index_name(table, [column], suffix="brin", taken=[ix.name for ix in info.indexes])
        ranges = max(1.0, info.size_mb * 1024 / 8 / 128)  # 8 kB pages, 128 per range
        storage = round(max(0.02, ranges * 32 / 1024 / 1024), 2)
        improvement = round(max(5.0, min(85.0, 85.0 * (1.0 - fraction))), 1)
        risk, warnings = _write_risk(ev, table)
        rationale = (f"{table} has {_n(rows)} rows and {column} follows the physical row order "
                     f"(correlation {corr:.2f}), so a BRIN index of ~{_n(ranges)} block ranges "
                     f"(~{storage} MB, against ~{_btree_mb(rows, [_column_width(info, column)]):.0f} MB for "
                     f"a B-tree) lets a Bitmap Heap Scan skip the ~{_pct(1 - fraction)} of the table outside "
                     f"{column} {span}. "
                     + (f"Unlike partitioning, it leaves the foreign keys of {_names(referenced)} intact. "
                        if referenced else "")
                     + " ".join(warnings))
        proposal = OptimizationProposal(
            agent=agent, proposal_type="index",
            sql_commands=(f"CREATE INDEX {ident(name)} ON {qualified(table)} USING brin ({ident(column)})",),
            rollback_commands=(_drop_index(table, name),),
            rationale=rationale.strip(),
            estimated_impact=EstimatedImpact(query_time_improvement=improvement, storage_overhead_mb=storage,
                                             complexity="low", risk=risk),
            validation_steps=(f"EXPLAIN shows Bitmap Index Scan using {name}",
                              "Rows Removed by Index Recheck stays small against the rows returned",
                              "the query returns the same rows as before (count and checksum)"))
        return Decision(insights=tuple(insights),
                        actions=(f"Create BRIN index on {table} ({column})",), confidence=0.75,
                        target_table=table, estimated_improvement=improvement, proposal=proposal)
    if corr is not None and abs(corr) < BRIN_MIN_CORRELATION:
        why = f"{column} is not in physical order (correlation {corr:.2f}): BRIN would not prune"
    elif rows < BRIN_MIN_ROWS:
        why = f"{table} has {_n(rows)} rows: structure changes (BRIN, partitioning) aren't warranted"
    else:
        why = f"no statistics for {column}: cannot tell whether BRIN or partitioning would prune"
    return _fallback_index(agent, ev, insights, why)


# -- gemini-2.0-flash: pre-computation ------------------------------------------------------
@dataclass(frozen=True)
class MaterializedView:
    name: str
    definition: str  # the SELECT stored in the view
    rewrite: str  # the query that reads it and returns the original query's rows
    columns: tuple[str, ...]  # the view's columns
    filter_columns: tuple[str, ...]  # view columns the rewrite filters on
    group_columns: tuple[str, ...]  # view columns that identify a row; () when unknown
    moved: tuple[str, ...]  # predicates moved from the view to the rewrite


def _output_name(node: exp.Expr) -> str:
    """The column name PostgreSQL gives an unaliased select item (FigureColname, simplified)."""
    if isinstance(node, exp.Column):
        return str(node.name)
    if isinstance(node, exp.Cast):
        inner = _output_name(node.this)
        return inner if inner != "?column?" else node.to.sql(dialect="postgres").lower().split("(")[0]
    if isinstance(node, exp.Case):
        return "case"
    if isinstance(node, exp.Func):
        if isinstance(node, exp.Anonymous):
            return str(node.name).lower()
        head = re.match(r"[A-Za-z_][A-Za-z0-9_]*", node.sql(dialect="postgres"))
        return head.group(0).lower() if head else "?column?"
    return "?column?"


def _expression_key(node: exp.Expr, one_table: bool) -> str:
    """What identifies an expression of the query: its SQL, without table qualifiers when the
    query reads one table (then `o.status` is `status`; in a join it may be another table's)."""
    if not one_table:
        return node.sql(dialect="postgres")
    copy = node.copy()
    for column in copy.find_all(exp.Column):
        column.set("table", None)
        column.set("db", None)
    return copy.sql(dialect="postgres")


def _match_output(target: exp.Expr, items: Sequence[exp.Expr], names: Sequence[str],
                  prefer_names: bool, one_table: bool) -> int | None:
    """The select item an ORDER BY / GROUP BY expression denotes, as PostgreSQL resolves it."""
    if isinstance(target, exp.Literal) and not target.is_string:
        try:
            position = int(target.this)
        except ValueError:
            return None
        return position - 1 if 0 < position <= len(items) else None
    if prefer_names and isinstance(target, exp.Column) and not target.table:
        hits = [i for i, n in enumerate(names) if n == target.name]
        if len(hits) == 1:
            return hits[0]
    bases = [it.unalias() if isinstance(it, exp.Alias) else it for it in items]
    for i, base in enumerate(bases):
        if base == target:
            return i
    key = _expression_key(target, one_table)
    hits = [i for i, base in enumerate(bases) if _expression_key(base, one_table) == key]
    return hits[0] if len(hits) == 1 else None


def _alias(node: exp.Expr, name: str) -> exp.Expr:
    return exp.alias_(node, exp.to_identifier(name, quoted=ident(name) != name))


def _col(name: str) -> exp.Column:
    return exp.column(exp.to_identifier(name, quoted=ident(name) != name))


def materialize(query: str) -> MaterializedView | str:
    """A materialized view of an aggregate query and the rewrite reading it, or why not.

    The view stores the query without ORDER BY / LIMIT / OFFSET. WHERE terms that
    only test GROUP BY columns are moved to the rewrite (filtering whole groups
    commutes with grouping), so the view serves every value and an index on those
    columns serves the lookup. The rewrite keeps the original column names, order,
    ORDER BY and LIMIT, so it returns the same rows."""
    return _materialize(_parse(query))


def _materialize(tree: exp.Expr | None) -> MaterializedView | str:
    """`materialize` of a parsed query (`tree` is left as it is)."""
    if not isinstance(tree, exp.Select):
        return "not a single SELECT"
    if tree.args.get("locks"):
        return "SELECT … FOR UPDATE cannot be precomputed"
    group = tree.args.get("group")
    distinct = tree.args.get("distinct")
    if not (group or distinct or _aggregates(tree)):
        return "no aggregation (GROUP BY, aggregate or DISTINCT) to precompute"
    volatile = _volatile(tree)
    if volatile:
        return f"the query calls {', '.join(volatile)}(): a materialized view would freeze its value"
    if tree.find(exp.Placeholder, exp.Parameter):
        return "the query has parameters: a view can only hold constants"
    if distinct is not None and distinct.args.get("on") is not None:
        return "DISTINCT ON depends on ORDER BY: not precomputed"

    one_table = not tree.args.get("joins")
    core = tree.copy()
    order = core.args.get("order")
    limit, offset = core.args.get("limit"), core.args.get("offset")
    for key in ("order", "limit", "offset"):
        core.set(key, None)
    items = list(core.expressions)
    names: list[str] = []
    view_items: list[exp.Expr] = []
    view_names: list[str] = []
    rewrite_items: list[exp.Expr] = []
    explicit = False
    for i, item in enumerate(items):
        if isinstance(item, exp.Star) or (isinstance(item, exp.Column) and isinstance(item.this, exp.Star)):
            return "SELECT * in an aggregate query: columns cannot be named safely"
        name = str(item.alias) if isinstance(item, exp.Alias) else _output_name(item)
        names.append(name)
        base = item.unalias() if isinstance(item, exp.Alias) else item
        if name == "?column?" or name in view_names:
            view_name = f"afs_c{i + 1}"
            explicit = True
            rewrite_items.append(_alias(_col(view_name), name))
        else:
            view_name = name
            rewrite_items.append(_col(name))
        view_names.append(view_name)
        view_items.append(item.copy() if isinstance(item, exp.Alias | exp.Column) and view_name == name
                          else _alias(base.copy(), view_name))

    def view_column(target: exp.Expr, prefix: str, prefer_names: bool) -> str | None:
        nonlocal explicit
        found = _match_output(target, items, names, prefer_names, one_table)
        if found is not None:
            return view_names[found]
        if distinct is not None:
            return None  # an extra column would change what DISTINCT collapses
        hidden = f"{prefix}{len(view_items) + 1}"
        view_items.append(_alias(target.copy(), hidden))
        view_names.append(hidden)
        explicit = True
        return hidden

    new_order: list[exp.Expr] = []
    for item in order.expressions if order else ():
        target = item.this
        if isinstance(target, exp.Literal) and not target.is_string:
            new_order.append(item.copy())
            continue
        sort_column = view_column(target, "afs_o", prefer_names=True)
        if sort_column is None:
            return f"ORDER BY {target.sql(dialect='postgres')} is not an output column"
        ordered = item.copy()
        ordered.set("this", _col(sort_column))
        new_order.append(ordered)

    plain_group = (group is not None and group.expressions
                   and not any(group.args.get(k) for k in ("rollup", "cube", "grouping_sets"))
                   and all(not isinstance(g, exp.Literal) or not g.is_string for g in group.expressions))
    group_exprs: list[exp.Expr] = []
    if plain_group and group is not None:
        for g in group.expressions:
            if isinstance(g, exp.Literal):
                position = _match_output(g, items, names, False, one_table)
                if position is None:
                    return "GROUP BY position out of range"
                base = items[position]
                group_exprs.append(base.unalias() if isinstance(base, exp.Alias) else base)
            else:
                group_exprs.append(g)
    group_sql = {_expression_key(g, one_table) for g in group_exprs if isinstance(g, exp.Column)}
    moved: list[exp.Expr] = []
    filter_columns: list[str] = []
    where = core.args.get("where")
    if plain_group and where is not None and core.find(exp.Window) is None and distinct is None:
        keep: list[exp.Expr] = []
        for term in conjuncts(where.this):
            columns = list(term.find_all(exp.Column))
            movable = (columns and all(_expression_key(c, one_table) in group_sql for c in columns)
                       and term.find(exp.Subquery, exp.Select, exp.AggFunc, exp.Window) is None)
            if not movable:
                keep.append(term)
                continue
            moved_term = term.copy()
            for column in list(moved_term.find_all(exp.Column)):
                group_column = view_column(column, "afs_g", prefer_names=False)
                if group_column is None:
                    return "internal: a group column is missing from the view"
                if group_column not in filter_columns:
                    filter_columns.append(group_column)
                column.replace(_col(group_column))
            moved.append(moved_term)
        core.set("where", exp.Where(this=exp.and_(*keep)) if keep else None)

    group_columns: list[str] = []
    if plain_group:
        for g in group_exprs:
            found = _match_output(g, items, names, False, one_table)
            if found is None:
                hidden = [view_names[i] for i, it in enumerate(view_items)
                          if i >= len(items)
                          and _expression_key(it.unalias(), one_table) == _expression_key(g, one_table)]
                if not hidden:
                    group_columns = []
                    break
                group_columns.append(hidden[0])
            else:
                group_columns.append(view_names[found])
        group_columns = list(dict.fromkeys(group_columns))

    core.set("expressions", view_items)
    definition = core.sql(dialect="postgres")
    name = f"afs_mv_{_hash(definition, 10)}"
    select: exp.Select = exp.select(*(rewrite_items if explicit else [exp.Star()])).from_(exp.to_table(name))
    if moved:
        select = select.where(*moved)
    if new_order:
        select.set("order", exp.Order(expressions=new_order))
    if limit is not None:
        select.set("limit", limit.copy())
    if offset is not None:
        select.set("offset", offset.copy())
    return MaterializedView(
        name=name, definition=definition, rewrite=select.sql(dialect="postgres"),
        columns=tuple(view_names), filter_columns=tuple(filter_columns),
        group_columns=tuple(group_columns), moved=tuple(m.sql(dialect="postgres") for m in moved))


def _aggregate_input_rows(ev: Evidence) -> float:
    aggregates = [n for n in ev.nodes if n.node_type == "Aggregate"]
    if aggregates:
        return max(max(n.input_rows for n in aggregates),
                   sum(n.scanned for n in ev.nodes if n.is_scan))
    return float(sum(info.rows for info in ev.ctx.tables.values()))


def _group_estimate(ev: Evidence, mv: MaterializedView, table: str | None) -> float:
    aggregates = [n for n in ev.nodes if n.node_type == "Aggregate"]
    if aggregates and not mv.moved:
        return max(1.0, min(aggregates, key=lambda n: n.depth).rows)
    info = ev.table(table) if table else None
    if not mv.group_columns or info is None:
        return 1.0 if not mv.group_columns else 1000.0
    estimate = 1.0
    for column in mv.group_columns:
        stats = info.column_stats.get(column)
        nd = distinct_values(stats, info.rows) if stats else None
        estimate *= nd if nd else 100.0
    return max(1.0, min(float(info.rows), estimate))


def decide_precomputation(ctx: AnalysisContext, agent: AgentKey = "gemini20flash") -> Decision:
    """gemini-2.0-flash: a materialized view for an aggregation; else a low-risk index."""
    ev = Evidence(ctx)
    insights = plan_insights(ev.nodes, ctx.execution_ms)
    if not ev.shape.grouped and ctx.features.aggregation_count == 0:
        return _fallback_index(agent, ev, insights,
                               "no aggregation to precompute: a single low-risk index at most")
    mv = _materialize(ev.shape.tree)
    if isinstance(mv, str):
        return _fallback_index(agent, ev, insights, f"no materialized view: {mv}")
    table = ev.main_table()
    aggregated = _aggregate_input_rows(ev)
    groups = _group_estimate(ev, mv, table)
    insights.append(f"the aggregation reads ~{_n(aggregated)} rows to produce ~{_n(groups)} groups")
    if aggregated < MV_MIN_ROWS and ctx.execution_ms < 10 * FAST_MS:
        return _nothing(insights, f"the aggregation reads only {_n(aggregated)} rows: "
                        "a materialized view would not pay for its refreshes", 0.6, table)
    commands = [f"CREATE MATERIALIZED VIEW {mv.name} AS {mv.definition}"]
    # The rewrite filters on group keys: index them. Unique when they are the whole group
    # key, which also allows REFRESH … CONCURRENTLY. A view read whole needs no index.
    unique = bool(mv.group_columns) and set(mv.filter_columns) <= set(mv.group_columns)
    index_cols = list(dict.fromkeys([*mv.filter_columns, *(mv.group_columns if unique else ())]))
    if mv.filter_columns and unique:
        commands.append(f"CREATE UNIQUE INDEX {object_name(mv.name, *index_cols, suffix='key')} "
                        f"ON {mv.name} ({', '.join(ident(c) for c in index_cols)})")
    elif mv.filter_columns:
        commands.append(f"CREATE INDEX {object_name(mv.name, *mv.filter_columns, suffix='idx')} "
                        f"ON {mv.name} ({', '.join(ident(c) for c in mv.filter_columns)})")
    commands.append(f"ANALYZE {mv.name}")
    wpr = ev.writes_per_read(table)
    risk: RiskLevel = "low" if wpr < 0.05 else "medium"
    info = ev.table(table) if table else None
    # heap tuple header + the columns (real widths for the table's own columns, 8 bytes for
    # aggregates) + line pointer
    widths = [_column_width(info, c) if info and _column_type(info, c) else 8 for c in mv.columns]
    storage = round(max(0.01, groups * (24 + max(8, sum(widths)) + 4) / 1024 / 1024), 2)
    improvement = round(max(10.0, min(95.0, 100.0 * (1.0 - groups / max(aggregated, 1.0)))), 1)
    if mv.filter_columns and unique:
        refresh = f"REFRESH MATERIALIZED VIEW CONCURRENTLY {mv.name} (the unique index allows it)"
    elif mv.group_columns:
        refresh = (f"REFRESH MATERIALIZED VIEW {mv.name} (a unique index on "
                   f"({', '.join(mv.group_columns)}) would allow CONCURRENTLY)")
    else:
        refresh = f"REFRESH MATERIALIZED VIEW {mv.name}"
    moved = (f" The filter {' AND '.join(mv.moved)} moves from the view to the rewrite and uses the "
             f"view's index, so the view also answers other values." if mv.moved else "")
    staleness = (f" {table} sees {wpr:.2f} writes per read: the view goes stale between refreshes."
                 if wpr >= 0.05 else f" {table} is read-mostly ({wpr:.2f} writes per read), so staleness "
                 "is cheap to manage." if table else "")
    rationale = (f"The query aggregates ~{_n(aggregated)} rows into ~{_n(groups)} groups on every run "
                 f"({_ms(ctx.execution_ms)}). {mv.name} stores the result; the rewritten query reads "
                 f"~{_n(groups)} rows instead.{moved} Keep it fresh with {refresh}, e.g. from a "
                 f"scheduled batch job.{staleness}")
    proposal = OptimizationProposal(
        agent=agent, proposal_type="materialized_view", sql_commands=tuple(commands),
        rollback_commands=(f"DROP MATERIALIZED VIEW IF EXISTS {mv.name}",), rationale=rationale,
        estimated_impact=EstimatedImpact(query_time_improvement=improvement, storage_overhead_mb=storage,
                                         complexity="medium", risk=risk),
        rewritten_query=mv.rewrite, needs_refresh=True,
        validation_steps=(f"the rewritten query ({mv.rewrite}) returns the same rows as the original "
                          "(count and checksum)",
                          f"EXPLAIN of the rewrite scans {mv.name} only",
                          refresh.split(" (")[0] + " succeeds"))
    return Decision(insights=tuple(insights),
                    actions=(f"Create materialized view {mv.name} and read it with: {mv.rewrite}",),
                    confidence=0.7 if ev.nodes else 0.55, target_table=table,
                    estimated_improvement=improvement, proposal=proposal)


# -- secondary expertise ---------------------------------------------------------------------
# The seed's router sends aggregations to gemini-2.5-flash ("simple aggregation") and to
# gemini-2.5-pro ("complex aggregation - include gemini-2.5-pro for mat views"), and lists
# summary/rollup tables among gemini-2.5-flash's schema modifications. So when their own
# specialty finds nothing for an aggregating query, they fall back to pre-computation.
ROLLUP_MIN_COMPLEXITY: Final = {"gemini25flash": 0, "gemini25pro": 5}


def with_rollup(primary: Callable[[AnalysisContext, AgentKey], Decision]
                ) -> Callable[[AnalysisContext, AgentKey], Decision]:
    """`primary`, falling back to a materialized view when it proposes nothing for an aggregation."""

    def decide(ctx: AnalysisContext, agent: AgentKey) -> Decision:
        decision = primary(ctx, agent)
        if (decision.proposal is not None
                or ctx.features.complexity_score < ROLLUP_MIN_COMPLEXITY.get(agent, 0)):
            return decision
        rollup = decide_precomputation(ctx, agent)  # a view only for an aggregation, else an index
        if rollup.proposal is None or rollup.proposal.proposal_type != "materialized_view":
            return decision
        why = (f"{decision.actions[0]}; as a summary table instead (secondary expertise), "
               if decision.actions else "")
        extra = tuple(i for i in rollup.insights if i not in decision.insights)
        return Decision(insights=(*decision.insights, *extra),
                        actions=(why + rollup.actions[0],) if why else rollup.actions,
                        confidence=rollup.confidence - 0.05, target_table=rollup.target_table,
                        estimated_improvement=rollup.estimated_improvement, proposal=rollup.proposal)

    return decide


# -- the registry ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Strategist:
    """An offline brain: one decide-function gives both the analysis and the proposal."""

    agent: AgentKey
    decide: Callable[[AnalysisContext, AgentKey], Decision]

    def analyze(self, ctx: AnalysisContext) -> AnalysisResult:
        return self.decide(ctx, self.agent).analysis(ctx)

    def propose(self, ctx: AnalysisContext, analysis: AnalysisResult) -> OptimizationProposal | None:
        # The strategist's analysis is a pure function of ctx: decide again rather than parse
        # its own prose back. (`analysis` matters to model brains; it is accepted for symmetry.)
        del analysis
        return self.decide(ctx, self.agent).proposal


STRATEGISTS: Mapping[AgentKey, Strategist] = {
    "gemini25pro": Strategist("gemini25pro", with_rollup(decide_index_design)),
    "gemini25flash": Strategist("gemini25flash", with_rollup(decide_structure)),
    "gemini20flash": Strategist("gemini20flash", decide_precomputation),
}


def _strategist(agent: str) -> Strategist:
    try:
        return STRATEGISTS[agent]
    except KeyError:
        raise InputError(f"no offline strategist for agent {agent!r} "
                         f"(known: {', '.join(STRATEGISTS)})") from None


def analyze(agent: str, ctx: AnalysisContext) -> AnalysisResult:
    """The agent's analysis of the query: insights with numbers, actions, confidence, metadata."""
    return _strategist(agent).analyze(ctx)


def propose(agent: str, ctx: AnalysisContext, analysis: AnalysisResult) -> OptimizationProposal | None:
    """The agent's proposal, or None when nothing is worth proposing (its analysis says why)."""
    return _strategist(agent).propose(ctx, analysis)


def iter_proposal_sql(proposal: OptimizationProposal) -> Iterator[str]:
    """Every statement of a proposal: its commands, its rollback and its rewrite."""
    yield from proposal.sql_commands
    yield from proposal.rollback_commands
    if proposal.rewritten_query:
        yield proposal.rewritten_query
