"""The workload's writes a task is given (StatementParameters.workload): afs.task.check_workload,
and what the fork's replays add up to (afs.replay.measured_cost, new_index_names). Pure."""

from __future__ import annotations

import dataclasses

import pytest

from afs.errors import InputError
from afs.models import (
    EstimatedImpact,
    OptimizationProposal,
    ParameterSet,
    StatementParameters,
    Timing,
    WorkloadWrite,
    WriteWorkload,
)
from afs.replay import Replayed, WorkStatement, measured_cost, new_index_names
from afs.store.codec import decode, encode
from afs.task import MAX_WORKLOAD_WRITES, check_workload, check_write

INSERT = WorkloadWrite("INSERT INTO orders (user_id, status) VALUES ($1, $2)",
                       "INSERT INTO orders (user_id, status) VALUES (7, 'new')", "orders", 120, 3600.0,
                       ((1, "7"), (2, "'new'")))


def test_a_valid_workload_passes_and_travels_through_the_store_codec() -> None:
    workload = WriteWorkload((INSERT,), reads_per_day=42.0)
    assert check_workload(workload, ("orders", "users")) is workload
    assert check_workload(None, ("orders",)) is None
    params = StatementParameters("SELECT 1 FROM orders WHERE id = $1", (), workload)
    assert decode(StatementParameters, encode(params)) == params
    assert decode(StatementParameters, {"statement": "x", "sets": []}).workload is None  # older rows


@pytest.mark.parametrize(("write", "words"), [
    (dataclasses.replace(INSERT, query="SELECT * FROM orders"), "one INSERT, UPDATE or DELETE"),
    (dataclasses.replace(INSERT, query="WITH x AS (SELECT 1) DELETE FROM orders"), "WITH"),
    (dataclasses.replace(INSERT, query="DELETE FROM orders; DROP TABLE orders"), "several statements"),
    (dataclasses.replace(INSERT, query="UPDATE orders SET note = pg_read_file('/etc/x')"), "pg_read_file"),
    (dataclasses.replace(INSERT, query="DELETE FROM pg_catalog.pg_class"), "system"),
    (dataclasses.replace(INSERT, query="DELETE FROM payments", statement="DELETE FROM payments",
                         table="payments"),
     "does not read"),
    (dataclasses.replace(INSERT, statement="DELETE FROM users WHERE id = $1"), "different tables"),
    (dataclasses.replace(INSERT, values=((1, "7); DROP TABLE orders; --"), (2, "'a'"))),
     "several statements"),
    (dataclasses.replace(INSERT, values=((1, "7"),)), "fill no $2"),
    (dataclasses.replace(INSERT, table="users"), "its table is 'users'"),
    (dataclasses.replace(INSERT, calls=-1), "calls"),
    (dataclasses.replace(INSERT, per_day=float("inf")), "per_day"),
    (dataclasses.replace(INSERT, query="DELETE FROM orders WHERE note = '\0'"), "NUL"),
])
def test_a_bad_write_is_refused_naming_it(write: WorkloadWrite, words: str) -> None:
    with pytest.raises(InputError, match="workload write 1") as caught:
        check_workload(WriteWorkload((write,)), ("orders", "users"))
    assert words in str(caught.value)


def test_the_workload_is_bounded_and_its_rate_checked() -> None:
    with pytest.raises(InputError, match=f"at most {MAX_WORKLOAD_WRITES}"):
        check_workload(WriteWorkload((INSERT,) * (MAX_WORKLOAD_WRITES + 1)), ("orders",))
    with pytest.raises(InputError, match="reads_per_day"):
        check_workload(WriteWorkload((INSERT,), reads_per_day=-1.0), ("orders",))
    assert check_write('UPDATE "Shop".items SET a = $1') == '"Shop".items'


def _replayed(statement: str, calls: int, with_ms: float, without_ms: float, significant: bool) -> Replayed:
    work = WorkStatement(None, statement, statement, "write", "orders", calls, 0.0)
    t = lambda ms: Timing(ms, 0.0, 7, 0)  # noqa: E731
    return Replayed(work, t(with_ms), t(without_ms), True, significant, 10, paired_ms=without_ms - with_ms)


def test_the_measured_cost_adds_each_write_at_its_own_rate() -> None:
    a = _replayed("INSERT a", 30, 0.05, 0.03, True)  # 0.02 ms more with the index
    b = _replayed("UPDATE b", 10, 0.10, 0.09, False)  # 0.01 ms more
    untimed = Replayed(WorkStatement(None, "DELETE c", "DELETE c", "write", "orders", 99, 0.0),
                       None, None, False, False, 0, "not replayed in the fork: boom")
    cost = measured_cost([(a, 1000.0), (b, 100.0), (untimed, 5.0)], reads_per_day=50.0, note="n")
    assert cost.statements == 2 and cost.significant and cost.note == "n" and cost.reads_per_day == 50.0
    assert cost.ms_per_write == pytest.approx((0.02 * 30 + 0.01 * 10) / 40)
    assert cost.writes_per_day == 1100.0 and cost.ms_per_day == pytest.approx(0.02 * 1000 + 0.01 * 100)
    unknown = measured_cost([(a, None), (b, 100.0)], reads_per_day=None)
    assert unknown.ms_per_day is None and unknown.writes_per_day is None and unknown.ms_per_write > 0


def test_only_the_indexes_a_proposal_names_can_be_dropped_by_name() -> None:
    proposal = OptimizationProposal(
        agent="a", proposal_type="index", rationale="", rollback_commands=(),
        estimated_impact=EstimatedImpact(1.0, 1.0, "low", "low"),
        sql_commands=("CREATE INDEX ix_status ON public.orders (status)", "CREATE INDEX ON orders (note)"))
    assert new_index_names(proposal) == {"public.ix_status": "public.orders"}


def test_the_api_checks_a_submitted_workload_and_takes_a_good_one() -> None:
    from afs.service.api import FieldError, parse_parameters

    query = "SELECT id FROM orders WHERE user_id = 7"
    params = StatementParameters("SELECT id FROM orders WHERE user_id = $1",
                                 (ParameterSet("user_id = 7", query=query),),
                                 WriteWorkload((INSERT,), reads_per_day=10.0))
    assert parse_parameters(encode(params), query).workload == params.workload
    dropping = dataclasses.replace(INSERT, query="DROP TABLE orders")
    bad = dataclasses.replace(params, workload=WriteWorkload((dropping,)))
    with pytest.raises(FieldError, match="workload write 1") as caught:
        parse_parameters(encode(bad), query)
    assert caught.value.field == "parameters"
