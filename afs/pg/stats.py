"""Statistics, types and sizes as PostgreSQL reckons them (pure).

    selectivity   equality_selectivity, range_fraction, prefix_fraction: the fraction of a
                  table's rows a predicate keeps, from pg_stats (MCVs, histogram,
                  n_distinct, null_frac), the way the planner estimates it; like_prefix,
                  parse_timestamp read a LIKE pattern and a histogram bound
    values        common_values (most common values, most frequent first, with their share),
                  quantile (a value of an ordered distribution): how the query family and
                  the `$n` filling (afs.params) read pg_stats, one way
    defaults      DEFAULT_*_SEL: the planner's own guesses when there are no statistics
    types, sizes  column_type, base_type, column_width (pg_stats avg_width, else by type),
                  pattern_opclass, btree_mb and gin_mb (the size of a new index)
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, Final, TypeVar

from afs.models import ColumnStats, TableInfo

_T = TypeVar("_T")

DEFAULT_EQ_SEL: Final = 0.005  # PostgreSQL's DEFAULT_EQ_SEL, when there are no statistics
DEFAULT_RANGE_SEL: Final = 1 / 3  # PostgreSQL's DEFAULT_INEQ_SEL
DEFAULT_MATCH_SEL: Final = 0.005  # PostgreSQL's DEFAULT_MATCH_SEL (LIKE), when there are no statistics
DEFAULT_CONTAIN_SEL: Final = 0.01  # PostgreSQL's DEFAULT_MATCHING_SEL (jsonb @>, ?), likewise
JSON_VALUE_WIDTH: Final = 16  # bytes assumed for a value extracted from json (no statistics on it)
GIN_BYTES_PER_WIDTH: Final = {"jsonb_path_ops": 0.15, None: 0.22,  # GIN size per byte of jsonb, measured
                               "gin_trgm_ops": 1.5}  # a trigram per character: larger than the text
# collations that order text byte by byte: a plain B-tree serves `LIKE 'prefix%'` under them
C_COLLATIONS: Final = frozenset({"C", "POSIX"})
_TYPE_WIDTH: Final = {
    "smallint": 2, "integer": 4, "int": 4, "bigint": 8, "boolean": 1, "date": 4, "real": 4,
    "double precision": 8, "timestamp": 8, "time": 8, "uuid": 16, "numeric": 10, "oid": 4,
}
# the B-tree operator class that serves `LIKE 'prefix%'` whatever the collation, by column type
PATTERN_OPCLASSES: Final = {
    "text": "text_pattern_ops", "character varying": "varchar_pattern_ops",
    "character": "bpchar_pattern_ops",
}


# -- statistics ----------------------------------------------------------------------
def distinct_values(stats: ColumnStats, rows: float) -> float | None:
    """pg_stats.n_distinct as a count (negative values are a fraction of the rows)."""
    if stats.n_distinct > 0:
        return stats.n_distinct
    if stats.n_distinct < 0:
        return max(1.0, -stats.n_distinct * rows)
    return None


def value_matches(value: Any, text: str) -> bool:
    """`value` (a Python value from the query) is what pg_stats prints as `text`."""
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
        freq = next((f for text, f in mcv if value_matches(v, text)), None)
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


def pattern_runs(pattern: str) -> list[str]:
    """The literal runs of a LIKE pattern, between its unescaped `%` and `_` wildcards."""
    runs: list[str] = []
    current: list[str] = []
    escaped = False
    for ch in pattern:
        if escaped:
            current.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch in "%_":
            runs.append("".join(current))
            current = []
        else:
            current.append(ch)
    runs.append("".join(current))
    return runs


def like_prefix(pattern: str) -> str:
    """The fixed start of a LIKE pattern: up to the first unescaped `%` or `_`."""
    return pattern_runs(pattern)[0]


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


# -- types and sizes -----------------------------------------------------------------------
def column_type(table: TableInfo, column: str) -> str | None:
    for c in table.columns:
        if c.name == column:
            return c.data_type
    return None


def base_type(data_type: str) -> str:
    return re.sub(r"\(.*\)", "", data_type).split(" with")[0].split(" without")[0].strip()


def type_width(data_type: str | None) -> int:
    if data_type is None:
        return 16
    return _TYPE_WIDTH.get(base_type(data_type), 16)


def column_width(table: TableInfo | None, column: str) -> int:
    """Bytes per value: pg_stats avg_width when known, else by the type."""
    stats = table.column_stats.get(column) if table else None
    if stats is not None and stats.avg_width:
        return stats.avg_width
    return type_width(column_type(table, column) if table else None)


def pattern_opclass(data_type: str | None) -> str | None:
    """The operator class that lets a B-tree serve `LIKE 'prefix%'` on this type, if any."""
    if data_type is None or data_type.endswith("]"):
        return None
    return PATTERN_OPCLASSES.get(base_type(data_type))


def orders_like_c(collation: str | None) -> bool:
    """Text under this collation sorts byte by byte (LIKE prefixes need no pattern opclass);
    False when the collation is unknown."""
    return collation in C_COLLATIONS


def btree_mb(rows: float, widths: Iterable[int]) -> float:
    """IndexTuple header + MAXALIGNed key + line pointer, leaf pages ~90 % full."""
    key = sum(widths)
    per_row = 8 + 8 * math.ceil(key / 8) + 4
    return round(rows * per_row / 0.9 / 1024 / 1024, 2)


def gin_mb(rows: float, width: int, opclass: str | None) -> float:
    """A GIN index on jsonb: compressed posting lists, about a fifth of the column's bytes."""
    per_byte = GIN_BYTES_PER_WIDTH.get(opclass, GIN_BYTES_PER_WIDTH[None])
    return round(max(0.01, rows * max(width, 8) * per_byte / 1024 / 1024), 2)


# -- values, as the query family and the `$n` filling draw them ------------------------------
def common_values(stats: ColumnStats) -> list[tuple[str, float | None]]:
    """The most common values, most frequent first, each with its share of the rows (None
    when pg_stats gives no frequency for it)."""
    freqs = stats.most_common_freqs
    pairs = [(value, freqs[i] if i < len(freqs) else None)
             for i, value in enumerate(stats.most_common_vals)]
    return sorted(pairs, key=lambda pair: -(pair[1] or 0.0))


def quantile(points: Sequence[_T], q: float) -> _T:
    """The value at quantile `q` (0 … 1) of ordered `points` (nearest rank), not empty."""
    return points[min(len(points) - 1, round(q * (len(points) - 1)))]
