"""One pglast walker (issue 24): every reader of PostgreSQL's syntax trees walks them with
`afs.query.text.walk`, iteratively and in the order of the text.

The server-version rules of the Gemini brain (`afs.brains.gemini.syntax.too_new`) read the
same tree as the validator: every node, typed fields included (a UNION's arms, a WITH
clause), and a proposal nested as deep as PostgreSQL parses does not exhaust Python's stack.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from afs.brains.gemini.syntax import RULES, too_new

PACKAGE = Path(__file__).resolve().parent.parent / "afs"

# one statement per rule of `too_new`: (first major version, what, SQL that uses it)
EXAMPLES = [
    (10, "declarative partitioning", "CREATE TABLE p (a int) PARTITION BY RANGE (a)"),
    (10, "CREATE STATISTICS", "CREATE STATISTICS s (ndistinct) ON a, b FROM t"),
    (11, "hash partitioning", "CREATE TABLE p (a int) PARTITION BY HASH (a)"),
    (11, "INCLUDE columns in an index", "CREATE INDEX ON t (a) INCLUDE (b)"),
    (12, "most-common-value (mcv) extended statistics", "CREATE STATISTICS s (mcv) ON a, b FROM t"),
    (12, "generated columns", "CREATE TABLE g (a int, b int GENERATED ALWAYS AS (a * 2) STORED)"),
    (12, "REINDEX CONCURRENTLY", "REINDEX INDEX CONCURRENTLY i"),
    (13, "FETCH FIRST … WITH TIES", "SELECT a FROM t ORDER BY a FETCH FIRST 1 ROWS WITH TIES"),
    (13, "the deduplicate_items index option", "CREATE INDEX ON t (a) WITH (deduplicate_items = off)"),
    (14, "GROUP BY DISTINCT", "SELECT a FROM t GROUP BY DISTINCT a"),
    (14, "SEARCH or CYCLE in a recursive query",
     "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SEARCH DEPTH FIRST BY n SET o "
     "SELECT * FROM r"),
    (14, "BRIN minmax-multi and bloom operator classes",
     "CREATE INDEX ON t USING brin (a int4_minmax_multi_ops)"),
    (15, "NULLS NOT DISTINCT", "CREATE UNIQUE INDEX ON t (a) NULLS NOT DISTINCT"),
    (15, "MERGE", "MERGE INTO t USING s ON t.a = s.a WHEN MATCHED THEN DELETE"),
    (16, "any_value()", "SELECT any_value(a) FROM t"),
    (17, "JSON_TABLE", "SELECT * FROM JSON_TABLE('[]'::jsonb, '$[*]' COLUMNS (a int PATH '$.a')) j"),
    (18, "uuidv7()", "SELECT uuidv7()"),
]


def test_every_rule_has_an_example() -> None:
    assert sorted((since, what) for since, what, _ in RULES) == sorted((s, w) for s, w, _ in EXAMPLES)


@pytest.mark.parametrize(("since", "what", "sql"), EXAMPLES, ids=[w for _, w, _ in EXAMPLES])
def test_each_rule_is_found_before_its_release_and_not_from_it(since: int, what: str, sql: str) -> None:
    assert f"{what} (PostgreSQL {since})" in too_new([sql], since - 1)
    assert f"{what} (PostgreSQL {since})" not in too_new([sql], since)


def test_a_rule_in_a_typed_field_is_found() -> None:
    """A UNION's arms are typed fields (SelectStmt *larg, *rarg): the JSON tree did not name
    them, and GROUP BY DISTINCT in the first arm went unseen."""
    sql = "SELECT a FROM t GROUP BY DISTINCT a UNION SELECT 1"
    assert too_new([sql], 13) == ["GROUP BY DISTINCT (PostgreSQL 14)"]


def test_a_deep_proposal_is_read_without_recursing() -> None:
    """600 nested additions in an index expression: PostgreSQL parses them, and so must the
    check (the recursive reading raised RecursionError)."""
    depth = 600
    sql = "CREATE INDEX ON t ((" + "1 + (" * depth + "a" + ")" * depth + ")) NULLS NOT DISTINCT"
    assert too_new([sql], 14) == ["NULLS NOT DISTINCT (PostgreSQL 15)"]


# what `grep -rn "def .*walk|def _nodes|def _children" afs` may find: the one pglast walker,
# and the walker over EXPLAIN's JSON plans (a plan, not a syntax tree)
WALKERS = {("query/text.py", "walk"), ("query/text.py", "walk_depth"), ("pg/plan.py", "_walk")}


def test_afs_has_one_pglast_walker() -> None:
    found = {(str(path.relative_to(PACKAGE)), match[1])
             for path in PACKAGE.rglob("*.py")
             for match in re.finditer(r"^\s*def (\w*walk\w*|_nodes|_children)\b",
                                      path.read_text(), re.MULTILINE)}
    assert found == WALKERS
