"""Where a plan's time goes, as something a design can remove (pure).

    Bottleneck    one node of a plan that costs: its kind, the table and the columns it
                  filters, joins, sorts or correlates on (in plan order), its share of the
                  time (of the cost where the plan was not run), a line a human reads
    bottlenecks   every bottleneck of an EXPLAIN (FORMAT JSON) plan, with or without
                  ANALYZE, the most costly first

The kinds:
    scan_filter      a scan that reads rows to throw most of them away (a Filter, an index
                     recheck): an index on the filtered columns would read only the rest
    join_inner       the inner side of a nested loop scanned again per outer row without a
                     usable index, or a table scanned whole to be joined: its join key
    subplan_per_row  a SubPlan (a correlated subquery) executed once per outer row: its
                     correlation columns
    spill            a sort, hash or hash aggregate that went to disk (work_mem)
    heap_fetch       an index scan that visits the table for every row it returns, where an
                     index-only scan would not: the index columns it uses
    sort             a sort in memory that costs (its sort key)
    rows_returned    a scan whose rows go out to the client: the time is the result itself

Columns are read from the node's Index Cond, Recheck Cond, Filter, Join Filter, Hash Cond,
Merge Cond and Sort Key as EXPLAIN prints them, and only those of the node's own relation (its
alias or its name, or unqualified); string literals, casts and function names are left out.
Which table a name means in the query is for the query's resolver (afs.query) to say.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from afs.pg.names import RESERVED
from afs.pg.plan import RawNode as _Node
from afs.pg.plan import fmt_count, fmt_pct, nodes_below, raw_tree, shorten

__all__ = ["Bottleneck", "BottleneckKind", "bottlenecks", "condition_names"]

BottleneckKind = Literal["scan_filter", "join_inner", "subplan_per_row", "spill", "heap_fetch",
                         "sort", "rows_returned"]

_SCANS: Final = frozenset({"Seq Scan", "Index Scan", "Index Only Scan", "Bitmap Heap Scan"})
_JOINS: Final = frozenset({"Nested Loop", "Hash Join", "Merge Join"})
_CONDITIONS: Final = ("Index Cond", "Recheck Cond", "Filter", "Join Filter", "Hash Cond", "Merge Cond")
MIN_SHARE: Final = 0.02  # a node with less of the time is no bottleneck
RETURNED_SHARE: Final = 0.5  # a scan whose rows reach the result at least this much returns them


@dataclass(frozen=True)
class Bottleneck:
    """One costly node of a plan, as something a design can remove (module docstring)."""

    kind: BottleneckKind
    table: str | None  # schema-qualified when the plan says the schema (VERBOSE)
    columns: tuple[str, ...]  # filter / join key / sort key / correlation columns, in plan order
    node: str  # the node type, e.g. "Seq Scan"
    share: float  # 0..1 of the time, or of the cost where the plan was not run
    detail: str  # one line a human reads
    loops: int = 1


# -- names in a condition ---------------------------------------------------------------------
_IDENT = r'(?:"(?:[^"]|"")+"|[A-Za-z_][A-Za-z0-9_$]*)'
_NAME = re.compile(rf"(?<![\w$\".])(?:({_IDENT})\.)?({_IDENT})(?![\w$\"])")
_STRING = re.compile(r"'(?:[^']|'')*'")
_CAST = re.compile(r"::(?:\"(?:[^\"]|\"\")+\"|[A-Za-z_][\w.]*)"
                   r"(?:\s+(?:varying|precision|with(?:out)?\s+time\s+zone))?(?:\(\d+(?:,\s*\d+)?\))?(?:\[\])*")
_NOT_NAMES: Final = frozenset({"subplan", "initplan", "hashed", "any", "all", "some", "true", "false",
                               "null", "and", "or", "not", "is", "in", "like", "ilike", "similar",
                               "between", "distinct", "array", "row", "collate", "case", "when",
                               "then", "else", "end", "cte", "returns"})


def _unquote(name: str) -> str:
    return name[1:-1].replace('""', '"') if name.startswith('"') else name.lower()


def condition_names(condition: str) -> Iterator[tuple[str | None, str]]:
    """(qualifier or None, column) for every column name in a plan condition, in order (string
    literals, casts, function names, keywords and `$n` parameters left out)."""
    text = _CAST.sub("", _STRING.sub("''", condition))
    for match in _NAME.finditer(text):
        if text[match.end():].lstrip().startswith("("):
            continue  # a function name
        qualifier, name = match.group(1), match.group(2)
        if qualifier is None and (name.lower() in _NOT_NAMES or name.lower() in RESERVED):
            continue
        if qualifier is None and name[0].isdigit():
            continue
        yield (_unquote(qualifier) if qualifier else None), _unquote(name)


# -- the plan as a tree (afs.pg.plan.raw_tree) -------------------------------------------------
def _own_names(node: _Node) -> set[str]:
    names = {str(node.raw[k]) for k in ("Alias", "Relation Name") if node.raw.get(k)}
    return {_unquote(n) if n.startswith('"') else n for n in names}


def _num(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


class _Costs:
    """Inclusive and own time (ms, over all loops) of each node, or its estimated cost."""

    def __init__(self, root: _Node, analysed: bool) -> None:
        self.analysed = analysed
        self.root = root
        self.total = max(self.inclusive(root), 1e-9)

    def inclusive(self, node: _Node) -> float:
        if self.analysed:
            return _num(node.raw.get("Actual Total Time")) * node.loops / max(node.processes, 1.0)
        return _num(node.raw.get("Total Cost"))

    def own(self, node: _Node) -> float:
        return max(0.0, self.inclusive(node) - sum(self.inclusive(c) for c in node.children))

    def rows(self, node: _Node) -> float:
        """Rows the node returns over all its loops (estimated without ANALYZE)."""
        if self.analysed:
            return _num(node.raw.get("Actual Rows")) * node.loops
        return _num(node.raw.get("Plan Rows"))

    def removed(self, node: _Node) -> float:
        return (_num(node.raw.get("Rows Removed by Filter"))
                + _num(node.raw.get("Rows Removed by Index Recheck"))) * node.loops

    def executions(self, subplan: _Node) -> float:
        """How often a SubPlan ran: its loops, or (estimated) the cost its parent spends beyond
        its other children, in units of one run of the subplan."""
        if self.analysed:
            return subplan.loops if "Actual Loops" in subplan.raw else 1.0
        once = self.inclusive(subplan)
        parent = subplan.parent
        if parent is None or once <= 0:
            return 1.0
        return 1.0 + self.own(parent) / once

    def subplans(self, node: _Node) -> float:
        """What the subplans `node` runs (its filter's, its output's) take, over all their runs."""
        return sum(self.inclusive(c) * (1.0 if self.analysed else self.executions(c))
                   for c in node.children if c.raw.get("Parent Relationship") in ("SubPlan", "InitPlan"))

    def share(self, value: float) -> float:
        return max(0.0, min(1.0, value / self.total))


def _relation(node: _Node) -> str | None:
    relation = node.raw.get("Relation Name")
    if not relation:
        return None
    schema = node.raw.get("Schema")
    return f"{schema}.{relation}" if schema else str(relation)


def _own_columns(node: _Node, keys: tuple[str, ...], of: _Node | None = None) -> tuple[str, ...]:
    """The columns of `node`'s relation named in `of`'s (default: `node`'s) conditions `keys`."""
    source = of or node
    mine = _own_names(node)
    single = of is None  # unqualified names in a scan's own conditions are its own
    found: list[str] = []
    for key in keys:
        value = source.raw.get(key)
        for text in (value if isinstance(value, list) else [value] if value else []):
            for qualifier, name in condition_names(str(text)):
                if (qualifier in mine or (qualifier is None and single)) and name not in found:
                    found.append(name)
    return tuple(found)


def _join_above(node: _Node) -> _Node | None:
    walker = node.parent
    while walker is not None and walker.type not in _JOINS:
        if walker.raw.get("Parent Relationship") in ("SubPlan", "InitPlan"):
            return None
        walker = walker.parent if walker.type in ("Hash", "Materialize", "Memoize", "Sort", "Gather",
                                                  "Gather Merge", "Bitmap Heap Scan") else None
    return walker


def _is_subplan(node: _Node) -> bool:
    name = str(node.raw.get("Subplan Name") or "")
    return name.startswith("SubPlan")


def _hashed(node: _Node, text: str) -> bool:
    name = str(node.raw.get("Subplan Name") or "")
    return name.startswith("hashed") or f"hashed {name}" in text


def _describe(node: _Node, costs: _Costs) -> str:
    relation = node.raw.get("Relation Name")
    label = node.type + (f" using {node.raw['Index Name']}" if node.raw.get("Index Name") else "")
    label += f" on {relation}" if relation else ""
    parts = [label]
    for key in ("Index Cond", "Filter", "Join Filter", "Hash Cond", "Sort Key"):
        value = node.raw.get(key)
        if value:
            text = ", ".join(map(str, value)) if isinstance(value, list) else str(value)
            parts.append(f"{key}: {shorten(text, 90)}")
    if costs.analysed:
        removed = costs.removed(node)
        if removed:
            parts.append(f"{fmt_count(removed)} rows removed")
        if node.loops > 1:
            parts.append(f"{fmt_count(node.loops)} loops")
        if node.raw.get("Heap Fetches"):
            parts.append(f"{fmt_count(_num(node.raw['Heap Fetches']) * node.loops)} heap fetches")
    return ", ".join(parts)


def _scan(node: _Node, costs: _Costs) -> Bottleneck | None:
    rows, removed = costs.rows(node), costs.removed(node)
    filtered = bool(node.raw.get("Filter") or node.raw.get("Recheck Cond"))
    side = node  # the scan, or what is over it below the join (Materialize, Aggregate, …)
    while (side.parent is not None and side.parent.type not in _JOINS
           and side.raw.get("Parent Relationship") not in ("SubPlan", "InitPlan")):
        side = side.parent
    parent = side.parent
    inner = (parent is not None and parent.type == "Nested Loop"
             and side.raw.get("Parent Relationship") == "Inner" and side.loops > 1)
    conditions = _own_columns(node, ("Index Cond", "Recheck Cond", "Filter"))
    # a bitmap heap scan with its bitmap index scan (not the subplans its filter runs); an
    # inner side with what is over it (a Materialize's rescans)
    share = costs.share(costs.inclusive(side if inner else node) - costs.subplans(node))

    def make(kind: BottleneckKind, columns: tuple[str, ...], loops: int | None = None) -> Bottleneck:
        loops = int(node.loops) if loops is None else loops
        said = _describe(node, costs)
        if kind == "join_inner" and inner:
            said += ", inner side of a nested loop"
            said += f", {fmt_count(loops)} loops" if loops > node.loops else ""
        elif kind == "join_inner":
            said += f", read whole to be joined on {', '.join(columns)}"
        detail = f"{said}, {fmt_pct(share)} of the {'time' if costs.analysed else 'cost'}"
        return Bottleneck(kind, _relation(node), columns, node.type, share, detail, loops)

    wasteful = removed > rows if costs.analysed else (node.type == "Seq Scan" and filtered)
    if inner and (node.type == "Seq Scan" or wasteful):
        keys = _own_columns(node, ("Join Filter",), of=parent) if parent is not None else ()
        return make("join_inner", tuple(dict.fromkeys((*conditions, *keys))), int(side.loops))
    if wasteful and conditions:
        return make("scan_filter", conditions)
    if node.type == "Seq Scan":
        join = _join_above(node)
        keys = _own_columns(node, ("Hash Cond", "Merge Cond", "Join Filter"), of=join) if join else ()
        top_rows = costs.rows(costs.root)
        if keys and rows > max(top_rows, 1.0) * 2:
            return make("join_inner", keys)
        if rows > 0 and top_rows >= RETURNED_SHARE * rows:
            return make("rows_returned", ())
        return None
    fetches = _num(node.raw.get("Heap Fetches")) * node.loops
    if node.type in ("Index Scan", "Bitmap Heap Scan") or (
            node.type == "Index Only Scan" and fetches > rows / 2 > 0):
        return make("heap_fetch", conditions)
    return None


def _subplan(node: _Node, costs: _Costs) -> Bottleneck | None:
    runs = costs.executions(node)
    if runs <= 1:
        return None
    total = costs.inclusive(node) * (1.0 if costs.analysed else runs)
    share = costs.share(total)
    scans = [n for n in nodes_below(node) if n.type in _SCANS]
    if not scans:
        return None
    costliest = max(scans, key=costs.inclusive)
    relation = _relation(costliest)
    columns: list[str] = []
    for scan in scans:
        if _relation(scan) == relation:
            columns += [c for c in _own_columns(scan, ("Index Cond", "Recheck Cond", "Filter"))
                        if c not in columns]
    name = node.raw.get("Subplan Name")
    detail = (f"{name} ({node.type}) runs {fmt_count(runs)} times"
              f"{'' if costs.analysed else ' (estimated)'}: {_describe(costliest, costs)}, "
              f"{fmt_pct(share)} of the {'time' if costs.analysed else 'cost'}")
    return Bottleneck("subplan_per_row", relation, tuple(columns), node.type, share, detail, int(runs))


def _spill_or_sort(node: _Node, costs: _Costs) -> Bottleneck | None:
    raw = node.raw
    workers = [raw, *(w for w in raw.get("Workers") or () if isinstance(w, Mapping))]
    on_disk = (any(w.get("Sort Space Type") == "Disk" for w in workers)
               or max(_num(raw.get("Hash Batches")), _num(raw.get("Original Hash Batches"))) > 1
               or any(_num(w.get("Disk Usage")) > 0 for w in workers))
    keys = [str(k) for k in raw.get("Sort Key") or raw.get("Group Key") or ()]
    share = costs.share(costs.own(node))
    columns = tuple(name for key in keys for _, name in condition_names(key))
    detail = f"{_describe(node, costs)}{', on disk' if on_disk else ''}, {fmt_pct(share)} of the " + (
        "time" if costs.analysed else "cost")
    if on_disk:
        return Bottleneck("spill", None, columns, node.type, share, detail, int(node.loops))
    if node.type in ("Sort", "Incremental Sort"):
        return Bottleneck("sort", None, columns, node.type, share, detail, int(node.loops))
    return None


def bottlenecks(plan: Mapping[str, Any], analysed: bool) -> tuple[Bottleneck, ...]:
    """The plan's bottlenecks, the most costly first (module docstring). `plan` is the top node,
    its {"Plan": …} wrapper or EXPLAIN's whole document; `analysed`: EXPLAIN ran it (times)
    rather than estimated it (costs). A node with less than MIN_SHARE of the whole is left out."""
    if isinstance(plan, list):
        plan = plan[0] if plan else {}
    raw = plan.get("Plan", plan) if isinstance(plan.get("Plan"), Mapping) else plan
    if not raw or "Node Type" not in raw:
        return ()
    analysed = analysed and "Actual Total Time" in raw
    root = raw_tree(raw)
    costs = _Costs(root, analysed)
    text = json.dumps(raw)
    found: list[Bottleneck] = []
    inside: set[int] = set()  # the nodes of a subplan reported as one
    for node in nodes_below(root):
        if id(node) in inside:
            continue
        found_here: Bottleneck | None = None
        if _is_subplan(node) and not _hashed(node, text):
            found_here = _subplan(node, costs)
            if found_here is not None:
                inside |= {id(n) for n in nodes_below(node)}
        elif node.type in _SCANS:
            found_here = _scan(node, costs)
        elif node.type in ("Sort", "Incremental Sort", "Hash", "Aggregate"):
            found_here = _spill_or_sort(node, costs)
        if found_here is not None and found_here.share >= MIN_SHARE:
            found.append(found_here)
    return tuple(sorted(found, key=lambda b: -b.share))
