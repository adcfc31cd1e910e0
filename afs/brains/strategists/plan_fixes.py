"""Plan fixes: candidates for a wrong plan rather than a missing structure (pure).

Every strategist agent measures these after its own specialisation's candidates
(`afs.brains.strategists.CANDIDATE_SOURCES`). Each rule is a small function over the
Evidence (the EXPLAIN (ANALYZE, BUFFERS) plan, the statistics and the query) that yields
proposals; `RULES` is their tuple, as in sqlglot's optimizer:

    extended_statistics   a node whose row estimate is off by ≥ 10× (either way) and that
                          filters on ≥ 2 columns of one table compared with constants →
                          CREATE STATISTICS (dependencies, mcv) on them; or an aggregate
                          that groups by ≥ 2 columns of one table, its input estimated
                          well → CREATE STATISTICS (ndistinct); then ANALYZE of those
                          columns (which builds the statistics)
    work_mem              a Sort that spilled to disk (external merge), a Hash with more
                          than one batch, a HashAggregate that wrote to disk → work_mem for
                          this query: the next power of two above ~2.5× what spilled
                          (at least MIN_WORK_MEM_MB, at most MAX_WORK_MEM_MB), proposal type
                          "settings", measured with SET LOCAL; likewise a subquery of
                          IN / NOT IN rescanned per outer row because it was too big to hash

Neither changes what the query returns; whether the plan it leads to is faster is for the
measurement to say, which is why they are candidates and not conclusions.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final

from afs.brains.strategists.evidence import SMALL_TABLE_ROWS, Evidence
from afs.models import AgentKey, AnalysisContext, EstimatedImpact, OptimizationProposal
from afs.pg.names import ident, object_name, qualified, relation_name, schema_and_relation
from afs.pg.plan import PlanNode, fmt_count, fmt_ms, fmt_pct

__all__ = ["RULES", "extended_statistics", "misestimates", "plan_fix_proposals", "work_mem", "work_mem_mb"]

MISESTIMATE_FACTOR: Final = 10.0  # rows estimated vs actual, either way
MAX_STATISTICS: Final = 2  # CREATE STATISTICS candidates per query
STATISTICS_KINDS: Final = ("dependencies", "ndistinct", "mcv")
FILTER_KINDS: Final = ("dependencies", "mcv")  # selectivity of clauses over correlated columns
GROUP_KINDS: Final = ("ndistinct",)  # the number of groups of correlated GROUP BY columns
CONSTANT_ROLES: Final = ("equality", "range")  # column uses compared with a constant
# A sort in memory takes more room than its run files on disk: 2.0–2.2× on PostgreSQL 18
# (140,000 narrow rows: 6.2 MB on disk, 12.6–13.8 MB in memory); 2.5 leaves a margin.
WORK_MEM_FACTOR: Final = 2.5
MIN_WORK_MEM_MB: Final = 8  # above PostgreSQL's default of 4MB, which just spilled
MAX_WORK_MEM_MB: Final = 2048  # afs.safety.check_settings refuses more
LARGE_WORK_MEM_MB: Final = 256  # from here on, concurrent queries may exhaust memory: medium risk
HASH_MEM_MULTIPLIER: Final = 2.0  # PostgreSQL's default: hash tables get work_mem × this
TUPLE_HEADER_BYTES: Final = 24  # MAXALIGN(SizeofHeapTupleHeader): what a hashed subquery row adds

Rule = Callable[[Evidence, AgentKey], Iterator[OptimizationProposal]]


# -- extended statistics ----------------------------------------------------------------------
_IDENT = r'(?:"(?:[^"]|"")+"|[A-Za-z_][A-Za-z0-9_$]*)'
_NAME = re.compile(rf"(?<![\w$\"])(?:({_IDENT})\.)?({_IDENT})(?![\w$\"])")
_STRING = re.compile(r"'(?:[^']|'')*'")


def _unquote(name: str) -> str:
    return name[1:-1].replace('""', '"') if name.startswith('"') else name.lower()


def _condition_columns(ev: Evidence, node: PlanNode) -> dict[str, list[str]]:
    """table → the columns of it that `node`'s conditions compare with constants in the query.

    Column names are read from the condition text as EXPLAIN prints it (string literals and
    type names after `::` ignored, function names skipped); an unqualified name belongs to the
    scanned relation. Only columns the query compares with a constant count (features'
    equality and range uses): extended statistics estimate `col = const` and `col < const`
    clauses, not join clauses."""
    own = ev.resolver.table_key(node.relation) if node.relation else None
    found: dict[str, list[str]] = {}
    for condition in node.conditions:
        text = _STRING.sub("''", condition)
        for match in _NAME.finditer(text):
            before, after = text[:match.start()].rstrip(), text[match.end():].lstrip()
            if before.endswith("::") or after.startswith("("):
                continue  # a type name or a function name
            qualifier, name = match.group(1), _unquote(match.group(2))
            table = ev.resolver.table_key(_unquote(qualifier)) if qualifier else own
            if table is None or not ev.resolver.has_column(table, name):
                continue
            constant = {u.column for u in ev.uses(table, *CONSTANT_ROLES)}
            if name in constant and name not in found.get(table, []):
                found.setdefault(table, []).append(name)
    return found


def _group_columns(ev: Evidence, node: PlanNode) -> dict[str, list[str]]:
    """table → the plain columns of it among `node`'s Group Key (an Aggregate or Group node).

    A key is a column as EXPLAIN prints it (`city`, `a.city`); an expression key is skipped
    (statistics on expressions exist, but the rule stays with what it can name safely). Only
    columns the query groups by count (features' group role): the planner may add a key of
    its own (a primary key that makes the others functionally dependent)."""
    found: dict[str, list[str]] = {}
    for key in node.group_key:
        match = _NAME.fullmatch(key.strip())
        if match is None:
            continue
        qualifier, name = match.group(1), _unquote(match.group(2))
        table = ev.resolver.table_of(_unquote(qualifier) if qualifier else None, name)
        if table is None or not ev.resolver.has_column(table, name):
            continue
        grouped = {u.column for u in ev.uses(table, "group")}
        if name in grouped and name not in found.get(table, []):
            found.setdefault(table, []).append(name)
    return found


def _input_estimate_error(ev: Evidence, node: PlanNode) -> float:
    """The estimate error of the node's first child (1 for a leaf): an aggregate's error that its
    input already had started lower in the plan, where statistics on the group keys cannot help."""
    index = ev.nodes.index(node)
    child = ev.nodes[index + 1] if index + 1 < len(ev.nodes) else None
    return child.estimate_error if child is not None and child.depth == node.depth + 1 else 1.0


@dataclass
class Misestimate:
    node: PlanNode
    table: str
    columns: list[str]
    kinds: list[str]  # in STATISTICS_KINDS order
    error: float
    grouped: bool  # the misestimate is a group count (else a filter's selectivity)


def misestimates(ev: Evidence) -> list[Misestimate]:
    """The plan's row estimates off by ≥ MISESTIMATE_FACTOR that extended statistics address, by
    (table, columns), at most MAX_STATISTICS: a scan or join filtering on ≥ 2 columns of one table
    compared with constants (the planner multiplies their selectivities: dependencies, mcv), and an
    aggregate grouping by ≥ 2 columns of one table whose input was estimated well (the planner
    multiplies their distinct counts: ndistinct)."""
    found: dict[tuple[str, tuple[str, ...]], Misestimate] = {}
    for node in ev.nodes:
        error = node.estimate_error
        if error < MISESTIMATE_FACTOR:
            continue
        by_table: list[tuple[dict[str, list[str]], tuple[str, ...], bool]] = []
        if node.conditions:
            by_table.append((_condition_columns(ev, node), FILTER_KINDS, False))
        if node.group_key and _input_estimate_error(ev, node) < MISESTIMATE_FACTOR:
            by_table.append((_group_columns(ev, node), GROUP_KINDS, True))
        for columns_of, kinds, grouped in by_table:
            for table, columns in columns_of.items():
                info = ev.table(table)
                if len(columns) < 2 or info is None or info.rows < SMALL_TABLE_ROWS:
                    continue
                key = (table, tuple(sorted(columns)))
                if key in found:
                    known = found[key]
                    known.kinds = [k for k in STATISTICS_KINDS if k in known.kinds or k in kinds]
                    continue
                if len(found) >= MAX_STATISTICS:
                    return list(found.values())
                found[key] = Misestimate(node, table, columns, list(kinds), error, grouped)
    return list(found.values())


def extended_statistics(ev: Evidence, agent: AgentKey) -> Iterator[OptimizationProposal]:
    """CREATE STATISTICS for correlated columns behind a row estimate off by ≥ 10×."""
    for found in misestimates(ev):
        yield _statistics_proposal(ev, agent, found)


def _statistics_proposal(ev: Evidence, agent: AgentKey, found: Misestimate) -> OptimizationProposal:
    node, table, columns, error = found.node, found.table, found.columns, found.error
    schema, _ = schema_and_relation(table)
    name = object_name("afs", relation_name(table), *columns, suffix="stats")
    full_name = f"{ident(schema)}.{ident(name)}" if schema else ident(name)
    column_list = ", ".join(ident(c) for c in columns)
    way = "under" if node.rows > node.plan_rows else "over"
    share = min(1.0, node.total_ms / ev.ctx.execution_ms) if ev.ctx.execution_ms > 0 else 0.0
    names = ", ".join(columns[:-1]) + " and " + columns[-1]
    kinds = ", ".join(found.kinds)
    if found.grouped:
        why = (f"It groups {table} by {names}, whose distinct combinations the planner takes for the "
               "product of their distinct counts, as if the columns were independent. Extended "
               f"statistics ({kinds}) on ({column_list}) count the combinations that occur")
        after = "the aggregate's strategy (hash or sort, parallel or not), its memory and the plan above it"
    else:
        why = (f"It filters {table} on {names}, which the planner takes for independent columns and "
               f"multiplies their selectivities. Extended statistics ({kinds}) on ({column_list}) let it "
               "estimate them together")
        after = "the join order, the join method or the scan"
    rationale = (
        f"{node.label} was estimated at {fmt_count(node.plan_rows)} rows and returned "
        f"{fmt_count(node.rows)}: {way}estimated {error:,.0f}×. {why}; ANALYZE of those columns builds "
        f"them. The node and what is below it take {fmt_pct(share)} of {fmt_ms(ev.ctx.execution_ms)}: a "
        f"corrected estimate may change {after}, and whether the new plan is faster is measured. The "
        "statistics are a few kB and cost a little more ANALYZE time; nothing changes on writes.")
    return OptimizationProposal(
        agent=agent, proposal_type="statistics",
        sql_commands=(f"CREATE STATISTICS {full_name} ({kinds}) "
                      f"ON {column_list} FROM {qualified(table)}",
                      f"ANALYZE {qualified(table)} ({column_list})"),
        rollback_commands=(f"DROP STATISTICS IF EXISTS {full_name}",),
        rationale=rationale,
        estimated_impact=EstimatedImpact(query_time_improvement=round(max(5.0, 40.0 * share), 1),
                                         storage_overhead_mb=0.01, complexity="low", risk="low"),
        validation_steps=(f"EXPLAIN ANALYZE: the estimate of {node.label} is within "
                          f"{MISESTIMATE_FACTOR:g}× of its actual rows",
                          "the query returns the same rows as before (count and checksum)"))


# -- work_mem ---------------------------------------------------------------------------------
def _spilled_kb(node: PlanNode) -> float | None:
    """The work_mem (kB) the node would have needed to stay in memory, roughly; None when it
    did not spill. A Hash or HashAggregate gets work_mem × hash_mem_multiplier."""
    if node.sort_on_disk or (node.sort_method or "").startswith("external"):
        return node.sort_space_kb
    if node.node_type == "Hash" and node.hash_batches > 1:
        return node.peak_memory_kb * node.hash_batches / HASH_MEM_MULTIPLIER
    if node.disk_kb > 0 or (node.node_type in ("Aggregate", "HashAggregate") and node.hash_batches > 1):
        return (node.peak_memory_kb + node.disk_kb) / HASH_MEM_MULTIPLIER
    return None


ESTIMATED_NOTE: Final = " (estimated from the costs: the plan was not run, the time is a lower bound)"


def _unhashed_subplan_kb(node: PlanNode) -> float | None:
    """The work_mem (kB) a subquery of `x IN (SELECT …)` / `NOT IN` needs to be hashed; None
    unless the plan rescans it per outer row because it was too big to hash.

    PostgreSQL hashes such a subquery only when rows × (width + tuple header) fits in work_mem ×
    hash_mem_multiplier (subselect.c, subplan_is_hashable); otherwise every outer row scans the
    materialized result again, and the query is quadratic."""
    if node.subplan is None or not node.subplan.startswith("SubPlan") or node.loops < 2:
        return None  # (loops: the planner's expected executions where the plan was not run)
    per_loop = node.plan_rows / max(node.loops, 1.0)
    if per_loop < SMALL_TABLE_ROWS:
        return None
    needed = per_loop * (8 * math.ceil(max(node.plan_width, 1.0) / 8) + TUPLE_HEADER_BYTES)
    return needed / 1024 / HASH_MEM_MULTIPLIER


def work_mem_mb(spilled_kb: float) -> int:
    """The next power of two (MB) above WORK_MEM_FACTOR × what spilled, within the bounds."""
    wanted = WORK_MEM_FACTOR * max(spilled_kb, 1.0) / 1024
    power = 2 ** (math.floor(math.log2(wanted)) + 1) if wanted >= 1 else 1
    return int(min(MAX_WORK_MEM_MB, max(MIN_WORK_MEM_MB, power)))


def work_mem(ev: Evidence, agent: AgentKey) -> Iterator[OptimizationProposal]:
    """work_mem for this query when a sort or a hash spilled to disk."""
    spills = [(n, kb) for n in ev.nodes if (kb := _spilled_kb(n)) is not None]
    rescans = [(n, kb) for n in ev.nodes if (kb := _unhashed_subplan_kb(n)) is not None]
    if rescans and not spills:
        yield _subplan_work_mem(ev, agent, rescans)
        return
    if not spills:
        return
    spilled = max(kb for _, kb in spills)
    mb = work_mem_mb(spilled)
    total = ev.ctx.execution_ms
    spill_ms = sum(n.self_ms for n, _ in spills)
    share = min(1.0, spill_ms / total) if total > 0 else 0.5
    what = "; ".join(_spill_text(n) for n, _ in spills[:3])
    capped = (f" That is the {MAX_WORK_MEM_MB}MB cap: it may still spill, less." if mb == MAX_WORK_MEM_MB
              else "")
    rationale = (
        f"{what}. Spilling writes and re-reads temporary files; the nodes that spilled take "
        f"{fmt_ms(spill_ms)} of {fmt_ms(total)} ({fmt_pct(share)}). With work_mem = {mb}MB (about "
        f"{WORK_MEM_FACTOR:g}× the {fmt_count(spilled)} kB that spilled, up to the next power of two) "
        f"they fit in memory.{capped} Recommended per role (ALTER ROLE <role> SET work_mem = '{mb}MB') "
        f"or per query (SET LOCAL work_mem = '{mb}MB' in its transaction), never globally: every sort "
        "and hash of every connection may take that much. Measured here with SET LOCAL; the database "
        "itself does not change.")
    yield OptimizationProposal(
        agent=agent, proposal_type="settings", sql_commands=(), rollback_commands=(),
        rationale=rationale, settings=(("work_mem", f"{mb}MB"),),
        estimated_impact=EstimatedImpact(query_time_improvement=round(max(5.0, 60.0 * share), 1),
                                         storage_overhead_mb=0.0, complexity="low",
                                         risk="medium" if mb >= LARGE_WORK_MEM_MB else "low"),
        validation_steps=(f"EXPLAIN ANALYZE with SET LOCAL work_mem = '{mb}MB': no Sort Method external "
                          "merge, Hash Batches 1, no Disk Usage",
                          "the query returns the same rows as before (count and checksum)"))


def _subplan_work_mem(ev: Evidence, agent: AgentKey,
                      rescans: list[tuple[PlanNode, float]]) -> OptimizationProposal:
    node, needed_kb = max(rescans, key=lambda r: r[1])
    mb = work_mem_mb(needed_kb)
    total = ev.ctx.execution_ms
    share = min(1.0, node.total_ms / total) if total > 0 else 0.5
    per_loop = node.plan_rows / max(node.loops, 1.0)
    rationale = (
        f"{node.subplan} (a subquery of IN / NOT IN) returns ~{fmt_count(per_loop)} rows and is not "
        f"hashed: PostgreSQL hashes it only when it fits in work_mem × hash_mem_multiplier, so each of "
        f"{fmt_count(node.loops)} outer rows scans its materialized result again; that takes "
        f"{fmt_ms(node.total_ms)} of {fmt_ms(total)} ({fmt_pct(share)})"
        f"{'' if node.analyzed else ESTIMATED_NOTE}"
        f". With work_mem = {mb}MB (about "
        f"{WORK_MEM_FACTOR:g}× the ~{fmt_count(needed_kb)} kB the planner reckons it needs, up to the "
        "next power of two) the planner can hash it once (a hashed SubPlan) and probe it per row. "
        f"Recommended per role (ALTER ROLE <role> SET work_mem = '{mb}MB') or per query (SET LOCAL "
        f"work_mem = '{mb}MB' in its transaction), never globally. Measured here with SET LOCAL; the "
        "database itself does not change.")
    return OptimizationProposal(
        agent=agent, proposal_type="settings", sql_commands=(), rollback_commands=(),
        rationale=rationale, settings=(("work_mem", f"{mb}MB"),),
        estimated_impact=EstimatedImpact(query_time_improvement=round(max(5.0, 80.0 * share), 1),
                                         storage_overhead_mb=0.0, complexity="low",
                                         risk="medium" if mb >= LARGE_WORK_MEM_MB else "low"),
        validation_steps=(f"EXPLAIN ANALYZE with SET LOCAL work_mem = '{mb}MB': hashed {node.subplan}",
                          "the query returns the same rows as before (count and checksum)"))


def _spill_text(node: PlanNode) -> str:
    if node.sort_on_disk or (node.sort_method or "").startswith("external"):
        return (f"{node.label} spilled: {node.sort_method or 'external'}, "
                f"{fmt_count(node.sort_space_kb)} kB on disk")
    if node.node_type == "Hash":
        return (f"{node.label} split into {node.hash_batches} batches "
                f"({fmt_count(node.peak_memory_kb)} kB in memory each)")
    return f"{node.label} wrote {fmt_count(node.disk_kb)} kB to disk ({node.hash_batches} batches)"


# -- the rules --------------------------------------------------------------------------------
RULES: Final[tuple[Rule, ...]] = (extended_statistics, work_mem)


def plan_fix_proposals(ctx: AnalysisContext, agent: AgentKey) -> tuple[OptimizationProposal, ...]:
    """Every plan fix the plan calls for, in RULES order; () when the plan shows none."""
    ev = Evidence(ctx)
    return tuple(p for rule in RULES for p in rule(ev, agent))
