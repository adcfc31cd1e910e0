"""Did an applied change keep its promise? pg_stat_statements before and after the apply.

    pre = await snapshot(target_dsn, plan)               # afs.apply.run, before the build
    promise = await promise_at_apply(target_dsn, plan, pre)  # after the build: audited
    verdicts = await check_applied(store, target_of)     # `afs audit --check`, `afs batch`

What is compared: the statements of the tables the change touches, read from the target's
pg_stat_statements (summed over roles, top-level only): every SELECT, INSERT, UPDATE,
DELETE or MERGE whose text names one of them (the names resolved by the target's catalog).
Among them, the statements it serves: the task's own (its queryid from EXPLAIN (VERBOSE) on
the target) and, once built, every one whose plan on the target uses what it built (a
statement with `$n` filled from pg_stats as the batch fills it: an application's bind
parameters give another queryid than the task's literals). Every plan goes through afs.target.on_target.
pg_stat_statements keeps running totals of calls, time, rows and the standard deviation of
the time; Σ t² follows from them, so the counters of any window between two readings give
that window's calls, mean and variance exactly.

The windows: `before` is everything counted up to the apply (since the statistics' reset);
the build itself is left out (read just before and just after it); `recent` is since the
last check (or the apply), `reference` from the apply to the last check. A statement is
a regression when its recent mean is slower than before the apply, or than right after
it (the gain lost: the index dropped, the planner moved away), by more than the noise
allows — a one-sided Welch test at ALPHA, Bonferroni-corrected for the number of
comparisons — and by at least MIN_SLOWDOWN. A check advances the checkpoint of every
statement it could judge (enough calls), so the next check reads the calls since.
The verdict offers the rollback recorded with the apply (`afs rollback TASK`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from pglast import ast, parse_sql
from pglast.parser import scan
from psycopg.types.json import Jsonb

from afs.apply import audit
from afs.apply.plan import ApplyPlan
from afs.apply.resolve import same_database
from afs.batch.fill import fill_statement
from afs.batch.statements import relations
from afs.db import Connection, open_connection
from afs.errors import AfsError, InputError
from afs.store import Store
from afs.target import Cursor, on_target

ALPHA = 0.01  # the one-sided significance of a slowdown, before the Bonferroni correction
MIN_SLOWDOWN = 0.10  # and the mean must be at least this much slower (a tenth)
MIN_CALLS = 5  # calls a window needs before it is judged
TOTAL_SLACK_MS = 1e-3  # a stored total is rounded: below the one read again by less is no reset
MAX_STATEMENTS = 50  # statements recorded per apply (the costliest that touch its tables)
SERVED_SETS = 8  # parameter sets a statement with $n is planned with (the common values first)

StatementVerdict = Literal["regression", "faster", "same", "too_few_calls"]
Overall = Literal["regression", "kept", "no_gain", "unknown"]

_COUNTERS = """
SELECT s.queryid, min(s.query), sum(s.calls)::bigint, sum(s.total_exec_time),
       sum(s.calls * (s.stddev_exec_time ^ 2 + s.mean_exec_time ^ 2)), sum(s.rows)::bigint
FROM pg_stat_statements s
WHERE s.dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND s.toplevel
  AND s.queryid IS NOT NULL
GROUP BY s.queryid ORDER BY 4 DESC"""
_DML = (ast.SelectStmt, ast.InsertStmt, ast.UpdateStmt, ast.DeleteStmt, ast.MergeStmt)


# -- pure: counters, windows, the test --------------------------------------------------------
@dataclass(frozen=True)
class Counter:
    """One statement's running totals: calls, time (ms), Σ time² (ms²), rows."""

    calls: int
    total_ms: float
    sumsq: float
    rows: int

    def public(self) -> list[float]:
        return [self.calls, round(self.total_ms, 6), round(self.sumsq, 6), self.rows]

    @classmethod
    def of(cls, values: Sequence[float]) -> Counter:
        return cls(int(values[0]), float(values[1]), float(values[2]), int(values[3]))


@dataclass(frozen=True)
class Reading:
    """pg_stat_statements at one moment: the statements the change serves."""

    at: str  # ISO, the target's clock
    stats_reset: str | None
    counters: Mapping[int, Counter]
    queries: Mapping[int, str] = field(default_factory=dict)
    own: int | None = None  # the task's statement's queryid

    @property
    def queryids(self) -> tuple[int, ...]:
        return tuple(self.counters)

    def public(self) -> dict[str, Any]:
        return {"at": self.at, "stats_reset": self.stats_reset,
                "counters": {str(q): c.public() for q, c in self.counters.items()}}

    @classmethod
    def of(cls, doc: Mapping[str, Any]) -> Reading:
        return cls(str(doc["at"]), doc.get("stats_reset"),
                   {int(q): Counter.of(v) for q, v in dict(doc.get("counters") or {}).items()})


@dataclass(frozen=True)
class Window:
    """The calls between two readings: how many, their mean and sample variance, rows per call."""

    start: str | None
    end: str
    calls: int
    mean_ms: float
    var: float
    rows_per_call: float

    def public(self) -> dict[str, Any]:
        return {"start": self.start, "end": self.end, "calls": self.calls, "mean_ms": round(self.mean_ms, 4),
                "stddev_ms": round(math.sqrt(self.var), 4), "rows_per_call": round(self.rows_per_call, 2)}


def window(later: Counter, earlier: Counter | None, start: str | None, end: str) -> Window | None:
    """The window between two readings of one statement (None: no calls in it). `earlier`
    None, or counters that went down (a reset, an evicted entry): `later` from its start."""
    if earlier is not None and (later.calls < earlier.calls
                                or later.total_ms < earlier.total_ms - TOTAL_SLACK_MS):
        earlier = None
    n = later.calls - (earlier.calls if earlier else 0)
    if n <= 0:
        return None
    total = later.total_ms - (earlier.total_ms if earlier else 0.0)
    sumsq = later.sumsq - (earlier.sumsq if earlier else 0.0)
    rows = later.rows - (earlier.rows if earlier else 0)
    mean = total / n
    var = max(0.0, (sumsq - n * mean * mean) / (n - 1)) if n > 1 else 0.0
    return Window(start, end, n, mean, var, max(0, rows) / n)


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (Lentz's method)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        step = d * c
        h *= step
        if abs(step - 1.0) < 1e-12:
            break
    return h


def _betai(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x)
                     + b * math.log(1.0 - x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with `df` degrees of freedom."""
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    tail = 0.5 * _betai(df / 2.0, 0.5, df / (df + t * t))
    return tail if t > 0 else 1.0 - tail


def slower_p(after: Window, before: Window) -> float:
    """One-sided Welch test: the probability of a mean `after` this much slower than `before`
    (or more) were the two the same. 1.0 when it is not slower."""
    if after.mean_ms <= before.mean_ms:
        return 1.0
    a, b = after.var / after.calls, before.var / before.calls
    if a + b == 0.0:
        return 0.0  # no spread at all, and a different mean
    t = (after.mean_ms - before.mean_ms) / math.sqrt(a + b)
    df = (a + b) ** 2 / ((a * a / (after.calls - 1) if after.calls > 1 else 0.0)
                         + (b * b / (before.calls - 1) if before.calls > 1 else 0.0) or 1e-300)
    return t_sf(t, max(1.0, df))


@dataclass(frozen=True)
class Judged:
    queryid: int
    query: str
    own: bool  # the statement the change was made for
    verdict: StatementVerdict
    reason: str
    before: Window | None
    reference: Window | None  # from the apply to the last check
    recent: Window | None  # since the last check (or the apply)
    p_slower: float | None = None

    def public(self) -> dict[str, Any]:
        change = (None if self.before is None or self.recent is None or self.before.mean_ms == 0 else
                  round(100.0 * (self.recent.mean_ms - self.before.mean_ms) / self.before.mean_ms, 1))
        return {"queryid": self.queryid, "query": self.query, "own": self.own, "verdict": self.verdict,
                "reason": self.reason, "change_pct": change,
                "p_slower": None if self.p_slower is None else float(f"{self.p_slower:.3g}"),
                "before": self.before and self.before.public(),
                "reference": self.reference and self.reference.public(),
                "recent": self.recent and self.recent.public()}


@dataclass(frozen=True)
class Observed:
    """One statement as a check sees it: its queryid and text, whether the change serves it
    (`own`), and its windows of calls: before the apply, right after it (the reference: the
    apply to the last check) and since the last check (or the apply)."""

    queryid: int
    query: str
    own: bool
    before: Window | None
    reference: Window | None
    recent: Window | None


def judge(seen: Observed, alpha: float) -> Judged:
    """One statement's verdict from its windows (`alpha`: per comparison, corrected already)."""
    before, reference, recent = seen.before, seen.reference, seen.recent
    parts = dict(queryid=seen.queryid, query=seen.query, own=seen.own, before=before, reference=reference,
                 recent=recent)
    if recent is None or recent.calls < MIN_CALLS:
        got, since = (0, "the last check") if recent is None else (recent.calls, recent.start)
        return Judged(verdict="too_few_calls", reason=f"{got} call(s) since {since}"
                      f" (at least {MIN_CALLS} needed)", **parts)  # type: ignore[arg-type]
    worst: tuple[float, str] | None = None
    for base, name in ((before, "before the apply"), (reference, "right after the apply")):
        if base is None or base.calls < MIN_CALLS:
            continue
        p = slower_p(recent, base)
        slow = recent.mean_ms >= base.mean_ms * (1.0 + MIN_SLOWDOWN)
        if p < alpha and slow and (worst is None or p < worst[0]):
            worst = (p, f"{recent.mean_ms:.3f} ms a call over {recent.calls} calls since {recent.start}, "
                        f"{name} {base.mean_ms:.3f} ms over {base.calls} (one-sided Welch p = {p:.2g} < "
                        f"{alpha:.2g})")
    if worst is not None:
        return Judged(verdict="regression", reason="slower: " + worst[1], p_slower=worst[0], **parts)  # type: ignore[arg-type]
    if before is None or before.calls < MIN_CALLS:
        return Judged(verdict="too_few_calls", reason=f"{0 if before is None else before.calls} call(s) "
                      f"before the apply (at least {MIN_CALLS} needed)", **parts)  # type: ignore[arg-type]
    p_faster = slower_p(before, recent)
    if p_faster < alpha and before.mean_ms >= recent.mean_ms * (1.0 + MIN_SLOWDOWN):
        return Judged(verdict="faster", reason=f"{before.mean_ms:.3f} → {recent.mean_ms:.3f} ms a call "
                      f"(Welch p = {p_faster:.2g})", p_slower=slower_p(recent, before), **parts)  # type: ignore[arg-type]
    return Judged(verdict="same", reason=f"{before.mean_ms:.3f} → {recent.mean_ms:.3f} ms a call: within "
                  "the noise", p_slower=slower_p(recent, before), **parts)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Verdict:
    """A change's check: every statement it serves judged, the overall verdict, the rollback."""

    audit_id: int
    task_id: str
    target: str
    applied_at: str
    verdict: Overall
    reason: str
    statements: tuple[Judged, ...]
    rollback: tuple[str, ...]
    window: str  # in words

    def public(self) -> dict[str, Any]:
        return {"audit_id": self.audit_id, "task_id": self.task_id, "target": self.target,
                "applied_at": self.applied_at, "verdict": self.verdict, "reason": self.reason,
                "window": self.window, "statements": [s.public() for s in self.statements],
                "rollback": {"command": f"afs rollback {self.task_id}", "sql": list(self.rollback)}
                if self.verdict == "regression" else None}


def at_apply(pre: Reading, post: Reading, served: Iterable[int] = ()) -> dict[str, Any]:
    """What the audit row keeps: the counters just before and just after the build, and the
    statements the change serves (the task's, and those whose plan uses what it built)."""
    return {"own": pre.own, "served": sorted(set(served)),
            "queries": {str(q): t for q, t in pre.queries.items()},
            "before": pre.public(), "applied": post.public()}


def compare(promise: Mapping[str, Any], now: Reading, *, audit_id: int, task_id: str, target: str,
            rollback: Sequence[str]) -> tuple[Verdict, dict[str, Any]]:
    """The verdict from the counters recorded at the apply and `now` (pure), and the new
    checkpoint (per statement: advanced where the recent window could be judged)."""
    before = Reading.of(promise["before"])
    applied = Reading.of(promise["applied"])
    last = Reading.of(promise["checkpoint"]) if promise.get("checkpoint") else None
    owns = {promise.get("own"), *promise.get("served", ())} - {None}
    queries = {int(q): str(t) for q, t in dict(promise.get("queries") or {}).items()}
    reset_since = now.stats_reset is not None and now.stats_reset != applied.stats_reset
    checkpoint: dict[int, Counter] = dict(last.counters) if last and not reset_since else {}
    ids = list(applied.counters)
    alpha = ALPHA / max(1, 2 * len(ids))
    judged: list[Judged] = []
    for q in ids:
        b = before.counters.get(q)
        w_before = window(b, None, before.stats_reset, before.at) if b else None
        a = applied.counters[q]
        cp = checkpoint.get(q)
        start: str | None = applied.at
        start_counter: Counter | None = a
        if last and cp:
            start, start_counter = last.at, cp
        current = now.counters.get(q)
        if reset_since:  # everything since the apply was counted from the reset
            start, start_counter = now.stats_reset, None
        recent = window(current, start_counter, start, now.at) if current else None
        reference = window(cp, a, applied.at, last.at) if (cp and last and not reset_since) else None
        judged.append(judge(Observed(q, queries.get(q, ""), q in owns, w_before, reference, recent), alpha))
        if current is not None and recent is not None and recent.calls >= MIN_CALLS:
            checkpoint[q] = current
    regressions = [j for j in judged if j.verdict == "regression"]
    mine = [j for j in judged if j.own]
    faster = [j for j in mine if j.verdict == "faster"]
    same = [j for j in mine if j.verdict == "same"]
    if regressions:
        overall: Overall = "regression"
        reason = (f"{len(regressions)} statement(s) slower beyond the noise: "
                  + "; ".join(f"{j.queryid}: {j.reason}" for j in regressions))
    elif faster:
        overall = "kept"
        reason = (f"{len(faster)} statement(s) it serves faster ({faster[0].reason}); no statement of its "
                  "tables slower")
    elif same:
        overall = "no_gain"
        reason = f"the statements it serves are not faster than before the apply: {same[0].reason}"
    else:
        overall = "unknown"
        reason = (mine[0].reason if mine else "no statement it serves is in pg_stat_statements (none has "
                  "the task's queryid or a plan that uses what it built)")
    newest = last.at if last and not reset_since else applied.at
    what = "statistics were reset after the apply" if reset_since else "last check" if last else "apply"
    text = (f"before: the calls counted up to the apply ({applied.at}, since the statistics' reset "
            f"{before.stats_reset or 'unknown'}); recent: since {now.stats_reset if reset_since else newest} "
            f"(the {what}) to {now.at}")
    verdict = Verdict(audit_id, task_id, target, applied.at, overall, reason, tuple(judged), tuple(rollback),
                      text)
    new_checkpoint = Reading(now.at, now.stats_reset, checkpoint).public()
    return verdict, new_checkpoint


# -- on the target --------------------------------------------------------------------------
def _query_id(cur: Cursor, query: str) -> int | None:
    cur.execute(f"EXPLAIN (VERBOSE, FORMAT JSON) {query}")
    row = cur.fetchone()
    assert row is not None
    value = row[0][0].get("Query Identifier")
    return None if value in (None, 0) else int(value)


def _dml(query: str) -> bool:
    try:
        tree = parse_sql(query)
    except Exception:  # a text pg_stat_statements kept that pglast cannot read: not ours to judge
        return False
    return len(tree) == 1 and isinstance(tree[0].stmt, _DML)


async def read(conn: Connection, *, tables: Iterable[str] = (), own_query: str | None = None,
               queryids: Iterable[int] = ()) -> Reading:
    """The counters now of the statements given by queryid, or else of the task's own statement
    and of the DML that names one of `tables` (resolved by the target's catalog)."""
    at, reset = await conn.fetchone(
        "SELECT now(), (SELECT stats_reset FROM pg_stat_statements_info)") or (None, None)
    rows = await conn.fetchall(_COUNTERS)
    wanted = set(queryids)
    own = None
    if not wanted:
        if own_query is not None:
            own = await on_target(conn, own_query, _query_id)
        named: dict[int, list[str]] = {}
        for q, text, *_ in rows:
            if q == own or not _dml(text):
                continue
            try:
                named[int(q)] = relations(text)
            except Exception:  # unreadable text: not counted
                continue
        names = sorted({n for ns in named.values() for n in ns} | set(tables))
        oids = dict(await conn.fetchall(  # to_regclass: NULL for what does not resolve
            "SELECT n, to_regclass(n)::oid FROM unnest(%s::text[]) n", (names,)))
        mine = {oids.get(t) for t in tables} - {None}
        hits = [q for q, ns in named.items() if {oids.get(n) for n in ns} & mine]
        wanted = set(hits[:MAX_STATEMENTS - 1]) | ({own} if own is not None else set())
    counters = {int(q): Counter(int(c), float(t), float(s or 0.0), int(r or 0))
                for q, text, c, t, s, r in rows if int(q) in wanted}
    queries = {int(q): str(text) for q, text, *_ in rows if int(q) in wanted}
    return Reading(_iso(at) or "", _iso(reset), counters, queries, own)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


async def snapshot(target_dsn: str, plan: ApplyPlan, queryids: Iterable[int] = ()) -> Reading | str:
    """The counters of the statements the plan serves (or of `queryids`), on the target; the
    reason as text when they cannot be read (no pg_stat_statements): the apply goes on."""
    try:
        async with open_connection(target_dsn) as conn:
            if not await conn.fetchval("SELECT 1 FROM pg_extension WHERE extname = 'pg_stat_statements'"):
                return "pg_stat_statements is not created in the target database: nothing to compare later"
            tables = [s.table for s in plan.steps if s.table]
            return await read(conn, tables=tables, own_query=plan.query, queryids=queryids)
    except AfsError as exc:
        return f"pg_stat_statements could not be read at the apply: {str(exc).splitlines()[0]}"


async def promise_at_apply(target_dsn: str, plan: ApplyPlan, pre: Reading | str) -> dict[str, Any]:
    """After a successful build: the audit row's "promise" (or why there is none)."""
    if isinstance(pre, str):
        return {"unavailable": pre}
    post = await snapshot(target_dsn, plan, pre.queryids or (-1,))
    if isinstance(post, str):
        return {"unavailable": post}
    served: list[int] = []
    with contextlib.suppress(AfsError):
        async with open_connection(target_dsn) as conn:
            served = await uses_indexes(conn, pre.queries, [s.name for s in plan.steps
                                                            if s.kind == "index" and s.name])
    return at_apply(pre, post, served)


def _index_names(cur: Cursor, query: str) -> set[str]:
    generic = any(t.name == "PARAM" for t in scan(query))
    cur.execute(f"EXPLAIN ({'GENERIC_PLAN, ' if generic else ''}FORMAT JSON) {query}")
    row = cur.fetchone()
    assert row is not None
    found: set[str] = set()
    stack = [row[0][0]["Plan"]]
    while stack:
        node = stack.pop()
        if node.get("Index Name"):
            found.add(str(node["Index Name"]))
        stack.extend(node.get("Plans", ()))
    return found


async def uses_indexes(conn: Connection, queries: Mapping[int, str], indexes: Sequence[str]) -> list[int]:
    """The statements whose plan on the target uses one of `indexes`: the statements the change
    serves. One with `$n` is filled from pg_stats as the batch fills it (afs.batch.fill: its
    common values and quantiles, SERVED_SETS sets; a partial index serves some values only),
    else planned generic. Planned through afs.target.on_target."""
    names = {i.rpartition(".")[2].strip('"') for i in indexes}
    served = []
    for queryid, text in queries.items():
        if not text.lstrip().lower().startswith("select"):
            continue
        try:
            if any(t.name == "PARAM" for t in scan(text)):  # filled as the batch fills it (pg_stats)
                filled = await fill_statement(conn, text, SERVED_SETS)
                texts = [s.query for s in filled.sets] or [text]
            else:
                texts = [text]
            used: set[str] = set()
            for one in texts:
                used |= await on_target(conn, one, _index_names, parameters=one is text)
        except AfsError:  # refused by the checks, or it does not plan: not counted as served
            continue
        if used & names:
            served.append(queryid)
    return served


# -- the check ------------------------------------------------------------------------------
TargetOf = Callable[[Mapping[str, Any]], Awaitable[str | None]]


async def check_applied(store: Store, target_of: TargetOf,
                        task_id: str | None = None) -> list[dict[str, Any]]:
    """Every change in place (applied through `afs apply`, not rolled back) checked against its
    target's pg_stat_statements now; each verdict stored on its audit row (the monitor shows
    it) with the new checkpoint. `target_of(row)`: the DSN to read, None to leave it out."""
    out: list[dict[str, Any]] = []
    for row in await audit.in_place(store, task_id):
        base = {"audit_id": row["id"], "task_id": row["task_id"], "target": row["target"],
                "applied_at": row["at"], "statements": [], "rollback": None}
        try:
            dsn = await target_of(row)
        except AfsError as exc:  # where it was applied cannot be resolved: said, the others checked
            out.append(base | {"verdict": "unknown", "window": None, "reason": str(exc).splitlines()[0]})
            continue
        if dsn is None:
            continue
        promise = dict(row["verification"].get("promise") or {})
        if "applied" not in promise:
            doc = base | {"verdict": "unknown", "window": None, "reason": promise.get(
                "unavailable", "no pg_stat_statements counters were recorded when it was applied")}
            out.append(doc)
            continue
        try:
            async with open_connection(dsn) as conn:
                now = await read(conn, queryids=[int(q) for q in promise["applied"]["counters"]] or [-1])
        except (AfsError, InputError) as exc:
            out.append(base | {"verdict": "unknown", "window": None,
                               "reason": f"the target could not be read: {str(exc).splitlines()[0]}"})
            continue
        verdict, checkpoint = compare(promise, now, audit_id=row["id"], task_id=row["task_id"],
                                      target=row["target"], rollback=row["rollback_sql"])
        doc = verdict.public()
        await audit.record_check(store, row["id"], checkpoint, doc)
        out.append(doc)
    return out


async def for_batch(store: Store, batch_id: str, target_dsn: str) -> list[dict[str, Any]]:
    """A batch's check of the changes applied on its target (`applied_changes` of its stored
    report): each change in place there, checked as `afs audit --check` checks it."""
    async def target_of(row: Mapping[str, Any]) -> str | None:
        return target_dsn if same_database(target_dsn, str(row["target"])) else None

    verdicts = await check_applied(store, target_of)
    await store.conn.execute(
        "UPDATE afs_store.batches SET report = report || jsonb_build_object('applied_changes', %s::jsonb)"
        " WHERE id = %s AND report IS NOT NULL", (Jsonb(verdicts), batch_id))
    return verdicts


def render(verdicts: Sequence[Mapping[str, Any]]) -> str:
    """The verdicts as a person reads them."""
    if not verdicts:
        return "no change applied through afs apply is in place"
    out = []
    for v in verdicts:
        out.append(f"audit #{v['audit_id']} task {v['task_id']} on {v['target']}: {v['verdict'].upper()}"
                   f" — {v['reason']}")
        if v.get("window"):
            out.append(f"    window: {v['window']}")
        for s in v["statements"]:
            recent, before = s.get("recent"), s.get("before")
            figures = (f"{before['mean_ms']:.3f} ms ×{before['calls']} before, " if before else "") + (
                f"{recent['mean_ms']:.3f} ms ×{recent['calls']} recent" if recent else "no recent calls")
            mark = "*" if s["own"] else " "
            out.append(f"  {mark} {s['queryid']:>20} {s['verdict']:<13} {figures}  "
                       f"{' '.join(s['query'].split())[:70]}")
        if v.get("rollback"):
            out.append(f"    offer: {v['rollback']['command']}  (runs: "
                       f"{'; '.join(v['rollback']['sql']) or 'nothing recorded'})")
    out.append("(* the statement the change was made for)")
    return "\n".join(out)
