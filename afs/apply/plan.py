"""What applying a task's winner would do, worked out from the stored result (pure).

`plan_winner(result)` turns the recorded winner of a completed task into an `ApplyPlan`:
the exact statements to run on the target (indexes always CONCURRENTLY), the lock each
one takes, the rollback of each, the seed's tier (T0 read/nothing applied, T2 DDL needs a
person's approval, T3 refused) and the figures measured in the fork (build time, storage).
Winners that are not applied to a database (rewrites, settings, partitioning) get a plan
that says what to do by hand and why, and `applicable` False.

The winner's commands go through the safety validator again: a refused statement makes
the plan T3 (blocked), whatever the stored verdict said.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from pglast import ast
from pglast.stream import RawStream, maybe_double_quote_name

from afs.errors import InputError
from afs.models import AgentOutcome, TaskResult
from afs.safety import (
    Change,
    Fact,
    NewIndex,
    NewStatistics,
    NewView,
    creates,
    settings_sql,
    validate_candidate,
)

Tier = Literal["T0", "T2", "T3"]
StepKind = Literal["index", "index_parent", "attach", "statistics", "statistics_target", "analyze",
                   "extension", "matview", "refresh"]
PlanKind = Literal["index", "statistics", "materialized_view", "settings", "rewrite", "partitioning",
                   "blocked"]

TIER_TEXT = {"T0": "T0 read: nothing is changed on the database",
             "T2": "T2 DDL: needs a person's approval",
             "T3": "T3 blocked: never applied"}
_LOCKS: dict[str, str] = {
    "index": "SHARE UPDATE EXCLUSIVE on the table (CONCURRENTLY: reads and writes continue; "
             "it waits for transactions older than the build)",
    "statistics": "SHARE UPDATE EXCLUSIVE on the table (reads and writes continue)",
    "analyze": "SHARE UPDATE EXCLUSIVE on the table (reads and writes continue)",
    "statistics_target": "SHARE UPDATE EXCLUSIVE on the table, for an instant (catalog only)",
    "extension": "none on user tables (catalog only)",
    "matview": "ACCESS SHARE on the tables it reads (writes continue); the new view is its own",
    "refresh": "EXCLUSIVE on the view (reads of the view continue only with CONCURRENTLY)",
    "index_parent": "SHARE on the partitioned table, for an instant (ON ONLY: no rows are read, "
                    "nothing is built)",
    "attach": "brief catalog locks on the parent and the partition's index (nothing is built)",
}
NAME_MAX = 63  # PostgreSQL's identifier length


def partitioned_steps(step: Step, tree: Mapping[str, Sequence[str]]) -> tuple[Step, ...]:
    """An index on a partitioned table, the way CONCURRENTLY can build it (plain CONCURRENTLY
    is refused there), at any depth of sub-partitioning. `tree` maps each partitioned table
    of the tree (the root as `step.table` names it) to its partitions, in order.

    Steps: the same index CONCURRENTLY on every leaf partition; then ON ONLY (nothing is
    built, invalid until complete) on each partitioned table, the deepest first and the
    root last; then the attachments bottom-up, each partition's index to its parent's (a
    sub-partitioned table's index becomes valid once its own are attached, then is attached
    in turn). The rollback runs backwards: dropping the root's index drops every index
    attached under it; whatever was not attached yet is dropped by its own step.
    """
    assert step.kind == "index" and step.name and step.table and step.index is not None
    index = step.index
    root_name = _last_part(step.name)
    leaves: list[Step] = []
    parents: list[Step] = []
    attaches: list[Step] = []
    used: set[str] = set()

    def index_on(table: str, name: str, *, concurrent: bool) -> tuple[str, str]:
        schema = table.rpartition(".")[0]
        return (f"{schema}.{name}" if schema else name), index.on(table, name, concurrent=concurrent)

    def visit(table: str, index: str) -> None:
        for partition in tree.get(table, ()):
            child_name = f"{root_name}_{_last_part(partition)}"[:NAME_MAX]
            if child_name in used:
                child_name = f"{child_name[:NAME_MAX - 6]}_{len(used)}"
            used.add(child_name)
            if partition in tree:  # partitioned itself: its own ON ONLY index, its partitions first
                child, sql = index_on(partition, child_name, concurrent=False)
                visit(partition, child)
                parents.append(Step("index_parent", sql, _LOCKS["index_parent"],
                                    f"DROP INDEX IF EXISTS {child}", partition, step.columns, child))
            else:
                child, sql = index_on(partition, child_name, concurrent=True)
                leaves.append(Step("index", sql, _LOCKS["index"],
                                   f"DROP INDEX CONCURRENTLY IF EXISTS {child}", partition, step.columns,
                                   child))
            attaches.append(Step("attach", f"ALTER INDEX {index} ATTACH PARTITION {child}",
                                 _LOCKS["attach"]))

    visit(step.table, step.name)
    root = Step("index_parent", index.on(index.table, _last_part(index.name or step.name), concurrent=False),
                _LOCKS["index_parent"],
                f"DROP INDEX IF EXISTS {step.name}", step.table, step.columns, step.name)
    return (*leaves, *parents, root, *attaches)


def _last_part(name: str) -> str:
    return name.rpartition(".")[2]


@dataclass(frozen=True)
class Step:
    kind: StepKind
    sql: str  # exactly what runs on the target
    lock: str
    rollback: str | None = None  # undoes this step (None: nothing to undo)
    table: str | None = None  # the table an index or statistics object is on (as written)
    columns: tuple[str, ...] = ()  # the plain columns it names
    name: str | None = None  # the object it creates (index, statistics, view), as written
    reads: tuple[str, ...] = ()  # a materialized view's: the tables its query reads
    unique: bool = False  # a UNIQUE index (a view with one refreshes CONCURRENTLY)
    index: NewIndex | None = None  # an index step's: the index as the validator read it


@dataclass(frozen=True)
class RefreshPlan:
    """How to keep a materialized view fresh: the command, and a schedule derived from how long
    a refresh takes (the build measured in the fork) and how fast the tables it reads change
    (sampled on the target by `afs.apply.target.measure_writes`; None until then).

    The interval is the time it takes 1 % of the rows it reads to change (STALE_SHARE),
    kept between a refresh cost of at most 1 % of the time (COST_SHARE: at least 100 ×
    the refresh time, and 5 minutes) and a day.
    """

    views: tuple[tuple[str, bool], ...]  # (view, has a unique index: CONCURRENTLY possible)
    reads: tuple[str, ...]
    refresh_s: float
    writes_per_s: float | None = None  # rows inserted, updated or deleted per second, sampled
    rows: int | None = None  # rows of the tables it reads
    sampled_s: float = 0.0

    @property
    def cost_floor_s(self) -> float:
        return max(REFRESH_MIN_S, self.refresh_s / COST_SHARE)

    @property
    def stale_s(self) -> float | None:
        """How long until STALE_SHARE of the rows it reads have changed (None: unknown or never)."""
        if not self.writes_per_s or self.rows is None:
            return None
        return STALE_SHARE * max(self.rows, 1) / self.writes_per_s

    @property
    def interval_s(self) -> float:
        if self.writes_per_s is None:  # not sampled: the cost alone
            return self.cost_floor_s
        stale = self.stale_s
        if stale is None:  # nothing written while sampled
            return REFRESH_MAX_S
        return min(REFRESH_MAX_S, max(self.cost_floor_s, stale))

    def commands(self) -> tuple[str, ...]:
        return tuple(f"REFRESH MATERIALIZED VIEW {'CONCURRENTLY ' if unique else ''}{view}"
                     for view, unique in self.views)

    def lines(self) -> tuple[str, ...]:
        interval, cron = _every(self.interval_s)
        why = [f"a refresh takes about {self.refresh_s:.2f} s, as the build did in the fork"]
        if self.writes_per_s is None:
            why.append("the write rate of the tables it reads is measured when the plan meets the target")
        elif self.stale_s is None:
            why.append(f"no rows of {', '.join(self.reads)} changed in the {self.sampled_s:.0f} s sampled: "
                       "refresh after each data load, or daily")
        else:
            why.append(f"{', '.join(self.reads)} change {self.writes_per_s:.1f} rows/s (sampled "
                       f"{self.sampled_s:.0f} s) of about {self.rows} rows: 1 % of them change in "
                       f"{_duration(self.stale_s)}")
            if self.stale_s < self.cost_floor_s:
                why.append(f"refreshing that often would spend over {COST_SHARE:.0%} of the time refreshing: "
                           f"every {_duration(self.cost_floor_s)} at most (or use an index, not a view)")
        out = ["refresh plan: the view is a snapshot of the tables it reads, stale until refreshed:"]
        for (_, unique), command in zip(self.views, self.commands(), strict=True):
            out.append(f"  {command};" + ("" if unique else
                       "   -- no unique index: blocks reads of the view while it runs"))
        out.append(f"  suggested schedule: every {interval} ({'; '.join(why)})")
        for command in self.commands():
            name = command.rsplit(" ", 1)[1].replace(".", "_")
            out.append(f"  with pg_cron: SELECT cron.schedule('afs_refresh_{name}', '{cron}', '{command}');")
        return tuple(out)

    def public(self) -> dict[str, object]:
        return {"commands": list(self.commands()), "interval_s": round(self.interval_s),
                "cron": _every(self.interval_s)[1], "refresh_s": round(self.refresh_s, 3),
                "writes_per_s": None if self.writes_per_s is None else round(self.writes_per_s, 2),
                "rows": self.rows, "reads": list(self.reads), "sampled_s": self.sampled_s}


COST_SHARE = 0.01  # refreshing may take at most this share of the time
STALE_SHARE = 0.01  # refresh by the time this share of the rows it reads has changed
REFRESH_MIN_S = 300.0
REFRESH_MAX_S = 86_400.0


def _every(seconds: float) -> tuple[str, str]:
    """A cron-friendly interval at least `seconds` long: its text and its cron expression."""
    minutes = max(1, int(seconds / 60 + 0.999))
    if minutes < 60:
        step = next(m for m in (1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30, 60) if m >= minutes)
        if step < 60:
            return f"{step} minutes", f"*/{step} * * * *"
    hours = (minutes + 59) // 60
    if hours < 24:
        step = next(h for h in (1, 2, 3, 4, 6, 8, 12, 24) if h >= hours)
        if step < 24:
            return (f"{step} hours" if step > 1 else "hour"), f"0 */{step} * * *"
    return "day", "0 3 * * *"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} minutes"
    return f"{seconds / 3600:.1f} hours"


@dataclass(frozen=True)
class ApplyPlan:
    task_id: str
    kind: PlanKind
    tier: Tier
    risk: str
    query: str
    agent: str
    steps: tuple[Step, ...] = ()
    warnings: tuple[str, ...] = ()
    build_s: float = 0.0  # measured in the fork
    storage_mb: float = 0.0  # measured in the fork
    improvement_pct: float = 0.0
    fork_ms: float | None = None  # the query's median in the fork with the winner in place
    advice: tuple[str, ...] = ()  # what a person does by hand (rewrites, settings, partitioning)
    refused: tuple[str, ...] = ()  # the validator's reasons (T3)
    rewritten_query: str | None = None  # what the application runs instead (a view's reader)
    refresh: RefreshPlan | None = None  # a materialized view's: how to keep it fresh

    @property
    def verify_query(self) -> str:
        """The query measured on the target after the build (the rewrite when there is one)."""
        return self.rewritten_query or self.query

    @property
    def applicable(self) -> bool:
        return self.tier == "T2" and bool(self.steps)

    @property
    def rollback(self) -> tuple[str, ...]:
        return tuple(s.rollback for s in reversed(self.steps) if s.rollback)

    def public(self) -> dict[str, object]:
        return {
            "task_id": self.task_id, "kind": self.kind, "tier": self.tier, "risk": self.risk,
            "agent": self.agent, "query": self.query, "applicable": self.applicable,
            "steps": [{"sql": s.sql, "lock": s.lock, "rollback": s.rollback} for s in self.steps],
            "rollback": list(self.rollback), "warnings": list(self.warnings),
            "build_s": round(self.build_s, 3), "storage_mb": round(self.storage_mb, 2),
            "improvement_pct": round(self.improvement_pct, 1), "fork_ms": self.fork_ms,
            "advice": list(self.advice), "refused": list(self.refused),
            "refresh": None if self.refresh is None else self.refresh.public(),
        }


def winner_of(result: TaskResult) -> AgentOutcome:
    """The recorded winner of a completed task; InputError for anything else."""
    if result.status != "completed":
        raise InputError(f"task {result.task_id} is {result.status}: only the winner of a completed "
                         "task can be applied")
    if result.decision is None or result.decision.winner is None:
        raise InputError(f"task {result.task_id} has no winner to apply")
    outcome = next((o for o in result.outcomes if o.agent == result.decision.winner), None)
    if outcome is None or outcome.proposal is None or outcome.benchmark is None:
        raise InputError(f"task {result.task_id}: the winner {result.decision.winner} "
                         "has no measured proposal")
    return outcome


def _step(fact: Fact) -> Step:
    """The step of one accepted command, from what the validator read of it."""
    if isinstance(fact, NewIndex):  # CONCURRENTLY: never a write lock on a live database
        drop = (f"DROP INDEX CONCURRENTLY IF EXISTS {RawStream()(_name_node(fact.name))}"
                if fact.name else None)
        return Step("index", fact.concurrently, _LOCKS["index"], drop, fact.table, fact.columns, fact.name,
                    unique=fact.unique, index=fact)
    if isinstance(fact, NewStatistics):
        return Step("statistics", fact.statement, _LOCKS["statistics"],
                    f"DROP STATISTICS IF EXISTS {fact.name}", fact.table, fact.columns, fact.name)
    if isinstance(fact, NewView):
        return Step("matview", fact.statement, _LOCKS["matview"],
                    f"DROP MATERIALIZED VIEW IF EXISTS {fact.name}", name=fact.name, reads=fact.reads)
    if isinstance(fact, Change) and fact.kind == "statistics_target":
        reset = ", ".join(f"ALTER COLUMN {maybe_double_quote_name(c)} SET STATISTICS -1"
                          for c in fact.columns)
        return Step("statistics_target", fact.statement, _LOCKS["statistics_target"],
                    f"ALTER TABLE IF EXISTS {RawStream()(_name_node(fact.table or ''))} {reset}", fact.table,
                    fact.columns)
    if isinstance(fact, Change) and fact.kind in ("analyze", "extension", "refresh"):
        return Step(fact.kind, fact.statement, _LOCKS[fact.kind])
    raise InputError(f"no way to apply {fact.statement!r}")  # pragma: no cover - validate_proposal refuses it


def _name_node(name: str) -> ast.RangeVar:
    schema, _, rel = name.rpartition(".")
    return ast.RangeVar(schemaname=schema or None, relname=rel, inh=True)


def plan_winner(result: TaskResult) -> ApplyPlan:
    """The plan for the winner of `result` (a completed task); InputError when there is none."""
    outcome = winner_of(result)
    proposal, bench = outcome.proposal, outcome.benchmark
    assert proposal is not None and bench is not None
    verdict = validate_candidate(proposal)
    baseline = next((m for m in bench.measurements if m.name == "baseline"), None)
    common = {
        "task_id": result.task_id, "query": result.query, "agent": outcome.agent, "risk": verdict.risk_level,
        "warnings": tuple(w for w in verdict.warnings  # apply builds CONCURRENTLY: that one is handled
                          if not w.startswith("CREATE INDEX without CONCURRENTLY")),
        "build_s": bench.apply_s, "storage_mb": bench.storage_delta_mb,
        "improvement_pct": bench.average_improvement_pct,
        "fork_ms": None if baseline is None else baseline.optimized.median_ms,
        "rewritten_query": proposal.rewritten_query,
    }
    if not verdict.is_valid:
        return ApplyPlan(kind="blocked", tier="T3", refused=tuple(
            f"{r.reason}: {r.statement}" for r in verdict.rejected), **common)  # type: ignore[arg-type]
    kind = proposal.proposal_type
    if kind in ("partitioning", "denormalization"):
        return ApplyPlan(kind="partitioning", tier="T3", advice=(
            f"{kind} is a migration, never run by afs apply: run these steps in a maintenance window, "
            f"after a backup (the build took {bench.apply_s:.1f} s in the fork, "
            f"{bench.storage_delta_mb:.1f} MB):",
            *(f"  {sql};" for sql in proposal.sql_commands),
            "rollback (best effort, in order):",
            *(f"  {sql};" for sql in proposal.rollback_commands)), **common)  # type: ignore[arg-type]
    advice: list[str] = []
    if proposal.rewritten_query:
        checks = bench.parameter_checks
        advice.extend([
            "run this query instead (the application changes; nothing is applied to the database):",
            f"  {proposal.rewritten_query}",
            "why it is equivalent: the fork returned the same rows for the original and the rewrite on "
            f"the suite ({', '.join(m.name for m in bench.measurements if m.equivalent) or 'none'}) "
            f"and on {sum(c.equivalent for c in checks)} of {len(checks)} other parameter sets:",
            *(f"  {c.label}: {'same rows' if c.equivalent else 'DIFFERENT rows'}" for c in checks),
        ])
    if proposal.settings:
        advice.extend([
            "settings are recommended, not applied; for this query only, in its transaction:",
            *(f"  {sql};" for sql in settings_sql(proposal.settings, "SET LOCAL")),
            "or for the role that runs it (a person decides: it applies to all its queries):",
            *(f"  ALTER ROLE <role> SET {name} = '{value.strip()}';" for name, value in proposal.settings),
        ])
    steps = tuple(_step(fact) for fact in creates(proposal).commands)
    if not steps:
        plan_kind: PlanKind = "settings" if proposal.settings and not proposal.rewritten_query else "rewrite"
        return ApplyPlan(kind=plan_kind, tier="T0", advice=tuple(advice), **common)  # type: ignore[arg-type]
    refresh = None
    if any(s.kind == "matview" for s in steps):
        plan_kind = "materialized_view"
        unique = {_last_part(s.table) for s in steps if s.kind == "index" and s.unique and s.table}
        views = tuple((s.name, _last_part(s.name) in unique) for s in steps if s.kind == "matview" and s.name)
        reads = tuple(dict.fromkeys(t for s in steps if s.kind == "matview" for t in s.reads))
        refresh = RefreshPlan(views, reads, refresh_s=bench.apply_s)
    elif any(s.kind == "statistics" for s in steps):
        plan_kind = "statistics"
    else:
        plan_kind = "index"
    return ApplyPlan(kind=plan_kind, tier="T2", steps=steps, advice=tuple(advice), refresh=refresh,
                     **common)  # type: ignore[arg-type]


def render_plan(plan: ApplyPlan) -> str:
    """The plan as a person reads it before approving."""
    out = [f"AFS apply: task {plan.task_id}, winner {plan.agent} ({plan.kind}), "
           f"{plan.improvement_pct:.1f} % faster in the fork",
           f"query: {' '.join(plan.query.split())}",
           f"tier:  {TIER_TEXT[plan.tier]} (risk {plan.risk})"]
    for i, s in enumerate(plan.steps, 1):
        out.append(f"step {i}: {s.sql};")
        out.append(f"  lock:     {s.lock}")
        if s.rollback:
            out.append(f"  rollback: {s.rollback};")
    if plan.steps:
        out.append(f"measured in the fork: build {plan.build_s:.2f} s, adds {plan.storage_mb:.1f} MB"
                   + (f", query {plan.fork_ms:.2f} ms" if plan.fork_ms is not None else ""))
    out.extend(f"warning: {w}" for w in plan.warnings)
    out.extend(f"refused: {r}" for r in plan.refused)
    out.extend(plan.advice)
    if plan.refresh is not None:
        out.extend(plan.refresh.lines())
    return "\n".join(out)

