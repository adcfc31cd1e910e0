"""What a batch says to a person (issue 27 item 8): statements faster than the batch's minimum
mean time get no fork and are counted in the report with the reason; a saving that needs the
application's query rewritten is labelled so (the index is not a standalone saving); a rewrite of
a `$n` statement is shown with the statement's parameters next to the values it was measured on."""

from __future__ import annotations

import json
from collections.abc import Iterator

import psycopg
import pytest

from afs.batch.report import Entry, build_report, render_markdown, with_placeholders
from afs.config import Settings
from afs.models import ParameterSet, StatementParameters, Substitution
from afs.sandbox.server import SandboxServer
from afs.testing import run_afs_async

LOOKUP = "SELECT id, status FROM orders WHERE id = {i}"  # a primary-key lookup: well under 1 ms
SCAN = "SELECT count(*) FROM orders o JOIN users u ON u.id = o.user_id WHERE o.total_amount > {a}"


@pytest.fixture
def lookups(sandbox: SandboxServer, settings: Settings) -> Iterator[str]:
    """pg_stat_statements in the demo database with 40 primary-key lookups and one scan (the
    extension dropped afterwards: the demo database is shared by the session)."""
    dsn = sandbox.dsn(settings.demo_database)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute("SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database"
                     " WHERE datname = current_database()), 0)")
        for i in range(1, 41):
            conn.execute(LOOKUP.format(i=i).encode())
        for a in range(3):
            conn.execute(SCAN.format(a=a).encode())
    try:
        yield dsn
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("DROP EXTENSION IF EXISTS pg_stat_statements")


@pytest.mark.usefixtures("no_leaked_forks")
async def test_statements_under_the_minimum_mean_time_get_no_fork_and_the_report_counts_them(
        lookups: str, store_db: str) -> None:
    # the threshold from the setting (AFS_BATCH_MIN_MEAN_MS) and from --min-ms: no statement is over
    # it, so no task runs, and the report says how many were left out and why
    by_setting = await run_afs_async("batch", "--json", AFS_STORE_URL=store_db,
                                     AFS_BATCH_MIN_MEAN_MS="100000")
    assert by_setting.returncode == 0, by_setting.stderr.decode()
    doc = json.loads(by_setting.stdout)
    assert doc["statements"] == [] and doc["options"]["min_mean_ms"] == 100000
    assert doc["below"]["mean_ms"] >= 2 and doc["below"]["min_mean_ms"] == 100000
    text = await run_afs_async("batch", "--min-ms", "100000", AFS_STORE_URL=store_db)
    assert text.returncode == 0, text.stderr.decode()
    out = text.stdout.decode()
    assert "Not optimized:" in out and "faster than 100000 ms on average (--min-ms" in out
    # the default (1 ms): the lookups are below it, the scan is not; only its mean time decides
    default = await run_afs_async("batch", "--json", "--top", "1", "--provider", "heuristic",
                                  "--runs", "1", AFS_STORE_URL=store_db)
    assert default.returncode == 0, default.stderr.decode()
    doc = json.loads(default.stdout)
    assert doc["options"]["min_mean_ms"] == 1.0
    assert [s["calls"] for s in doc["statements"]] == [3]  # the lookups ran 40 times: more in total
    assert all(s["mean_ms"] >= 1.0 for s in doc["statements"])
    assert doc["below"]["mean_ms"] >= 1
    bad = await run_afs_async("batch", "--min-ms", "-1", AFS_STORE_URL=store_db)
    assert bad.returncode == 2 and b"must not be negative" in bad.stderr
    setting = await run_afs_async("batch", AFS_STORE_URL=store_db, AFS_BATCH_MIN_MEAN_MS="fast")
    assert setting.returncode == 2 and b"batch_min_mean_ms" in setting.stderr


def _parameters() -> StatementParameters:
    first = ParameterSet("$1 orders.status = 'pending'; $2 orders.user_id = 42",
                         values={1: "'pending'", 2: "42"},
                         query="SELECT id FROM orders WHERE status = 'pending' AND user_id = 42")
    other = ParameterSet("$1 orders.status = 'shipped'; $2 orders.user_id = 7",
                         (Substitution("orders.status", "'pending'", "'shipped'"),
                          Substitution("orders.user_id", "42", "7")),
                         {1: "'shipped'", 2: "7"},
                         "SELECT id FROM orders WHERE status = 'shipped' AND user_id = 7")
    return StatementParameters("SELECT id FROM orders WHERE status = $1 AND user_id = $2", (first, other))


def test_a_rewrite_of_a_statement_is_shown_with_its_parameters() -> None:
    rewrite = ("SELECT o.id FROM orders o WHERE o.user_id = 42 AND o.status = 'pending'"
               " AND o.total_amount > 42 ORDER BY o.id LIMIT 100")
    # the values of the parameters go back to $n where they are compared with the parameter's column;
    # another 42 (total_amount) and the LIMIT stay as written
    assert with_placeholders(rewrite, _parameters()) == (
        "SELECT o.id FROM orders o WHERE o.user_id = $2 AND o.status = $1"
        " AND o.total_amount > 42 ORDER BY o.id LIMIT 100")
    # two parameters filled with one value: which is which cannot be told, so no guess
    same = StatementParameters("x", (ParameterSet("", values={1: "5", 2: "5"}),))
    assert with_placeholders("SELECT 1 FROM t WHERE a = 5 AND b = 5", same) is None


def test_a_saving_that_needs_a_rewrite_is_labelled_an_application_change() -> None:
    params = _parameters()
    rewrite = "SELECT o.id FROM orders o WHERE o.user_id = 42 AND o.status = 'pending' ORDER BY o.id"
    index = "CREATE INDEX afs_idx_orders_user_status ON orders (user_id, status)"
    entry = Entry(11, params.statement, 50, 5000.0, 100.0, "completed", task_id="t1",
                  filled_query=params.sets[0].query, parameter_sets=[s.label for s in params.sets])
    entry.winner = {"agent": "a", "proposal_type": "rewrite", "sql_commands": [index],
                    "rewritten_query": rewrite, "settings": [], "needs_rewrite": True,
                    "rewritten_statement": with_placeholders(rewrite, params)}
    entry.gain_pct, entry.saved_ms_per_day = 90.0, 4000.0
    alone = Entry(12, "SELECT * FROM orders WHERE user_id = $1", 10, 900.0, 90.0, "completed", task_id="t2")
    alone.winner = {"agent": "b", "proposal_type": "index", "sql_commands": [index], "rewritten_query": None,
                    "settings": [], "needs_rewrite": False, "rewritten_statement": None}
    doc = build_report({"id": "b1", "database": "shop", "created_at": "now", "period_s": 86_400.0,
                        "provider": "heuristic"}, [entry, alone], [])
    [merged] = doc["indexes"]
    assert merged["needs_rewrite"] == [11]  # statement 12's saving is the index's alone
    text = render_markdown(doc)
    assert "needs an application change: for 11 the saving comes with the query's rewrite" in text
    assert "a: rewrite (needs an application change)" in text and "b: index |" in text
    assert ("rewrite, with the statement's parameters: `SELECT o.id FROM orders o WHERE o.user_id = $2"
            " AND o.status = $1 ORDER BY o.id`") in text
    assert f"measured filled in as: `{rewrite}`" in text
