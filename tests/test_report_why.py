"""The text report says why the winner beat the others, in the numbers that decided it, once
(issue 27 item 4): consensus's sentence on the winner under `winner:`, and the sentence on a
proposal that ran the query faster and still lost (a partial index that does not serve other
values of the filter), not repeated among the consensus lines."""

from __future__ import annotations

import dataclasses

from test_consensus import BASE_MS, outcome

from afs.consensus import decide
from afs.models import ParameterCheck, RoutingDecision, TaskResult, Timing
from afs.report import render_text


def test_the_report_says_once_why_the_winner_beat_a_faster_proposal() -> None:
    plain = outcome("gemini25pro", pct=90.0, sql=("CREATE INDEX ix_user ON orders (user_id)",))
    partial = outcome("gemini25flash", pct=99.0, ptype="partial_index",
                      sql=("CREATE INDEX ix_pending ON orders (user_id) WHERE status = 'pending'",))
    assert partial.benchmark is not None
    slower = ParameterCheck("orders.status = 'shipped'", equivalent=True, slower=True,
                            baseline=Timing(BASE_MS, 5.0, 3, 100), optimized=Timing(1500.0, 5.0, 3, 100))
    partial = dataclasses.replace(partial, benchmark=dataclasses.replace(partial.benchmark,
                                                                         parameter_checks=(slower,)))
    decision = decide([plain, partial])
    assert decision.winner == "gemini25pro"
    result = TaskResult("t1", "completed", "SELECT 1", "afs_demo", RoutingDecision(("gemini25pro",), ("t",)),
                        (plain, partial), decision, "heuristic", "", 1.0)
    text = render_text(result)
    why = [line.removeprefix("  why: ") for line in text.splitlines() if line.startswith("  why: ")]
    lost = next(line for line in decision.rationale if line.startswith("gemini25flash "))
    # consensus's sentence on the winner (its times: before → after), then why the faster one lost
    assert why == [decision.rationale[0], lost], why
    assert why[0].startswith("gemini25pro wins") and "the query as given 1 s → 100 ms (10×)" in why[0]
    assert text.count("→ 100 ms") == 1  # the times once: in the sentence
    assert "slower than the original for orders.status = 'shipped'" in lost
    assert text.count(decision.rationale[0]) == 1 and text.count(lost) == 1  # once: not as consensus lines
    assert text.index("winner: gemini25pro") < text.index(lost)
