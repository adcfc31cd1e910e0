"""Logging, configured once by the CLI.

structlog over the standard library: events go to `$AFS_HOME/logs/afs.log` as JSON
lines, and to stderr: with --verbose from info up (human-readable on a terminal, JSON
lines otherwise); without, on a terminal only errors (a person reads the command's own
lines there, `afs: error: …` the one that says what went wrong: the warnings before it
stay in the file, and `held_back()` counts them), elsewhere warnings and up as JSON
lines (a script or a service manager collects them). A long-running command
(`keep_warnings`: afs serve, afs worker) shows its warnings on a terminal too. stdout
stays free for results (and for the MCP protocol in `afs mcp serve`). Per-task fields
(task_id, agent, fork) are bound with structlog.contextvars and reach worker threads.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import structlog

_SHARED: list[Any] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]


class _HeldBack(logging.Handler):
    """Counts the warnings the terminal was not shown (they are in the log file)."""

    def __init__(self, below: int) -> None:
        super().__init__(logging.WARNING)
        self.below = below
        self.count = 0
        self.file: Path | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno < self.below:
            self.count += 1


_held = _HeldBack(logging.WARNING)


def held_back() -> tuple[int, Path | None]:
    """How many warnings this command kept from the terminal, and the log file that has them."""
    return _held.count, _held.file


def configure(log_dir: Path | None, verbose: bool = False, stderr_json: bool | None = None,
              keep_warnings: bool = False) -> None:
    terminal = sys.stderr.isatty()
    if stderr_json is None:
        stderr_json = not terminal
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()
    root.setLevel(logging.INFO)

    def handler_for(stream_handler: logging.Handler, json_lines: bool, level: int) -> None:
        renderers: list[Any] = (
            [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
            if json_lines else [structlog.dev.ConsoleRenderer(colors=False)]
        )
        stream_handler.setFormatter(structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=_SHARED,
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *renderers],
        ))
        stream_handler.setLevel(level)
        root.addHandler(stream_handler)

    shown = (logging.INFO if verbose else
             logging.ERROR if terminal and not keep_warnings else logging.WARNING)
    handler_for(logging.StreamHandler(sys.stderr), stderr_json, shown)
    global _held
    _held = _HeldBack(shown)
    if log_dir is not None:
        try:
            log_dir.mkdir(parents=True, exist_ok=True)
            handler_for(logging.FileHandler(log_dir / "afs.log", encoding="utf-8"), True, logging.INFO)
            _held.file = log_dir / "afs.log"
        except OSError:
            pass  # a read-only home must not stop the command
    root.addHandler(_held)
    for noisy in ("httpx", "httpcore", "mcp", "anyio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    structlog.configure(
        processors=[*_SHARED, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
