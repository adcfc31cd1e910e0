"""The query read once (afs/query): one pglast walker that a deep query cannot overflow, one
column resolver that keys a quoted mixed-case table as the catalog does, and a task that
reads its query with sqlglot a handful of times, not once per agent, candidate and rule."""

from __future__ import annotations

import sys

import pglast

from afs.batch.statements import relations
from afs.query.text import walk


def test_the_pglast_walker_is_iterative() -> None:
    """A walker that recursed would need several frames per level: with the stack kept short,
    relations() of a deeply nested statement still answers."""
    statement = "SELECT id FROM orders WHERE id IN (SELECT user_id FROM payments UNION SELECT 1)"
    deep = "SELECT 1 FROM orders WHERE " + "NOT " * 400 + "true"
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 2000))  # pglast's own parse_sql builds the tree recursively
    try:
        tree = pglast.parse_sql(deep)
    finally:
        sys.setrecursionlimit(limit)
    depth = 0
    frame = sys._getframe()
    while frame is not None:
        depth, frame = depth + 1, frame.f_back
    sys.setrecursionlimit(depth + 60)
    try:
        assert sum(1 for _ in walk(tree)) > 400
        assert relations(deep) == ["orders"]
    finally:
        sys.setrecursionlimit(limit)
    assert relations(statement) == ["orders", "payments"]
