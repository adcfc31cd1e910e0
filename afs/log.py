"""Logging, configured once by the CLI.

structlog over the standard library: events go to stderr (human-readable on a
terminal, JSON lines otherwise; warnings and up unless --verbose) and to
`$AFS_HOME/logs/afs.log` as JSON lines. stdout stays free for results (and for
the MCP protocol in `afs mcp serve`). Per-task fields (task_id, agent, fork) are
bound with structlog.contextvars and reach worker threads.
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


def configure(log_dir: Path | None, verbose: bool = False, stderr_json: bool | None = None) -> None:
    if stderr_json is None:
        stderr_json = not sys.stderr.isatty()
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

    handler_for(logging.StreamHandler(sys.stderr), stderr_json,
                logging.INFO if verbose else logging.WARNING)
    if log_dir is not None:
        try:
            log_dir.mkdir(parents=True, exist_ok=True)
            handler_for(logging.FileHandler(log_dir / "afs.log", encoding="utf-8"), True, logging.INFO)
        except OSError:
            pass  # a read-only home must not stop the command
    for noisy in ("httpx", "httpcore", "mcp", "anyio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    structlog.configure(
        processors=[*_SHARED, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
