"""Task events: what happened, to which agent, in which fork, how long it took.

One `Event` per fact (agents_assigned, fork_created, analysis_completed,
proposal_submitted, benchmark_completed, agent_failed, consensus_reached, and
the progress phases of each agent). An `Emitter` hands each event to its sinks:
the structured log always, the live terminal display when there is one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

log = structlog.get_logger("afs.events")


@dataclass(frozen=True)
class Event:
    kind: str
    task_id: str
    agent: str | None = None
    fork: str | None = None
    duration_s: float | None = None
    data: Mapping[str, Any] = field(default_factory=dict)


Sink = Callable[[Event], None]


def log_sink(event: Event) -> None:
    fields: dict[str, Any] = {
        k: v for k, v in (("agent", event.agent), ("fork", event.fork)) if v is not None}
    if event.duration_s is not None:
        fields["duration_s"] = round(event.duration_s, 3)
    level = log.warning if event.kind in ("agent_failed", "task_failed") else log.info
    level(event.kind, task_id=event.task_id, **fields, **dict(event.data))


class Emitter:
    def __init__(self, task_id: str, sinks: tuple[Sink, ...] = (log_sink,)) -> None:
        self.task_id = task_id
        self.sinks = sinks
        self.history: list[Event] = []

    def emit(self, kind: str, *, agent: str | None = None, fork: str | None = None,
             duration_s: float | None = None, **data: Any) -> None:
        event = Event(kind, self.task_id, agent, fork, duration_s, data)
        self.history.append(event)
        for sink in self.sinks:
            sink(event)
