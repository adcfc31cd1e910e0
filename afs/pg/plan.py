"""EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) plans, read and trimmed (pure).

    explained        the document EXPLAIN returns → (top plan node, execution ms)
    shared_buffers   shared hit + read blocks of a plan (the whole query: its top node)
    plan_nodes       the plan flattened, parents first, rows and time totalled over loops
    plan_insights    concrete observations about a plan, with its numbers
    plan_text        the plan as compact text, one line per node, within a token budget (prompts)
    plan_shape       the plan in short form (node types, join order, scans and their indexes,
                     subplans hashed or not), for comparing two plans; shape_differences

The `fmt_*` helpers write numbers in prose the same way everywhere an insight is written.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from afs.config import PLAN_TOKEN_BUDGET

CHARS_PER_TOKEN: Final = 4  # the usual estimate for English and JSON
MAX_PLAN_STRING_CHARS: Final = 300  # a plan's Filter or Index Cond, when even one node is too long


# -- numbers in prose -------------------------------------------------------------------
def fmt_count(x: float) -> str:
    return f"{round(x):,}"


def fmt_pct(fraction: float) -> str:
    p = 100.0 * fraction
    if p >= 10 or p == 0:
        return f"{p:.0f} %"
    if p >= 1:
        return f"{p:.1f} %"
    if p < 0.0001:
        return "< 0.0001 %"
    return f"{p:.2g} %"


def fmt_ms(x: float) -> str:
    return f"{x:,.1f} ms" if x >= 1 else f"{x:.3f} ms"


def shorten(text: str, limit: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- the document -------------------------------------------------------------------------
def explained(raw: Any) -> tuple[dict[str, Any], float]:
    """The top plan node and the execution time (ms) of what `EXPLAIN (ANALYZE, FORMAT JSON)`
    returned: the parsed document, or its text."""
    doc = raw if isinstance(raw, list) else json.loads(raw)
    return doc[0]["Plan"], float(doc[0]["Execution Time"])


def plan_of(raw: Any) -> dict[str, Any]:
    """The top plan node of what `EXPLAIN (FORMAT JSON)` returned (with or without ANALYZE)."""
    doc = raw if isinstance(raw, list) else json.loads(raw)
    node: dict[str, Any] = doc[0]["Plan"]
    return node


def shared_buffers(plan: Mapping[str, Any]) -> int:
    """Shared blocks hit and read by a plan node and all below it (EXPLAIN's BUFFERS)."""
    return int(plan.get("Shared Hit Blocks", 0)) + int(plan.get("Shared Read Blocks", 0))


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
    alias: str | None = None
    plan_rows: float = 0.0  # the planner's row estimate, over all loops (EXPLAIN prints it per loop)
    conditions: tuple[str, ...] = ()  # Index Cond, Recheck Cond, Filter, Hash/Merge Cond, Join Filter
    hash_batches: int = 0  # Hash: batches used (the largest of Hash Batches, Original Hash Batches)
    peak_memory_kb: float = 0.0  # Hash, HashAggregate: Peak Memory Usage
    disk_kb: float = 0.0  # HashAggregate: Disk Usage; the largest over the leader and its workers
    analyzed: bool = False  # EXPLAIN ANALYZE ran it: actual rows and times are known
    subplan: str | None = None  # the top node of a subquery: "SubPlan 1", "hashed SubPlan 1", "InitPlan 2"
    plan_width: float = 0.0  # the planner's average row width in bytes
    group_key: tuple[str, ...] = ()  # Aggregate, Group: the grouping expressions as EXPLAIN prints them

    @property
    def estimate_error(self) -> float:
        """How far the row estimate is off, as a factor ≥ 1 either way (rows per loop, at least 1);
        1 without ANALYZE."""
        if not self.analyzed:
            return 1.0
        loops = max(self.loops, 1.0)
        actual, planned = max(self.rows / loops, 1.0), max(self.plan_rows / loops, 1.0)
        return max(actual, planned) / min(actual, planned)

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


_CONDITION_KEYS: Final = ("Index Cond", "Recheck Cond", "Filter", "Hash Cond", "Merge Cond", "Join Filter")


def _num(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def _estimated_executions(node: Mapping[str, Any], child: Mapping[str, Any], executions: float,
                          scanned_per_loop: float) -> float:
    """How often the planner expects `child` of `node` to run, when the plan was not run: the
    inner side of a nested loop once per outer row, a SubPlan once per row of the node it is
    attached to (per row scanned when it sits in the node's filter), anything else as its parent."""
    relationship = child.get("Parent Relationship")
    if relationship == "SubPlan":
        name = str(child.get("Subplan Name") or "")
        if name.startswith("hashed "):
            return executions  # hashed once, probed per row
        in_filter = bool(name) and any(name in str(node.get(k) or "") for k in ("Filter", "Join Filter"))
        return executions * max(scanned_per_loop if in_filter else _num(node.get("Plan Rows")), 1.0)
    if relationship == "Inner" and node.get("Node Type") == "Nested Loop":
        outer = next((c for c in node.get("Plans") or () if isinstance(c, Mapping)
                      and c.get("Parent Relationship") == "Outer"), None)
        return executions * max(_num(outer.get("Plan Rows")) if outer else 1.0, 1.0)
    return executions


def plan_nodes(plan: Mapping[str, Any], *, reltuples: Mapping[str, float] | None = None,
               execution_ms: float = 0.0) -> tuple[PlanNode, ...]:
    """The plan's nodes, parents before children (accepts the node or its {"Plan": …} wrapper).

    Rows are multiplied by loops (EXPLAIN prints per-loop averages); under Gather the
    time of a node is divided by the number of processes sharing it.

    A plan that was not run (EXPLAIN without ANALYZE; `PlanNode.analyzed` False) gets the
    planner's own figures instead: rows = Plan Rows over the estimated executions (a nested loop's
    inner side once per outer row, a SubPlan once per row of its node), rows removed by a Seq Scan's
    filter = the relation's `reltuples` (by relation name) less the rows it returns, and times in
    proportion to the costs, the whole plan taking `execution_ms` (0: no times)."""
    root = plan.get("Plan", plan) if isinstance(plan.get("Plan"), Mapping) else plan
    if not root or "Node Type" not in root:
        return ()
    tuples = reltuples or {}
    root_cost = _num(root.get("Total Cost"))
    ms_per_cost = execution_ms / root_cost if root_cost > 0 and execution_ms > 0 else 0.0

    def visit(node: Mapping[str, Any], processes: float, depth: int, executions: float,
              started: float, ceiling: float) -> list[PlanNode]:
        children = [c for c in node.get("Plans") or () if isinstance(c, Mapping)]
        node_type = str(node.get("Node Type", "?"))
        inner = processes
        if node_type in ("Gather", "Gather Merge"):
            inner = _num(node.get("Workers Launched", node.get("Workers Planned", 0))) + 1
        run = "Actual Loops" in node
        scanned_per_loop = _num(node.get("Plan Rows"))
        if run:
            loops = _num(node.get("Actual Loops", 1)) or 1.0
            total = _num(node.get("Actual Total Time")) * loops / max(processes, 1.0)
            rows = _num(node.get("Actual Rows")) * loops
            removed = (_num(node.get("Rows Removed by Filter"))
                       + _num(node.get("Rows Removed by Index Recheck"))) * loops
        else:  # the planner's estimates: per loop, over the executions it expects
            loops = max(executions, 1.0) * max(processes, 1.0)
            # a rescan costs the planner less than a first run: never more than the node above
            total = min(ceiling, _num(node.get("Total Cost")) * max(executions, 1.0) * ms_per_cost)
            rows = _num(node.get("Plan Rows")) * loops
            relation = node.get("Relation Name")
            removed = 0.0
            if node_type == "Seq Scan" and node.get("Filter") and str(relation) in tuples:
                whole = float(tuples[str(relation)])
                removed = max(0.0, whole * max(executions, 1.0) - rows)
                scanned_per_loop = max(scanned_per_loop, whole / max(processes, 1.0))
        # a Materialize keeps its child's rows: rescanned, it reads them again without running it
        kids = [visit(c, inner, depth + 1,
                      executions if run else started if node_type == "Materialize"
                      else _estimated_executions(node, c, max(executions, 1.0), scanned_per_loop),
                      executions, total)
                for c in children]
        kids_ms = sum(k[0].total_ms for k in kids if k)
        index_name = node.get("Index Name")
        if index_name is None and node_type == "Bitmap Heap Scan":
            index_name = next((n.index_name for k in kids for n in k if n.index_name), None)
        # a parallel node's leader reports its own sort/hash; each worker its own, in "Workers"
        processes_of = [node, *(w for w in node.get("Workers") or () if isinstance(w, Mapping))]
        sort_kb = max(_num(p.get("Sort Space Used")) for p in processes_of)
        on_disk = any(p.get("Sort Space Type") == "Disk" for p in processes_of)
        sort_method = next((p.get("Sort Method") for p in processes_of
                            if p.get("Sort Space Type") == "Disk"), node.get("Sort Method"))
        me = PlanNode(
            node_type=node_type,
            relation=node.get("Relation Name"),
            index_name=str(index_name) if index_name else None,
            filter=node.get("Filter"),
            rows=rows,
            removed=removed,
            loops=loops,
            total_ms=total,
            self_ms=max(0.0, total - kids_ms),
            input_rows=kids[0][0].rows if kids and kids[0] else 0.0,
            sort_key=tuple(str(k) for k in node.get("Sort Key") or ()),
            sort_method=sort_method,
            sort_space_kb=sort_kb,
            sort_on_disk=on_disk,
            depth=depth,
            alias=node.get("Alias"),
            plan_rows=_num(node.get("Plan Rows")) * loops,
            conditions=tuple(str(node[k]) for k in _CONDITION_KEYS if node.get(k)),
            hash_batches=int(max(_num(node.get("Hash Batches")), _num(node.get("Original Hash Batches")),
                                 *(_num(p.get("HashAgg Batches")) for p in processes_of))),
            peak_memory_kb=max(_num(p.get("Peak Memory Usage")) for p in processes_of),
            disk_kb=max(_num(p.get("Disk Usage")) for p in processes_of),
            analyzed=run,
            subplan=str(node["Subplan Name"]) if node.get("Subplan Name") else None,
            plan_width=_num(node.get("Plan Width")),
            group_key=tuple(str(k) for k in node.get("Group Key") or ()),
        )
        return [me, *(n for k in kids for n in k)]

    return tuple(visit(root, 1.0, 0, 1.0, 1.0, math.inf))


def plan_insights(nodes: Sequence[PlanNode], execution_ms: float, *, large_rows: float) -> list[str]:
    """Concrete observations about a plan, with its numbers; a Seq Scan is worth a word
    when it reads `large_rows` rows or more."""
    out: list[str] = []
    scans = sorted((n for n in nodes if n.is_scan), key=lambda n: -n.scanned)
    for n in scans[:3]:
        loops = f" over {fmt_count(n.loops)} loops" if n.loops > 1 and n.node_type != "Seq Scan" else ""
        guess = "" if n.analyzed else " (estimated: the plan was not run)"
        if n.removed > 0 and n.scanned > 0:
            what = f" (Filter: {shorten(n.filter, 90)})" if n.filter else ""
            out.append(f"{n.label} removes {fmt_count(n.removed)} rows to return {fmt_count(n.rows)} "
                       f"({fmt_pct(n.rows / n.scanned)}){loops}{what}{guess}")
        elif n.node_type == "Seq Scan" and n.rows >= large_rows:
            out.append(f"Seq Scan on {n.relation} reads all {fmt_count(n.rows)} rows{guess}")
        elif n.index_name:
            out.append(f"{n.label} returns {fmt_count(n.rows)} rows{loops}{guess}")
    for n in nodes:
        if n.node_type in ("Sort", "Incremental Sort") and n.sort_key:
            where = f"on disk, {fmt_count(n.sort_space_kb)} kB" if n.sort_on_disk else "in memory"
            method = f"{n.sort_method}, " if n.sort_method else ""
            out.append(f"Sort by {', '.join(n.sort_key)} over {fmt_count(n.input_rows)} rows "
                       f"({method}{where})")
    timed = [n for n in nodes if n.self_ms > 0]
    if timed and execution_ms > 0:
        top = max(timed, key=lambda n: n.self_ms)
        share = min(1.0, top.self_ms / execution_ms)
        if top.analyzed:
            out.append(f"Most time goes to {top.label}: {fmt_ms(top.self_ms)} of {fmt_ms(execution_ms)} "
                       f"({fmt_pct(share)})")
        else:
            out.append(f"Most of the estimated cost goes to {top.label} ({fmt_pct(share)}; the plan was "
                       f"not run, {fmt_ms(execution_ms)} is a lower bound of the time)")
    elif execution_ms > 0:
        out.append(f"Execution time {fmt_ms(execution_ms)}")
    return out


# -- the plan as a tree of its raw JSON nodes ---------------------------------------------------
# EXPLAIN's own per-loop numbers, not PlanNode: the plan as text for a prompt (below) and the
# bottlenecks (afs.pg.bottleneck) read it.
@dataclass
class RawNode:
    """One node of EXPLAIN's JSON, with its parent, its children and the processes sharing its
    time (the workers a Gather above it launched, plus the leader)."""

    raw: Mapping[str, Any]
    children: list[RawNode]
    parent: RawNode | None
    processes: float = 1.0

    @property
    def type(self) -> str:
        return str(self.raw.get("Node Type", "?"))

    @property
    def loops(self) -> float:
        return _num(self.raw.get("Actual Loops", 1)) or 1.0


def raw_tree(raw: Mapping[str, Any], parent: RawNode | None = None, processes: float = 1.0) -> RawNode:
    """The tree of `raw` (a plan's JSON node) and everything below it."""
    node = RawNode(raw, [], parent, processes)
    inner = processes
    if node.type in ("Gather", "Gather Merge"):
        inner = _num(raw.get("Workers Launched", raw.get("Workers Planned", 0))) + 1
    node.children = [raw_tree(c, node, inner) for c in raw.get("Plans") or () if isinstance(c, Mapping)]
    return node


def _inclusive(raw: Mapping[str, Any]) -> float:
    """A node's time over all its loops (ms); its estimated cost when there is no ANALYZE."""
    try:
        if "Actual Total Time" in raw:
            return float(raw["Actual Total Time"]) * float(raw.get("Actual Loops") or 1)
        return float(raw.get("Total Cost") or 0.0)
    except (TypeError, ValueError):
        return 0.0


def _self_cost(node: RawNode) -> float:
    return max(0.0, _inclusive(node.raw) - sum(_inclusive(c.raw) for c in node.children))


def _raw_label(raw: Mapping[str, Any]) -> str:
    relation = raw.get("Relation Name")
    return f"{raw.get('Node Type', '?')}{f' on {relation}' if relation else ''}"


def _walk(node: RawNode) -> list[RawNode]:
    """`node` and every node below it, parents before children, in the plan's order (iterative:
    a deep plan does not recurse)."""
    out: list[RawNode] = []
    stack = [node]
    while stack:
        current = stack.pop()
        out.append(current)
        stack.extend(reversed(current.children))
    return out


def nodes_below(node: RawNode) -> list[RawNode]:
    """`node` and every node below it (the one walker over a plan's tree)."""
    return _walk(node)


def _fmt_number(value: Any) -> str:
    number = _num(value)
    return f"{number:,.0f}" if number == int(number) else f"{number:,.2f}"


_LINE_FIELDS: Final = (  # shown after the numbers, in this order, when a node has them
    "Index Cond", "Recheck Cond", "Hash Cond", "Merge Cond", "Join Filter", "Filter",
    "Rows Removed by Filter", "Rows Removed by Join Filter", "Rows Removed by Index Recheck",
    "Sort Key", "Presorted Key", "Sort Method", "Sort Space Used", "Sort Space Type", "Group Key",
    "Hash Batches", "Peak Memory Usage", "Disk Usage", "Workers Launched", "Heap Fetches",
    "Subplans Removed", "Function Name", "CTE Name",
)


def plan_line(raw: Mapping[str, Any], max_chars: int | None = None) -> str:
    """One plan node as one line: what it is, estimated vs actual rows, loops, time, buffers,
    then its conditions and sort/hash facts (as EXPLAIN's text format names them)."""
    label = ("Parallel " if raw.get("Parallel Aware") else "") + str(raw.get("Node Type", "?"))
    if raw.get("Strategy") and raw.get("Node Type") == "Aggregate":
        label = f"{raw['Strategy']} {label}"
    if raw.get("Join Type") and raw.get("Join Type") != "Inner":
        label += f" ({raw['Join Type']})"
    if raw.get("Index Name"):
        label += f" using {raw['Index Name']}"
    if raw.get("Relation Name"):
        relation, alias = raw["Relation Name"], raw.get("Alias")
        label += f" on {relation}" + (f" {alias}" if alias and alias != relation else "")
    numbers = [f"est rows={_fmt_number(raw.get('Plan Rows'))}"]
    if "Actual Rows" in raw:
        if _num(raw.get("Actual Loops")) == 0:
            numbers.append("never executed")
        else:
            numbers.append(f"actual rows={_fmt_number(raw.get('Actual Rows'))} "
                           f"loops={_fmt_number(raw.get('Actual Loops'))} "
                           f"time={_num(raw.get('Actual Total Time')):.3f} ms")
    else:
        numbers.append(f"cost={_num(raw.get('Total Cost')):.2f}")
    hit, read = int(_num(raw.get("Shared Hit Blocks"))), int(_num(raw.get("Shared Read Blocks")))
    if hit or read:
        numbers.append(f"buffers hit={hit:,} read={read:,}")
    temp = int(_num(raw.get("Temp Read Blocks"))) + int(_num(raw.get("Temp Written Blocks")))
    if temp:
        numbers.append(f"temp blocks={temp:,}")
    facts = []
    for key in _LINE_FIELDS:
        value = raw.get(key)
        if value is None or value == "" or value == []:
            continue
        text = ", ".join(map(str, value)) if isinstance(value, list) else str(value)
        if max_chars is not None and len(text) > max_chars:
            text = text[:max_chars] + "…"
        facts.append(f"{key}: {text}")
    return f"{label} ({', '.join(numbers)})" + ("; " + "; ".join(facts) if facts else "")


def _lines(node: RawNode, kept: set[int], max_chars: int | None, depth: int = 0) -> list[str]:
    out = [("  " * depth) + ("-> " if depth else "") + plan_line(node.raw, max_chars)]
    for child in node.children:
        if id(child) in kept:
            out.extend(_lines(child, kept, max_chars, depth + 1))
    dropped = [c for c in node.children if id(c) not in kept]
    if dropped:
        names = ", ".join(_raw_label(c.raw) for c in dropped[:5]) + (", …" if len(dropped) > 5 else "")
        hidden = sum(1 for c in dropped for _ in _walk(c))
        out.append("  " * (depth + 1) + f"-> ({hidden} cheaper node{'s' if hidden != 1 else ''} omitted: "
                   f"{names})")
    return out


def plan_text(plan: Mapping[str, Any], budget_tokens: int = PLAN_TOKEN_BUDGET) -> tuple[list[str], str]:
    """The plan as compact text, one line per node (children indented under their parent), within
    `budget_tokens`, and a note on what was left out.

    Over budget, only the nodes with the most time of their own (their ancestors kept for the
    shape) stay, as many as fit; cheaper subtrees become one "omitted" line each. A last resort
    shortens long conditions, then keeps the top node alone, cut.
    """
    budget = budget_tokens * CHARS_PER_TOKEN
    root = raw_tree(plan)
    nodes = _walk(root)

    def size(lines: list[str]) -> int:
        return sum(len(line) + 1 for line in lines)

    every = _lines(root, {id(n) for n in nodes}, None)
    if size(every) <= budget:
        return every, f"complete, {len(nodes)} node{'s' if len(nodes) != 1 else ''}"
    ranked = sorted(nodes, key=_self_cost, reverse=True)  # stable: ties keep the plan's order

    def keeping(count: int, max_chars: int | None) -> list[str]:
        kept: set[int] = set()
        for node in ranked[:count]:
            walker: RawNode | None = node
            while walker is not None and id(walker) not in kept:
                kept.add(id(walker))
                walker = walker.parent
        return _lines(root, kept, max_chars)

    for max_chars in (None, MAX_PLAN_STRING_CHARS):
        low, high = 0, len(ranked)  # the largest count that fits, by bisection
        while low < high:
            middle = (low + high + 1) // 2
            if size(keeping(middle, max_chars)) <= budget:
                low = middle
            else:
                high = middle - 1
        if low:
            return keeping(low, max_chars), (f"trimmed to the {low} most expensive of {len(nodes)}"
                                             " nodes and their parents")
    top = plan_line(root.raw, MAX_PLAN_STRING_CHARS)
    return [top[:budget - 1] + "…"], f"cut to {budget_tokens} tokens: only the top node, truncated"


# -- plan shapes: is it the same plan? ------------------------------------------------------------
# Works on the raw JSON of EXPLAIN with or without ANALYZE: costs, rows and times are left out.
def _shape_label(raw: Mapping[str, Any], hashed: set[str]) -> str:
    label = ("Parallel " if raw.get("Parallel Aware") else "") + str(raw.get("Node Type", "?"))
    if raw.get("Strategy") and raw.get("Node Type") in ("Aggregate", "SetOp"):
        label = f"{raw['Strategy']} {label}"
    if raw.get("Partial Mode") and raw.get("Partial Mode") != "Simple":
        label = f"{raw['Partial Mode']} {label}"
    if raw.get("Join Type") and raw.get("Join Type") != "Inner":
        label += f" ({raw['Join Type']})"
    if raw.get("Index Name"):
        label += f" using {raw['Index Name']}"
    if raw.get("Relation Name"):
        label += f" on {raw['Relation Name']}"
    name = raw.get("Subplan Name")
    if name:
        name = str(name)
        # PostgreSQL 18 names the node "SubPlan 1" and its use "(hashed SubPlan 1)"; older
        # servers name the node "hashed SubPlan 1"
        kind = "hashed " if name.startswith("hashed ") or name in hashed else ""
        label = f"[{kind}{name.removeprefix('hashed ')}] {label}"
    return label


def plan_shape(plan: Mapping[str, Any]) -> tuple[str, ...]:
    """The plan in short form, one line per node, indented under its parent: node types (with
    parallelism, aggregate strategy, join type), the scans with their relations and indexes,
    subplans and whether they are hashed. Two plans with the same shape chose the same way,
    whatever their costs (accepts the node or its {"Plan": …} wrapper)."""
    root = plan.get("Plan", plan) if isinstance(plan.get("Plan"), Mapping) else plan
    if not root or "Node Type" not in root:
        return ()
    text = json.dumps(root)
    hashed = {f"SubPlan {n}" for n in _HASHED_USE.findall(text)}
    lines: list[str] = []

    def visit(node: Mapping[str, Any], depth: int) -> None:
        lines.append("  " * depth + _shape_label(node, hashed))
        for child in node.get("Plans") or ():
            if isinstance(child, Mapping):
                visit(child, depth + 1)

    visit(root, 0)
    return tuple(lines)


_HASHED_USE: Final = re.compile(r"hashed SubPlan (\d+)\b")


def shape_differences(source: Sequence[str], fork: Sequence[str]) -> tuple[str, ...]:
    """Where two plan shapes differ, line by line: "source: …" for a node only the source's plan
    has (or has otherwise), "fork: …" for one only the fork's has. Empty when they are the same."""
    out: list[str] = []
    matcher = difflib.SequenceMatcher(a=list(source), b=list(fork), autojunk=False)
    for tag, a0, a1, b0, b1 in matcher.get_opcodes():
        if tag == "equal":
            continue
        out.extend(f"source: {line.strip()}" for line in source[a0:a1])
        out.extend(f"fork: {line.strip()}" for line in fork[b0:b1])
    return tuple(out)
