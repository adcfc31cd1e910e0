"""The router's per-agent capacity across every worker on one store.

`StorePool` stands in for the in-process `afs.optimize.AgentPool`: the load an
agent carries is the number of running tasks (with a live lease) it is assigned
to, on any worker; routing and recording the assignment happen under one lock in
the store, so two workers never both take an agent's last slot. A task that must
wait emits `waiting_for_agents` (visible in its events) and looks again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import trio

from afs.models import AgentKey, RoutingDecision
from afs.optimize import AgentPool
from afs.store import Store

RECHECK_S = 0.5  # another worker's release is not signalled: look again this often


class StorePool(AgentPool):
    def __init__(self, store: Store) -> None:
        super().__init__()
        self.store = store

    async def acquire(self, task_id: str,
                      choose: Callable[[Mapping[AgentKey, int]], RoutingDecision]) -> RoutingDecision:
        return await self.store.acquire_agents(task_id, choose)

    async def release(self, task_id: str, agents: Sequence[AgentKey]) -> None:
        await self.store.release_agents(task_id, agents)
        await super().release(task_id, ())  # wakes this worker's waiting tasks at once

    async def wait_for_change(self) -> None:
        with trio.move_on_after(RECHECK_S):
            await super().wait_for_change()
