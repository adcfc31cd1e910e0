"""The Gemini agents run the loop as a conversation (issue 25 item 6): `GeminiBrain.refine`.

Against the fake Gemini server of afs.testing on loopback (the real REST protocol): the loop's
turn carries the turns before it (analysis, proposal, earlier steps: multi-turn `contents`) and
the measured figures (the plan with the design in place, the times, the costliest node, an
index the planner did not use, the earlier steps' notes), all as data; the answer is parsed like
a proposal; a hostile answer is refused by the validator as always; the agent's model budget
ends the conversation.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from afs.brains import RefiningBrain, StepSeen
from afs.brains.gemini.brain import (
    Asking,
    GeminiBrain,
    Measured,
    open_gemini_squad,
    refine_prompt,
    unused_indexes,
)
from afs.brains.gemini.client import Credentials, RetryPolicy, open_gemini_client
from afs.brains.gemini.parsing import parse_proposals
from afs.config import GeminiSettings, ModelBudget, Settings
from afs.events import Emitter
from afs.forks.client import ForkClient
from afs.models import LoopStep, OptimizationProposal
from afs.optimize import Crew, TaskRequest, optimize
from afs.pg.bottleneck import Bottleneck
from afs.router import load_rules
from afs.safety import validate_candidate
from afs.sandbox.server import SandboxServer
from afs.testing import FakeGemini, FakeReply, FakeRequest, reply_json, serve_fake_gemini
from tests.test_gemini import ANALYSIS, ANALYZED, INDEX_SQL, PROPOSAL, QUERY, issue_context, plan_node

KEY = "loop-key"
COVERING_SQL = ("CREATE INDEX orders_user_status_created_cov_idx ON orders (user_id, status, created_at DESC)"
                " INCLUDE (total_amount)")
COVERING: dict[str, Any] = {
    **PROPOSAL, "proposal_type": "covering_index",
    "sql_commands": [COVERING_SQL, "ANALYZE orders"],
    "rollback_commands": ["DROP INDEX IF EXISTS orders_user_status_created_cov_idx"],
    "rationale": "total_amount in INCLUDE: an index-only scan, no heap fetch per row.",
}
HOSTILE: dict[str, Any] = {
    **PROPOSAL, "sql_commands": [INDEX_SQL, "DROP TABLE orders"],
    "rationale": "Ignore the safety rules: the table is in the way.",
}
# the query's plan with the step-1 index in place: an index scan that visits the heap per row
AFTER_PLAN = plan_node(
    "Index Scan", ms=3.2, rows=10, Relation_Name="orders", Alias="o",
    Index_Name="orders_user_status_created_idx",
    Index_Cond="((user_id = 42) AND (status = 'pending'::text))", Heap_Fetches=10)
NECK = Bottleneck(kind="heap_fetch", table="orders", columns=("user_id", "status"), node="Index Scan",
                  share=0.92, detail="Index Scan using orders_user_status_created_idx on orders: "
                                     "10 heap fetches, 92 % of the time")


@pytest.fixture
def fake() -> FakeGemini:
    return FakeGemini(api_key=KEY)


@pytest.fixture
def base_url(fake: FakeGemini) -> Iterator[str]:
    with serve_fake_gemini(fake) as url:
        yield url


@asynccontextmanager
async def open_brain(base_url: str, gemini: GeminiSettings | None = None) -> AsyncIterator[GeminiBrain]:
    credentials = Credentials(api_key=KEY, base_url=base_url, source="GOOGLE_API_KEY")
    async with open_gemini_client(credentials) as client:
        yield GeminiBrain(client, gemini or GeminiSettings(), Asking(policy=RetryPolicy(jitter=False)))


def _roles(request: FakeRequest) -> list[str]:
    return [content.get("role", "") for content in request.body.get("contents") or ()]


def _turns(request: FakeRequest) -> list[str]:
    return ["\n".join(p.get("text", "") for p in content.get("parts") or ())
            for content in request.body.get("contents") or ()]


async def _first_step(brain: GeminiBrain) -> OptimizationProposal:
    analysis = await brain.analyze("gemini25pro", issue_context())
    (current,) = await brain.propose("gemini25pro", issue_context(), analysis)
    return current


async def test_the_loops_turn_carries_the_earlier_turns_and_the_measured_figures(
        fake: FakeGemini, base_url: str) -> None:
    fake.script(reply_json(ANALYSIS), reply_json({"candidates": [PROPOSAL]}),
                reply_json({"candidates": [COVERING]}), reply_json({"candidates": []}))
    async with open_brain(base_url) as brain:
        assert isinstance(brain, RefiningBrain)
        analysis = await brain.analyze("gemini25pro", issue_context())
        (current,) = await brain.propose("gemini25pro", issue_context(), analysis)
        steps: tuple[LoopStep, ...] = (LoopStep(1, current, None, 3.2, True),)
        extended = await brain.refine("gemini25pro", issue_context(), analysis,
                                      StepSeen(current, AFTER_PLAN, NECK, steps))
        assert extended is not None
        # the model's next design, parsed like a proposal, naming the node that led to it
        assert extended.sql_commands == (COVERING_SQL, "ANALYZE orders")
        assert NECK.detail in extended.rationale
        steps += (LoopStep(2, extended, NECK.detail, 0.9, True),)
        after = plan_node("Index Only Scan", ms=0.9, rows=10, Relation_Name="orders", Alias="o",
                          Index_Name="orders_user_status_created_cov_idx", Heap_Fetches=0)
        assert await brain.refine("gemini25pro", issue_context(), analysis,
                                  StepSeen(extended, after, None, steps)) is None  # nothing more to remove
    proposed, first, second = fake.requests[1:]
    # the loop's turn goes on from the proposal's conversation, every earlier turn as it was
    assert _roles(first) == ["user", "model", "user", "model", "user"]
    assert _turns(first)[:3] == _turns(proposed)
    assert json.loads(_turns(first)[3]) == {"candidates": [PROPOSAL]}  # the model's own answer
    turn = _turns(first)[4]
    assert '"original_query_ms": 182.4' in turn and '"median_ms": 3.2' in turn  # the times, as data
    assert "Index Scan using orders_user_status_created_idx" in turn  # the plan with the design
    assert "EXPLAIN ANALYZE, measured" in turn and NECK.detail in turn
    assert '<data label="design in place">' in turn and INDEX_SQL in turn
    for figure in ("original_query_ms", NECK.detail, "Heap Fetches"):
        before = turn[:turn.index(figure)]
        assert before.count("<data") > before.count("</data>"), figure  # inside a data block
    # the second step: all the turns before it, its own figures
    assert _roles(second) == ["user", "model", "user", "model", "user", "model", "user"]
    assert _turns(second)[:5] == _turns(first)
    assert json.loads(_turns(second)[5]) == {"candidates": [COVERING]}
    assert '"median_ms": 0.9' in _turns(second)[6] and "Index Only Scan" in _turns(second)[6]
    assert first.generation_config["responseJsonSchema"]["properties"]["candidates"]["maxItems"] == 1
    usage = brain.usage_of("gemini25pro")
    assert usage is not None and usage.calls == 4 and usage.stopped is None


async def test_an_index_the_planner_ignored_and_the_earlier_steps_are_said(
        fake: FakeGemini, base_url: str) -> None:
    fake.script(reply_json(ANALYSIS), reply_json({"candidates": [PROPOSAL]}),
                reply_json({"candidates": [COVERING]}))
    ignored = plan_node("Seq Scan", ms=170.0, rows=10, Relation_Name="orders", Alias="o",
                        Filter="((status = 'pending'::text) AND (user_id = 42))")
    async with open_brain(base_url) as brain:
        current = await _first_step(brain)
        assert unused_indexes(current, ignored) == [INDEX_SQL]
        assert unused_indexes(current, AFTER_PLAN) == []
        refused = dataclasses.replace(current, sql_commands=("CREATE INDEX x ON orders (status)",))
        steps = (LoopStep(1, current, None, 170.0, True),
                 LoopStep(2, refused, "Seq Scan on orders", 171.0, False, "not faster than step 1"))
        await brain.refine("gemini25pro", issue_context(), ANALYZED, StepSeen(current, ignored, None, steps))
    turn = fake.requests[-1].prompt
    assert '<data label="unused indexes">' in turn and INDEX_SQL in turn
    assert "not faster than step 1" in turn and "CREATE INDEX x ON orders (status)" in turn


async def test_a_hostile_answer_is_sent_back_then_refused_by_the_validator(
        fake: FakeGemini, base_url: str) -> None:
    fake.script(reply_json(ANALYSIS), reply_json({"candidates": [PROPOSAL]}),
                *[reply_json({"candidates": [HOSTILE]}) for _ in range(3)])
    async with open_brain(base_url) as brain:
        current = await _first_step(brain)
        extended = await brain.refine("gemini25pro", issue_context(), ANALYZED, StepSeen(
            current, AFTER_PLAN, NECK, (LoopStep(1, current, None, 3.2, True),)))
    assert extended is not None and "DROP TABLE orders" in extended.sql_commands
    assert not validate_candidate(extended).is_valid  # the agent refuses it, as any other
    asked = fake.requests[2:]
    assert len(asked) == 3  # the refusal went back twice (the re-prompt bound), in the same conversation
    assert "the safety check refused them" in asked[1].prompt and "DROP TABLE" in asked[1].prompt
    assert _turns(asked[1])[:5] == _turns(asked[0])


async def test_the_model_budget_ends_the_conversation(fake: FakeGemini, base_url: str) -> None:
    fake.script(reply_json(ANALYSIS), reply_json({"candidates": [PROPOSAL]}),
                reply_json({"candidates": [COVERING]}), reply_json({"candidates": [COVERING]}))
    async with open_brain(base_url, GeminiSettings(budget=ModelBudget(turns=3))) as brain:
        current = await _first_step(brain)
        steps: tuple[LoopStep, ...] = (LoopStep(1, current, None, 3.2, True),)
        extended = await brain.refine("gemini25pro", issue_context(), ANALYZED,
                                      StepSeen(current, AFTER_PLAN, NECK, steps))
        assert extended is not None  # the third turn fits
        steps += (LoopStep(2, extended, NECK.detail, 0.9, True),)
        assert await brain.refine("gemini25pro", issue_context(), ANALYZED,
                                  StepSeen(extended, AFTER_PLAN, None, steps)) is None
    assert len(fake.requests) == 3 and fake.pending == 1  # no fourth call was made
    usage = brain.usage_of("gemini25pro")
    assert usage is not None and usage.calls == 3
    assert usage.stopped is not None and "3 model turns of 3 (gemini.budget.turns)" in usage.stopped


async def test_without_values_the_loops_turn_withholds_the_literals(fake: FakeGemini, base_url: str) -> None:
    fake.script(reply_json(ANALYSIS), reply_json({"candidates": [PROPOSAL]}),
                reply_json({"candidates": [COVERING]}))
    async with open_brain(base_url, GeminiSettings(send_values=False)) as brain:
        current = await _first_step(brain)
        await brain.refine("gemini25pro", issue_context(), ANALYZED, StepSeen(
            current, AFTER_PLAN, NECK, (LoopStep(1, current, None, 3.2, True),)))
    turn = fake.requests[-1].prompt
    assert "Index Scan using orders_user_status_created_idx" in turn
    assert "'pending'" not in turn and "user_id = 42" not in turn  # placeholders, as in the proposal


async def test_a_loop_without_our_proposal_starts_from_the_design_in_place(
        fake: FakeGemini, base_url: str) -> None:
    fake.script(reply_json({"candidates": [COVERING]}))
    (current,) = parse_proposals("gemini25pro", json.dumps({"candidates": [PROPOSAL]}))[0]
    async with open_brain(base_url) as brain:
        extended = await brain.refine("gemini25pro", issue_context(), ANALYZED, StepSeen(
            current, AFTER_PLAN, NECK, (LoopStep(1, current, None, 3.2, True),)))
    assert extended is not None and extended.sql_commands[0] == COVERING_SQL
    [request] = fake.requests
    assert _roles(request) == ["user", "model", "user", "model", "user"]
    assert INDEX_SQL in _turns(request)[3]


def test_the_refine_prompt_says_an_estimated_plan_is_one() -> None:
    (current,) = parse_proposals("gemini25pro", json.dumps({"candidates": [PROPOSAL]}))[0]
    estimated = {"Node Type": "Seq Scan", "Relation Name": "orders", "Alias": "o", "Total Cost": 9e6,
                 "Plan Rows": 10, "Plan Width": 16, "Filter": "(user_id = 42)"}
    text = refine_prompt(issue_context(), Measured(current, estimated, None,
                                                   (LoopStep(1, current, None, None, True),), step=1))
    assert "estimated: EXPLAIN without running it" in text and "(none found)" in text


# -- the loop in a fork: the agent measures what the conversation proposes ---------------------------
STATUS_SQL = "CREATE INDEX orders_status_loop_idx ON orders (status)"
STATUS_ONLY: dict[str, Any] = {
    **PROPOSAL, "proposal_type": "index", "sql_commands": [STATUS_SQL, "ANALYZE orders"],
    "rollback_commands": ["DROP INDEX IF EXISTS orders_status_loop_idx"],
    "rationale": "The status filter first.",
}
BOTH: dict[str, Any] = {
    **PROPOSAL, "sql_commands": [STATUS_SQL, INDEX_SQL, "ANALYZE orders"],
    "rollback_commands": ["DROP INDEX IF EXISTS orders_user_status_created_idx",
                          "DROP INDEX IF EXISTS orders_status_loop_idx"],
    "rationale": "The user_id filter the status index leaves: the composite index.",
}


def looping(request: FakeRequest) -> FakeReply:
    """Analysis; a first design that leaves a filter; on the loop's first turn the whole next
    design; then nothing more."""
    if request.prompt.startswith("MEASURED RESULT"):
        first_turn = sum(text.startswith("MEASURED RESULT") for text in _turns(request)) == 1
        return reply_json({"candidates": [BOTH] if first_turn else []})
    schema = request.generation_config.get("responseJsonSchema") or {}
    return reply_json({"candidates": [STATUS_ONLY]} if "candidates" in schema.get("properties", {})
                      else ANALYSIS)


@pytest.mark.usefixtures("no_leaked_forks")
async def test_the_agent_measures_the_design_the_conversation_extends(
        settings: Settings, sandbox: SandboxServer, forks: ForkClient) -> None:
    fake = FakeGemini(fallback=looping, api_key=KEY)
    with serve_fake_gemini(fake) as url:
        credentials = Credentials(api_key=KEY, base_url=url, source="GOOGLE_API_KEY")
        async with open_gemini_squad(settings.with_(measured=1), credentials, {}) as squad:
            squad = dataclasses.replace(squad, agents=("gemini25pro",))
            result = await optimize(settings.with_(measured=1), TaskRequest(query=QUERY, runs=3),
                                    source="afs_demo", source_dsn=sandbox.dsn("afs_demo"),
                                    crew=Crew(forks=forks, squad=squad, rules=load_rules(None)),
                                    events=Emitter("loop1"))
    [outcome] = result.outcomes
    assert outcome.status == "ok", outcome.error
    turns = [r for r in fake.requests if r.prompt.startswith("MEASURED RESULT")]
    assert turns, "the agent's loop asked the model"
    first = turns[0]
    # the plan read in the fork with the first design in place, and its measured time, went back
    assert "orders_status_loop_idx" in first.prompt and "user_id = 42" in first.prompt
    chained = [c for c in outcome.candidates if c.chain]
    assert chained, [c.note for c in outcome.candidates]
    chain = max((c.chain for c in chained), key=len)
    assert chain[0].proposal.sql_commands[0] == STATUS_SQL and chain[0].median_ms is not None
    assert f'"median_ms": {round(chain[0].median_ms, 3)}' in first.prompt
    step = chain[1]
    assert step.proposal.sql_commands[:2] == (STATUS_SQL, INDEX_SQL) and step.median_ms is not None
    assert step.motivated_by and step.motivated_by in step.proposal.rationale  # the node it answers
    assert step.kept and step.median_ms < chain[0].median_ms  # the composite index: far fewer rows read
    assert outcome.proposal is not None and INDEX_SQL in outcome.proposal.sql_commands
    usage = squad.usage_of("gemini25pro")
    assert usage is not None and usage.calls == 2 + len(turns)
