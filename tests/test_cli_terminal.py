"""What a person sees at a terminal (issue 27 item 9): no log line before `afs: error: …` (the
warnings are in the log file, and the error says so), a rollback that says its statements once,
and `afs batch --server` progress that names each task's phase."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import trio
from test_apply import indexes, stored, target  # noqa: F401 (target: a fixture)
from test_batch_readable import lookups  # noqa: F401 (a fixture)

from afs.config import Settings
from afs.serve import run_service
from afs.store import open_store
from afs.testing import afs_command, afs_environment, run_afs, run_afs_async

WARN_THEN_FAIL = """
import argparse, pathlib, sys
import structlog
from afs import log
from afs.cli.output import failed
log.configure(pathlib.Path(sys.argv[1]))
structlog.get_logger("afs.t").warning("something_odd", table="orders")
sys.exit(failed(argparse.Namespace(json=False), "it broke", 1, "AfsError"))
"""


def on_a_terminal(command: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run `command` with stdout and stderr on a pseudo-terminal, as a person runs it."""
    main_fd, terminal_fd = pty.openpty()
    try:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=terminal_fd, stderr=terminal_fd,
                                env=env, cwd=Path(__file__).parent.parent)
        os.close(terminal_fd)
        chunks = []
        while True:
            try:
                chunk = os.read(main_fd, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        code = proc.wait(timeout=120)
    finally:
        os.close(main_fd)
    text = b"".join(chunks).decode(errors="replace")  # a progress line is cleared in place: not a line
    return code, text.replace("\r\n", "\n").replace("\r", "").replace("\x1b[K", "")


def test_on_a_terminal_the_error_is_the_one_line_and_the_warnings_stay_in_the_log(tmp_path: Path) -> None:
    env = afs_environment()
    code, seen = on_a_terminal([sys.executable, "-c", WARN_THEN_FAIL, str(tmp_path)], env)
    assert code == 1
    assert "something_odd" not in seen and "{" not in seen, seen  # no log line, JSON or not
    assert seen.splitlines()[0] == "afs: error: it broke"
    assert f"1 warning(s) before it are in {tmp_path / 'afs.log'}" in seen
    assert json.loads((tmp_path / "afs.log").read_text().splitlines()[0])["event"] == "something_odd"
    # elsewhere (a pipe: a script, a service manager) the warning is a JSON line on stderr
    piped = subprocess.run([sys.executable, "-c", WARN_THEN_FAIL, str(tmp_path)], capture_output=True,
                           text=True, env=env, timeout=120)
    assert json.loads(piped.stderr.splitlines()[0])["event"] == "something_odd"
    assert "afs: error: it broke" in piped.stderr and "warning(s) before it" not in piped.stderr
    # the command line itself: one line, the error
    code, seen = on_a_terminal(afs_command("batch", "show", "nosuch"), env)
    assert code == 2 and seen.splitlines()[-1].endswith(
        "afs: error: no batch nosuch in the store (see the reports in $AFS_HOME/reports/)"), seen


def test_a_rollback_says_its_statements_once(store_db: str, target: str) -> None:  # noqa: F811
    async def setup() -> str:
        async with open_store(store_db) as s:
            return await stored(s, ("CREATE INDEX ix_once ON orders (user_id)",))

    task_id = trio.run(setup)
    env = {**os.environ, "AFS_STORE_URL": store_db}
    run_afs("apply", task_id, "--dsn", target, "--yes", "--approver", "me", env=env, check=True)
    assert "ix_once" in indexes(target)
    done = run_afs("rollback", task_id, "--dsn", target, "--yes", "--approver", "me", env=env, text=True)
    assert done.returncode == 0, done.stderr
    assert "ix_once" not in indexes(target)
    said = done.stdout + done.stderr
    assert said.count("DROP INDEX") == 1, said  # the plan; not again as progress or as the result
    assert "rolled_back: 1 statement(s) above run" in done.stdout


@pytest.mark.usefixtures("no_leaked_forks", "lookups")
async def test_batch_with_server_progress_names_each_tasks_phase(nursery: trio.Nursery, settings: Settings,
                                                                 store_db: str) -> None:
    configured = settings.with_(store_url=store_db)
    urls: list[str] = await nursery.start(partial(run_service, configured, bind="127.0.0.1:0", workers=1,
                                                  lease_s=5))
    url = next(u for u in urls if u.startswith("http://127.0.0.1"))
    done = await run_afs_async("batch", "--server", url, "--top", "1", "--provider", "heuristic",
                               "--runs", "1", "--json", AFS_STORE_URL=store_db)
    assert done.returncode == 0, done.stderr.decode()
    [statement] = json.loads(done.stdout)["statements"]
    progress = done.stderr.decode()
    task = statement["task_id"]
    # each line: the statement, its task, the agent and its phase (not only "agent_phase")
    prefix = f"task {task}, statement 1/1 ({statement['queryid']}): "
    lines = [line for line in progress.splitlines() if prefix in line]
    assert any(line.endswith(": fork") for line in lines), progress  # an agent's first phase
    assert any(line.endswith(": propose") for line in lines), progress
    assert lines[-1].endswith(f": {statement['status']}") and "agent_phase" not in progress
