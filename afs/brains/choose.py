"""Choosing who thinks: the provider named on the command line or in a task. The name a person
reads for an agent (its role and the brain that answered) is `afs.report.agent_label`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, get_args

from afs.brains import Squad, StrategistBrain
from afs.config import Settings
from afs.errors import ConfigError
from afs.models import Provider

PROVIDERS: tuple[str, ...] = get_args(Provider)


@asynccontextmanager
async def open_squad(provider: str, settings: Settings, env: Mapping[str, str],
                     meter: Any = None) -> AsyncIterator[Squad]:
    """The brains: `heuristic` (offline strategists), `gemini`, or `auto` (Gemini if credentials are set).
    `meter`: a SpendMeter shared with other squads (a batch's one cap), else the squad's own."""
    if provider != "heuristic":
        from afs.brains.gemini.client import NO_CREDENTIALS, gemini_credentials

        credentials = gemini_credentials(env)
        if credentials is not None:
            from afs.brains.gemini.brain import open_gemini_squad

            async with open_gemini_squad(settings, credentials, env, meter=meter) as squad:
                yield squad
            return
        if provider == "gemini":
            raise ConfigError(f"--provider gemini: {NO_CREDENTIALS}")
    brain = StrategistBrain()
    note = ("no Gemini credentials: the offline strategists ran" if provider == "auto"
            else "offline strategists, as asked")
    yield Squad(brain_for=lambda _agent: brain, provider="heuristic", note=note)


async def check_provider(provider: str, settings: Settings, env: Mapping[str, str]) -> None:
    """Open and close the squad: credentials and every configured model are checked (a retired
    model fails here, naming the setting to change) before a sandbox or a fork exists."""
    async with open_squad(provider, settings, env):
        pass

