"""benchmarks/overhead.py --old-python: the slow query's task under two venvs side by side.

Both sides run this checkout's interpreter here (the same code, so one winner); the script runs
each task in a process of its own (benchmarks/task_child.py) and reports both times, their
ratio, both winners and the new task's phases.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from afs.db import open_connection
from afs.sandbox.server import SandboxServer

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
pytestmark = pytest.mark.usefixtures("no_leaked_forks")


async def overhead(*args: str) -> tuple[int, str, str]:
    result = await trio.run_process([sys.executable, str(BENCHMARKS / "overhead.py"), *args],
                                    capture_stdout=True, capture_stderr=True, check=False,
                                    env=dict(os.environ))
    return result.returncode, result.stdout.decode(), result.stderr.decode()


async def test_old_python_side_by_side(sandbox: SandboxServer) -> None:
    code, out, err = await overhead("--json", "--part", "adaptive", "--runs", "3", "--scale", "small",
                                    "--old-python", sys.executable, "--pairs", "1",
                                    "--slow-query", "SELECT o.id FROM orders o WHERE o.user_id = 7")
    assert code == 0, err[-2000:]
    data: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    assert set(data) == {"old_s", "new_s", "ratio_old_vs_new", "same_winner_old", "side_by_side"}
    old, new = data["side_by_side"]
    assert (old["side"], new["side"]) == ("old", "new") and old["pair"] == new["pair"] == 1
    assert old["status"] == new["status"] == "completed"
    assert old["afs"] == new["afs"] == str(BENCHMARKS.parent)  # the child imported this checkout's afs
    assert old["winner_sql"] == new["winner_sql"] and data["same_winner_old"] is True
    assert old["task_s"] > 0 and new["task_s"] > 0
    # the ratio of the sums as measured; old_s and new_s are printed to 0.01 s (tasks of a
    # fraction of a second here), the ratio to 0.001
    ratio = data["old_s"] / data["new_s"]
    slack = ratio * (0.005 / data["old_s"] + 0.005 / data["new_s"]) + 0.0005
    assert data["ratio_old_vs_new"] == pytest.approx(ratio, abs=slack)
    # the phases come from the task's own events: every agent went through its fork and was done
    assert new["phases"] and all({"fork", "done"} <= set(p) for p in new["phases"].values())
    assert "ratio_old_vs_new" in out and "new task's phases" in out
    # where each side's query time went: its costliest statements, costliest first (which ones
    # depends on the machine: at this scale the query as given takes microseconds, and the
    # task's own lookups of statistics may cost more)
    assert all(t["statements"] and all(s["calls"] >= 1 for s in t["statements"]) for t in (old, new))
    assert all([s["s"] for s in t["statements"]] == sorted((s["s"] for s in t["statements"]),
                                                                  reverse=True) for t in (old, new))
    async with open_connection(sandbox.dsn()) as conn:  # the extension it made for itself is gone
        assert not await conn.fetchval("SELECT 1 FROM pg_extension WHERE extname = 'pg_stat_statements'")
    assert sandbox.status().running


async def test_old_python_refusals() -> None:
    code, _, err = await overhead("--old-python", "/nonexistent/python")
    assert code == 2 and "not an executable interpreter: /nonexistent/python" in err
    code, _, err = await overhead("--old-python", sys.executable, "--previous")
    assert code == 2 and "--old-python and --previous" in err
