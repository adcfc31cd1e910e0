"""The batch's report of a winner's write cost as its task measured it (and whether the consensus
weighed it), and the batch taking that figure instead of replaying the same writes again
(afs.batch.report, afs.batch.indexes: pure parts; the end to end is tests/test_batch_write_cost.py)."""

from __future__ import annotations

from typing import Any

from afs.batch.indexes import combined_cost, task_figure, task_offers
from afs.batch.report import consensus_weighed, in_task_words, workload_lines
from afs.models import WriteCost
from afs.report import write_cost_record

INSERT = "INSERT INTO orders (id, user_id) VALUES ($1, $2)"
UPDATE = "UPDATE orders SET status = $1 WHERE id = $2"
OTHER = "DELETE FROM order_items WHERE order_id = $1"
SQL = "CREATE INDEX ON orders (user_id)"


def record(*, statements: int = 2, ms_per_day: float | None = 240.0, reads_per_day: float | None = 12_000.0,
           saved: float | None = 5_000.0, note: str = "", writes: tuple[str, ...] = (INSERT, UPDATE)
           ) -> dict[str, Any]:
    cost = WriteCost(ms_per_write=0.02, writes_per_day=None if ms_per_day is None else 12_000.0,
                     ms_per_day=ms_per_day, reads_per_day=reads_per_day, significant=False,
                     statements=statements, note=note)
    shown = write_cost_record(cost, saved)
    assert shown is not None
    return {**shown, "writes": list(writes)}


def test_the_report_says_whether_the_consensus_weighed_the_tasks_figure() -> None:
    weighed = record()
    assert consensus_weighed(weighed)
    assert in_task_words(weighed) == ("in its task's fork: 0.0200 ms more per write, 240.0 ms a day "
                                      "(2 write statement(s), within the noise); the consensus weighed it "
                                      "against 5.0 s a day saved on the reads")
    # as afs.consensus.measured_write_cost: no write replayed, or a rate a day unknown → the ratio
    for unweighed, why in ((record(ms_per_day=None), "no rate a day for the writes"),
                           (record(saved=None), "no rate a day for the reads")):
        assert not consensus_weighed(unweighed)
        said = in_task_words(unweighed)
        assert said.endswith(f"the consensus used the source's writes per read instead ({why})")
    none = record(statements=0, note="2 write(s) not replayed: the measuring budget ran out")
    assert not consensus_weighed(none) and "replayed no write" in in_task_words(none)
    assert "budget ran out" in in_task_words(none)

    batch = {"ms_per_write": 0.03, "ms_per_day": 360.0, "writes_per_day": 12_000.0, "significant": True}
    doc = {"statements": [
        {"queryid": 1, "write_cost": batch, "net_ms_saved_per_day": 4640.0,
         "winner": {"write_cost_in_task": weighed}},
        {"queryid": 2, "winner": {"write_cost_in_task": record(saved=None)}},  # the batch measured none
        {"queryid": 3, "write_cost": {**batch, "source": "task"}, "winner": {}}]}
    lines = workload_lines(doc)
    first = lines.index(next(line for line in lines if line.startswith("- winner of 1: 0.0300 ms more")))
    below = lines[first + 1]
    assert below.startswith("  - in its task's fork: 0.0200 ms") and "weighed it" in below
    assert "- winner of 2: not replayed by the batch" in lines
    assert any(line.startswith("- winner of 3:") and "not replayed again" in line for line in lines)


def doc_of(*entries: dict[str, Any], indexes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    one_each = [{"sql": e["winner"]["sql_commands"][0], "statements": [e["queryid"]], "replaces": []}
                for e in entries]
    return {"statements": list(entries), "indexes": one_each if indexes is None else indexes}


def entry(queryid: int, commands: list[str], in_task: dict[str, Any] | None, status: str = "completed"
          ) -> dict[str, Any]:
    return {"queryid": queryid, "status": status,
            "winner": {"sql_commands": commands, "write_cost_in_task": in_task}}


def test_only_a_single_index_winners_complete_figure_is_offered() -> None:
    offered = task_offers(doc_of(entry(1, [SQL], record())))
    assert list(offered) == [SQL]
    for refused in (entry(1, [SQL], record(), status="reused"),  # measured by an earlier batch
                    entry(1, [SQL, "CREATE INDEX ON orders (status)"], record()),  # two indexes together
                    entry(1, [SQL], record(note="1 write(s) not replayed: the measuring budget ran out")),
                    entry(1, [SQL], record(statements=0)),
                    entry(1, [SQL], record(writes=())),
                    entry(1, [SQL], None)):
        assert task_offers(doc_of(refused)) == {}
    # a merged index (serving two statements, or standing in for another) is the batch's to replay
    assert task_offers(doc_of(entry(1, [SQL], record()), indexes=[
        {"sql": SQL, "statements": [1, 2], "replaces": []}])) == {}
    assert task_offers(doc_of(entry(1, [SQL], record()), indexes=[
        {"sql": SQL, "statements": [1], "replaces": ["CREATE INDEX ON orders (user_id) WHERE true"]}])) == {}


def test_the_tasks_figure_stands_only_for_the_same_writes() -> None:
    offer = record(writes=(INSERT, UPDATE, OTHER))  # given three, replayed the two on orders
    figure = task_figure(offer, [UPDATE, INSERT])
    assert figure is not None and figure["source"] == "task" and figure["writes"] == 2
    assert (figure["ms_per_day"], figure["ms_per_write"], figure["writes_per_day"]) == (240.0, 0.02, 12_000.0)
    assert task_figure(offer, [INSERT]) is None  # the batch has fewer writes than the task replayed
    three = record(statements=3, writes=(INSERT, UPDATE, OTHER))
    assert task_figure(three, [INSERT, UPDATE, "DELETE FROM orders"]) is None  # one the task was not given
    assert task_figure(offer, []) is None
    both = combined_cost([figure, {"ms_per_write": 0.01, "ms_per_day": 1.0, "writes_per_day": 5.0,
                                   "significant": False, "measured": [], "source": "batch"}])
    assert both["source"] == "batch + task" and combined_cost([figure])["source"] == "task"
