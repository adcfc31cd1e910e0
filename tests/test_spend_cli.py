"""The spending cap on the command line (issue 26 item 7): `afs optimize --max-spend`, and in
`afs batch` one cap for the whole batch, `--dry-run` with the spend bound, the spend in the
batch report. The commands run as a person runs them (afs.testing.run_afs: a subprocess), the
models behind the fake Gemini server of afs.testing on loopback."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import psycopg
import pytest

from afs.batch.job import BatchOptions, batch_meter
from afs.batch.report import Entry, build_report, outcome, render_markdown
from afs.batch.schedule import options_of
from afs.brains.gemini.brain import spend_bound
from afs.brains.gemini.client import SpendMeter, Usage, estimate_cost, today
from afs.config import DEFAULT_LOOP_STEPS, GeminiSettings, Settings
from afs.errors import InputError
from afs.models import AGENTS, AgentOutcome, ModelUsage, RoutingDecision, TaskResult
from afs.sandbox.server import SandboxServer
from afs.testing import FakeGemini, run_afs, run_afs_async, serve_fake_gemini
from tests.test_gemini import PROPOSAL, QUERY, answers

KEY = "spend-key"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("GOOGLE_API_KEY", "GEMINI_API_KEY", "GOOGLE_GENAI_USE_VERTEXAI",
                        "GOOGLE_GENAI_USE_ENTERPRISE")}
    return {**env, **extra}


# -- afs batch --dry-run: the bound before anything runs ---------------------------------------------
def test_batch_dry_run_prints_the_spend_bound_and_runs_nothing(tmp_path: Path) -> None:
    env = _env(GOOGLE_API_KEY=KEY, AFS_GEMINI_BASE_URL="http://127.0.0.1:9", AFS_HOME=str(tmp_path))
    done = run_afs("batch", "--dry-run", "--top", "4", "--max-spend", "0.25", "--json", env=env, text=True)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    per_task = spend_bound(GeminiSettings(), tuple(AGENTS), today(), loop_steps=DEFAULT_LOOP_STEPS,
                           revise=True)
    assert per_task is not None and per_task > 0
    assert doc["task_bound_usd"] == pytest.approx(per_task)
    assert doc["bound_usd"] == pytest.approx(4 * per_task, abs=1e-4)
    assert doc["max_spend_usd"] == 0.25 and doc["statements_at_most"] == 4
    assert set(doc["models"]) == set(AGENTS)
    assert not (tmp_path / "sandbox").exists()  # nothing started: no sandbox, no target read
    text = run_afs("batch", "--dry-run", "--top", "4", env=env, text=True)
    assert text.returncode == 0, text.stderr
    assert f"spend bound: {4 * per_task:.4f} USD" in text.stdout and "nothing was run" in text.stdout


def test_batch_dry_run_without_a_model_spends_nothing(tmp_path: Path) -> None:
    done = run_afs("batch", "--dry-run", "--provider", "heuristic", "--json",
                   env=_env(AFS_HOME=str(tmp_path)), text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["bound_usd"] == 0
    refused = run_afs("batch", "--dry-run", "--provider", "gemini", env=_env(AFS_HOME=str(tmp_path)),
                      text=True)
    assert refused.returncode == 2 and "--provider gemini" in refused.stderr


@pytest.mark.parametrize("command", [("optimize", "--query", QUERY), ("batch",)])
def test_a_bad_cap_is_refused_with_exit_2(command: tuple[str, ...], tmp_path: Path) -> None:
    done = run_afs(*command, "--max-spend", "-1", env=_env(AFS_HOME=str(tmp_path)), text=True)
    assert done.returncode == 2 and "expected US dollars" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "sandbox").exists()


def test_a_cap_for_a_task_run_elsewhere_is_refused(tmp_path: Path) -> None:
    done = run_afs("optimize", "--query", QUERY, "--max-spend", "1", "--server", "http://127.0.0.1:9",
                   env=_env(AFS_HOME=str(tmp_path)), text=True)
    assert done.returncode == 2 and "--max-spend caps the model calls of a task run here" in done.stderr


# -- afs optimize --max-spend: the cap stops the calls, the report says so, the exit code is 1 ------
@pytest.mark.usefixtures("no_leaked_forks")
async def test_optimize_stops_at_the_cap_and_says_what_was_spent(sandbox: SandboxServer) -> None:
    fake = FakeGemini(fallback=answers({"candidates": [PROPOSAL]}), api_key=KEY)
    # each answer of the fake is 1000 prompt + 200 output tokens: a cap below the cheapest such
    # call lets the first call through (nothing spent yet) and stops the next one
    gemini = GeminiSettings()
    one = min(estimate_cost(gemini.settings_of(gemini.model_of(agent)), Usage(1000, 200, 1200)) or 0
              for agent in AGENTS)
    cap = f"{one / 2:.6f}"
    with serve_fake_gemini(fake) as url:
        done = await run_afs_async("optimize", "--query", QUERY, "--provider", "gemini", "--runs", "3",
                                   "--max-spend", cap, "--json",
                                   env=_env(GOOGLE_API_KEY=KEY, AFS_GEMINI_BASE_URL=url))
    stderr = done.stderr.decode()
    assert done.returncode == 1, stderr
    assert f"the spending cap of {float(cap):g} USD stopped the model calls of" in stderr
    doc = json.loads(done.stdout)  # the report is still printed, whole
    spend = doc["model_spend"]
    assert spend["stopped"] and all(why.startswith("the spending cap") for why in spend["stopped"].values())
    assert f"{spend['estimated_cost_usd']:.4f} USD spent (estimated at list prices)" in stderr
    assert spend["estimated_cost_usd"] >= float(cap)
    asked = [r for r in fake.requests if "candidates" in str(r.generation_config)]
    assert not asked  # each agent's analysis went through (concurrently), no proposal was asked for
    assert len(fake.requests) == spend["calls"] == len(doc["proposals"])


@pytest.mark.usefixtures("no_leaked_forks")
async def test_the_task_goes_on_with_what_was_measured_when_the_cap_stops_the_loop(
        sandbox: SandboxServer) -> None:
    fake = FakeGemini(fallback=answers({"candidates": [PROPOSAL]}), api_key=KEY)
    gemini = GeminiSettings()
    # this query is routed to one agent: its analysis and proposal fit under the cap, the
    # loop's next turn (after the proposal was measured) does not
    one = estimate_cost(gemini.settings_of(gemini.model_of("gemini25flash")), Usage(1000, 200, 1200))
    assert one is not None
    with serve_fake_gemini(fake) as url:
        done = await run_afs_async("optimize", "--query", QUERY, "--provider", "gemini", "--runs", "3",
                                   "--max-spend", f"{one * 1.5:.6f}", "--json",
                                   env=_env(GOOGLE_API_KEY=KEY, AFS_GEMINI_BASE_URL=url))
    stderr = done.stderr.decode()
    doc = json.loads(done.stdout)
    assert doc["routing"]["agents"] == ["gemini25flash"], doc["routing"]
    assert done.returncode == 1, stderr
    assert doc["status"] == "completed" and doc["winner"]["sql_commands"][0] == PROPOSAL["sql_commands"][0]
    assert len(fake.requests) == 2 and doc["model_spend"]["calls"] == 2  # analysis, proposal
    assert doc["model_spend"]["stopped"]["gemini25flash"].startswith("the spending cap")
    assert "stopped the model calls of gemini25flash" in stderr


# -- the batch: one meter for every task, the spend in its report -----------------------------------
def test_one_meter_for_the_whole_batch() -> None:
    assert batch_meter(BatchOptions()) is None  # no --max-spend: each task has its own cap
    meter = batch_meter(BatchOptions(max_spend_usd=0.5))
    assert isinstance(meter, SpendMeter) and meter.cap_usd == 0.5
    with pytest.raises(InputError, match="--max-spend"):
        BatchOptions(max_spend_usd=-0.1).check()


def _result(usage: ModelUsage) -> TaskResult:
    return TaskResult(task_id="t", status="no_improvement", query="SELECT 1", source="afs_demo",
                      routing=RoutingDecision(("gemini25pro",), ("test",)),
                      outcomes=(AgentOutcome("gemini25pro", "ok", usage=usage),),
                      decision=None, provider="gemini", provider_note="", duration_s=1.0)


def test_the_batch_report_shows_the_spend_and_the_statements_the_cap_stopped() -> None:
    paid = ModelUsage(model="gemini-3.8-flash", calls=2, prompt_tokens=2000, output_tokens=400,
                      total_tokens=2400, estimated_cost_usd=0.003, stopped=None)
    capped = dataclasses.replace(paid, calls=1, total_tokens=1200, estimated_cost_usd=0.0015,
                                 stopped="the spending cap: gemini-3.8-flash: the spending cap is reached")
    entries = [outcome(Entry(1, "SELECT 1", 10, 5.0, 0.5, status="completed"), _result(paid), 3600.0),
               outcome(Entry(2, "SELECT 2", 10, 5.0, 0.5, status="completed"), _result(capped), 3600.0),
               outcome(Entry(3, "SELECT 3", 10, 5.0, 0.5, status="reused"), _result(paid), 3600.0)]
    header = {"id": "b1", "created_at": "2026-11-27T15:00:00+00:00", "database": "afs_demo",
              "period_s": 7200.0, "provider": "gemini", "options": {"max_spend_usd": 0.004}}
    doc = build_report(header, entries, [])
    spend = doc["model_spend"]
    assert spend["estimated_cost_usd"] == pytest.approx(0.0045)  # the reused one cost nothing now
    assert spend["calls"] == 3 and spend["cap_usd"] == 0.004 and spend["capped"] == [2]
    markdown = render_markdown(doc)
    assert "Model calls: 3, 3600 tokens, about $0.0045 (list-price estimate, not a bill); spending cap " \
           "0.004 USD; the cap stopped the model calls of statement(s) 2." in markdown


# -- afs batch --max-spend end to end: one meter for every task --------------------------------------
SLOW = ("SELECT o.id, o.total_amount FROM orders o WHERE o.status = 'pending' AND o.user_id = {u}"
        " ORDER BY o.created_at DESC")
COUNT = "SELECT count(*) FROM orders WHERE user_id = {u}"


@pytest.mark.usefixtures("no_leaked_forks")
async def test_a_batch_shares_one_cap_among_its_tasks(settings: Settings, store_db: str,
                                                      sandbox: SandboxServer) -> None:
    with psycopg.connect(sandbox.dsn(settings.demo_database), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute("SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database"
                     " WHERE datname = current_database()), 0)")
        for u in range(1, 41):
            conn.execute(SLOW.format(u=u).encode())
        for u in range(1, 6):
            conn.execute(COUNT.format(u=u).encode())
    fake = FakeGemini(fallback=answers({"candidates": [PROPOSAL]}), api_key=KEY)
    gemini = GeminiSettings()
    one = min(estimate_cost(gemini.settings_of(gemini.model_of(agent)), Usage(1000, 200, 1200)) or 0
              for agent in AGENTS)
    try:
        with serve_fake_gemini(fake) as url:
            done = await run_afs_async(
                "batch", "--top", "2", "--min-calls", "5", "--provider", "gemini", "--runs", "1",
                "--max-spend", f"{one / 2:.6f}", "--json",
                env=_env(GOOGLE_API_KEY=KEY, AFS_GEMINI_BASE_URL=url, AFS_STORE_URL=store_db))
    finally:  # the demo database is shared by the whole session: leave it as it was
        with psycopg.connect(sandbox.dsn(settings.demo_database), autocommit=True) as conn:
            conn.execute("DROP EXTENSION IF EXISTS pg_stat_statements")
    assert done.returncode == 1, done.stderr.decode()
    assert "the spending cap of" in done.stderr.decode() and "stopped the model calls of 2 statement(s)" \
        in done.stderr.decode()
    doc = json.loads(done.stdout)  # the report, whole
    first, second = doc["statements"]
    spend = doc["model_spend"]
    # the first task's analyses spent the cap; the second task made no call at all: one meter
    assert first["model_spend"]["calls"] >= 1 and second["model_spend"]["calls"] == 0
    assert len(fake.requests) == spend["calls"] == first["model_spend"]["calls"]
    assert spend["capped"] == [first["queryid"], second["queryid"]]
    assert spend["estimated_cost_usd"] == pytest.approx(first["model_spend"]["estimated_cost_usd"])
    assert doc["options"]["max_spend_usd"] == pytest.approx(one / 2, rel=1e-3)
    report = (settings.home / "reports" / f"batch-{doc['id']}.md").read_text()
    assert "the cap stopped the model calls of statement(s)" in report


async def test_a_schedule_carries_its_cap_to_each_run(store_db: str) -> None:
    added = await run_afs_async("schedule", "add", "--cron", "0 3 * * *", "--max-spend", "0.5", "--json",
                                env=_env(AFS_STORE_URL=store_db))
    assert added.returncode == 0, added.stderr.decode()
    options = options_of(json.loads(added.stdout)["options"])
    assert options.max_spend_usd == 0.5
    meter = batch_meter(options)  # what each run of the schedule (run_batch_here) counts against
    assert isinstance(meter, SpendMeter) and meter.cap_usd == 0.5
