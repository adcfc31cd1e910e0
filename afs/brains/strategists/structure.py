"""gemini-2.5-flash: structure for large tables (pure).

For a large table filtered by a time range: monthly (quarterly, yearly) range
partitioning with its migration, done in the fork, when pruning skips most of the
table; BRIN when the column follows the physical row order (and instead of
partitioning when foreign keys reference the table); otherwise, or when nothing is
filtered by time, one low-risk index (`index_design.fallback_index`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Final, Literal

from afs.brains.strategists.evidence import (
    Decision,
    Evidence,
    covering_index,
    index_keys,
    index_method,
    insights_of,
    norm_column,
    nothing,
    range_estimate,
    range_text,
    write_risk,
)
from afs.brains.strategists.index_design import drop_index, fallback_index
from afs.models import AgentKey, AnalysisContext, ColumnUse, EstimatedImpact, IndexInfo, OptimizationProposal
from afs.pg.names import ident, index_name, object_name, qualified, relation_name, schema_and_relation
from afs.pg.plan import fmt_count, fmt_pct
from afs.pg.stats import btree_mb, column_type, column_width, parse_timestamp

BRIN_MIN_ROWS: Final = 100_000
BRIN_MIN_CORRELATION: Final = 0.9
BRIN_MAX_FRACTION: Final = 0.8  # a range keeping more leaves BRIN too little to skip
PARTITION_MIN_ROWS: Final = 1_000_000
PARTITION_MAX_FRACTION: Final = 0.25  # pruning must skip most of the table; else BRIN
MAX_PARTITIONS: Final = 36
TIME_TYPES: Final = ("timestamp", "date")


def _time_columns(ev: Evidence, table: str) -> list[tuple[str, str, list[ColumnUse]]]:
    info = ev.table(table)
    if info is None:
        return []
    out: list[tuple[str, str, list[ColumnUse]]] = []
    for column, uses in ev.ranges(table).items():
        data_type = column_type(info, column) or ""
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
    if unique and partition_column not in [norm_column(c) for c in index.columns]:
        keys.append(ident(partition_column))  # unique keys of a partitioned table include its key
    name = object_name("afs", relation_name(old_table), "p", *index.columns,
                       suffix="key" if unique else "idx", taken=taken)
    taken.add(name)
    return (f"CREATE {'UNIQUE ' if unique else ''}INDEX {ident(name)} ON {new_table} "
            f"USING {index_method(index)} ({', '.join(keys)}){tail}")


def _migration_name(table: str, role: Literal["part", "old"]) -> str:
    """`<table>_afs_part`, the partitioned copy, or `<table>_afs_old`, the table kept for
    rollback: distinct even when a long table name must be cut to 63 bytes."""
    return object_name(relation_name(table), "afs", suffix=role)


def _partitioning(ev: Evidence, table: str, column: str, data_type: str,
                  low: datetime, high: datetime) -> tuple[list[str], list[str], int, str]:
    """The migration recipe: commands, rollback, number of partitions, period."""
    info = ev.table(table)
    assert info is not None
    schema, rel = schema_and_relation(table)
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


def decide_structure(ctx: AnalysisContext, agent: AgentKey = "gemini25flash") -> Decision:
    """gemini-2.5-flash: BRIN or range partitioning for a large table filtered by time."""
    ev = Evidence(ctx)
    insights = insights_of(ev)
    candidates: list[tuple[float, str, str, str, list[ColumnUse]]] = []
    for table in ev.query_tables():
        info = ev.table(table)
        if info is None:
            continue
        for column, data_type, uses in _time_columns(ev, table):
            candidates.append((-max(info.rows, ev.scanned_rows(table)), table, column, data_type, uses))
    if not candidates:
        return fallback_index(agent, ev, insights, "no range filter on a timestamp column: "
                               "structure changes (BRIN, partitioning) aren't warranted")
    _, table, column, data_type, uses = min(candidates, key=lambda c: c[0])
    info = ev.table(table)
    assert info is not None
    rows = float(info.rows)
    stats = ev.stats(table, column)
    only_filter = len({u.column for u in ev.uses(table, "equality", "range")}) == 1
    fraction, source = range_estimate(ev, table, column, uses, only_filter)
    corr = stats.correlation if stats and stats.correlation is not None else None
    span = range_text(uses)
    insights.append(f"{table} has {fmt_count(rows)} rows ({info.size_mb:,.0f} MB); {column} {span} "
                    f"keeps ~{fmt_pct(fraction)} of them ({source})")
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
                        f"~{fmt_pct(fraction)} of {table}")
        rationale = (f"{table} holds {fmt_count(rows)} rows and the query reads a time range of {column} "
                     f"that keeps ~{fmt_pct(fraction)} of them; the plan scans "
                     f"{fmt_count(max(ev.scanned_rows(table), rows))} rows. Partitioning {table} by {period} "
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
            validation_steps=(f"EXPLAIN shows only the partitions of {relation_name(table)} that overlap "
                              "the range",
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
            return nothing(insights, f"{existing.name} is already a BRIN index on {column}", 0.8, table)
        if fraction > BRIN_MAX_FRACTION:
            return fallback_index(agent, ev, insights, f"the range keeps {fmt_pct(fraction)} of rows: a BRIN "
                                   "index would skip too little")
        name = index_name(table, [column], suffix="brin", taken=[ix.name for ix in info.indexes])
        ranges = max(1.0, info.size_mb * 1024 / 8 / 128)  # 8 kB pages, 128 per range
        storage = round(max(0.02, ranges * 32 / 1024 / 1024), 2)
        improvement = round(max(5.0, min(85.0, 85.0 * (1.0 - fraction))), 1)
        risk, warnings = write_risk(ev, table)
        rationale = (f"{table} has {fmt_count(rows)} rows and {column} follows the physical row order "
                     f"(correlation {corr:.2f}), so a BRIN index of ~{fmt_count(ranges)} block ranges "
                     f"(~{storage} MB, against ~{btree_mb(rows, [column_width(info, column)]):.0f} MB for "
                     f"a B-tree) lets a Bitmap Heap Scan skip the ~{fmt_pct(1 - fraction)} of the table "
                     f"outside {column} {span}. "
                     + (f"Unlike partitioning, it leaves the foreign keys of {_names(referenced)} intact. "
                        if referenced else "")
                     + " ".join(warnings))
        proposal = OptimizationProposal(
            agent=agent, proposal_type="index",
            sql_commands=(f"CREATE INDEX {ident(name)} ON {qualified(table)} USING brin ({ident(column)})",),
            rollback_commands=(drop_index(table, name),),
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
        why = f"{table} has {fmt_count(rows)} rows: structure changes (BRIN, partitioning) aren't warranted"
    else:
        why = f"no statistics for {column}: cannot tell whether BRIN or partitioning would prune"
    return fallback_index(agent, ev, insights, why)


