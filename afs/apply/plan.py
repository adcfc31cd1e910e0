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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pglast import ast, parse_sql
from pglast.stream import RawStream, maybe_double_quote_name

from afs.errors import InputError
from afs.models import AgentOutcome, TaskResult
from afs.safety import settings_sql, validate_candidate

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


def partitioned_steps(step: Step, partitions: Sequence[str]) -> tuple[Step, ...]:
    """An index on a partitioned table, the way CONCURRENTLY can build it (plain CONCURRENTLY
    is refused there): the same index CONCURRENTLY on each partition, then the parent's index
    ON ONLY (invalid until complete) and each partition's attached to it.

    The order lets the rollback run backwards: dropping the parent's index drops the attached
    ones; a partition's index not yet attached is dropped CONCURRENTLY by itself.
    """
    assert step.kind == "index" and step.name and step.table
    parent_name = _last_part(step.name)
    children: list[Step] = []
    attaches: list[Step] = []
    used: set[str] = set()
    for partition in partitions:
        child_name = f"{parent_name}_{_last_part(partition)}"[:NAME_MAX]
        if child_name in used:
            child_name = f"{child_name[:NAME_MAX - 6]}_{len(used)}"
        used.add(child_name)
        stmt = parse_sql(step.sql)[0].stmt
        assert isinstance(stmt, ast.IndexStmt)
        schema, _, rel = partition.rpartition(".")
        stmt.relation = ast.RangeVar(schemaname=schema or None, relname=rel, inh=True)
        stmt.idxname = child_name
        child = f"{schema}.{child_name}" if schema else child_name
        children.append(Step("index", RawStream()(stmt), _LOCKS["index"],
                             f"DROP INDEX CONCURRENTLY IF EXISTS {child}", partition, step.columns, child))
        attaches.append(Step("attach", f"ALTER INDEX {step.name} ATTACH PARTITION {child}", _LOCKS["attach"]))
    stmt = parse_sql(step.sql)[0].stmt
    assert isinstance(stmt, ast.IndexStmt) and stmt.relation is not None
    stmt.concurrent = False
    stmt.relation.inh = False  # ON ONLY
    parent = Step("index_parent", RawStream()(stmt), _LOCKS["index_parent"],
                  f"DROP INDEX IF EXISTS {step.name}", step.table, step.columns, step.name)
    return (*children, parent, *attaches)


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


def _qualified(rv: ast.RangeVar | None) -> str | None:
    if rv is None or not rv.relname:
        return None
    return f"{rv.schemaname}.{rv.relname}" if rv.schemaname else rv.relname


def _step(command: str) -> Step:
    stmt = parse_sql(command)[0].stmt
    if isinstance(stmt, ast.IndexStmt):
        stmt.concurrent = True  # never a write lock on a live database
        stmt.if_not_exists = False  # an index of that name already there is an error, not a no-op
        table = _qualified(stmt.relation)
        name = (f"{stmt.relation.schemaname}.{stmt.idxname}"
                if stmt.relation is not None and stmt.relation.schemaname else stmt.idxname)
        columns = tuple(e.name for e in stmt.indexParams or () if isinstance(e, ast.IndexElem) and e.name)
        return Step("index", RawStream()(stmt), _LOCKS["index"],
                    f"DROP INDEX CONCURRENTLY IF EXISTS {RawStream()(_name_node(name))}" if name else None,
                    table, columns, name)
    if isinstance(stmt, ast.CreateStatsStmt):
        parts = [p.sval or "" for p in stmt.defnames or () if isinstance(p, ast.String)]
        rels = [r for r in stmt.relations or () if isinstance(r, ast.RangeVar)]
        columns = tuple(e.name for e in stmt.exprs or () if isinstance(e, ast.StatsElem) and e.name)
        name = ".".join(parts)
        return Step("statistics", command, _LOCKS["statistics"], f"DROP STATISTICS IF EXISTS {name}",
                    _qualified(rels[0]) if rels else None, columns, name)
    if isinstance(stmt, ast.VacuumStmt):
        return Step("analyze", command, _LOCKS["analyze"])
    if isinstance(stmt, ast.AlterTableStmt):  # ALTER COLUMN … SET STATISTICS (the allow-list's only one)
        table = _qualified(stmt.relation)
        columns = tuple(c.name for c in stmt.cmds or () if isinstance(c, ast.AlterTableCmd) and c.name)
        reset = ", ".join(f"ALTER COLUMN {maybe_double_quote_name(c)} SET STATISTICS -1" for c in columns)
        return Step("statistics_target", command, _LOCKS["statistics_target"],
                    f"ALTER TABLE IF EXISTS {RawStream()(_name_node(table or ''))} {reset}", table, columns)
    if isinstance(stmt, ast.CreateExtensionStmt):
        return Step("extension", command, _LOCKS["extension"])
    if isinstance(stmt, ast.CreateTableAsStmt):
        assert stmt.into is not None
        name = _qualified(stmt.into.rel)
        return Step("matview", command, _LOCKS["matview"], f"DROP MATERIALIZED VIEW IF EXISTS {name}",
                    name=name)
    if isinstance(stmt, ast.RefreshMatViewStmt):
        return Step("refresh", command, _LOCKS["refresh"])
    raise InputError(f"no way to apply {command!r}")  # pragma: no cover - validate_proposal refuses it


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
    steps = tuple(_step(c) for c in proposal.sql_commands)
    if not steps:
        plan_kind: PlanKind = "settings" if proposal.settings and not proposal.rewritten_query else "rewrite"
        return ApplyPlan(kind=plan_kind, tier="T0", advice=tuple(advice), **common)  # type: ignore[arg-type]
    if any(s.kind == "matview" for s in steps):
        plan_kind = "materialized_view"
        views = [s.name for s in steps if s.kind == "matview"]
        advice.extend([
            "refresh plan: the view is a snapshot; refresh it as often as the query tolerates stale rows:",
            *(f"  REFRESH MATERIALIZED VIEW CONCURRENTLY {v};   -- needs a unique index on it; "
              f"else without CONCURRENTLY (blocks reads of the view while it runs)" for v in views),
            f"  suggested schedule: every {_schedule(bench.apply_s)} (the build took {bench.apply_s:.1f} s "
            "in the fork), e.g. from cron or pg_cron",
        ])
    elif any(s.kind == "statistics" for s in steps):
        plan_kind = "statistics"
    else:
        plan_kind = "index"
    return ApplyPlan(kind=plan_kind, tier="T2", steps=steps, advice=tuple(advice), **common)  # type: ignore[arg-type]


def _schedule(build_s: float) -> str:
    """A refresh interval that keeps refreshing under ~1 % of the time."""
    minutes = max(5, int(build_s * 100 / 60 + 0.999))
    return f"{minutes} minutes" if minutes < 60 else f"{(minutes + 59) // 60} hours"


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
    return "\n".join(out)

