"""Live per-agent progress on the terminal (stderr).

On a terminal: one line per agent (phase, elapsed), redrawn in place twice a
second. Elsewhere: one line per event, as it happens.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TextIO

import trio

from afs.events import Event

_SHOWN = {"agents_assigned", "fork_created", "analysis_completed", "proposal_submitted",
          "proposal_rejected", "benchmark_completed", "agent_failed", "consensus_reached",
          "waiting_for_agents", "task_failed"}


class LiveDisplay:
    def __init__(self, stream: TextIO = sys.stderr, live: bool | None = None) -> None:
        self.stream = stream
        self.live = stream.isatty() if live is None else live
        self.agents: dict[str, tuple[str, float]] = {}  # agent -> (phase, started)
        self.started = 0.0
        self._drawn = 0

    def sink(self, event: Event) -> None:
        now = trio.current_time()
        if event.kind == "agents_assigned":
            self.started = now
            for agent in event.data.get("agents", []):
                self.agents[agent] = ("starting", now)
        elif event.agent and event.kind == "agent_phase":
            self.agents[event.agent] = (str(event.data.get("phase")), self.agents.get(
                event.agent, ("", now))[1])
        elif event.agent and event.kind == "agent_failed":
            self.agents[event.agent] = (f"failed: {event.data.get('error')}", self.agents.get(
                event.agent, ("", now))[1])
        if not self.live and event.kind in _SHOWN:
            detail = " ".join(f"{k}={v}" for k, v in event.data.items()
                              if k in ("phase", "proposal_type", "average_improvement_pct",
                                       "error", "winner", "agents"))
            who = f" {event.agent}" if event.agent else ""
            print(f"[{event.kind}]{who} {detail}".rstrip(), file=self.stream, flush=True)

    def draw(self) -> None:
        now = trio.current_time()
        lines = [f"  {agent:<14} {phase[:70]:<70} {now - start:6.1f} s"
                 for agent, (phase, start) in self.agents.items()]
        if self._drawn:
            self.stream.write(f"\033[{self._drawn}F")
        for line in lines:
            self.stream.write(f"\033[K{line}\n")
        self.stream.flush()
        self._drawn = len(lines)

    def clear(self) -> None:
        if self._drawn:
            self.stream.write(f"\033[{self._drawn}F\033[J")
            self.stream.flush()
            self._drawn = 0

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        if not self.live:
            yield
            return
        async with trio.open_nursery() as nursery:
            async def redraw() -> None:
                while True:
                    self.draw()
                    await trio.sleep(0.5)
            nursery.start_soon(redraw)
            try:
                yield
            finally:
                nursery.cancel_scope.cancel()
                self.clear()
