"""Choosing who thinks: the provider named on the command line or in a task; and the name a
person reads for an agent (`agent_label`): its role and the brain that answered, never the
seed's model name (the agent keys stay the stable identifiers in routing files and JSON)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, get_args

from afs.brains import Squad, StrategistBrain
from afs.config import Settings
from afs.errors import ConfigError
from afs.models import AGENTS, Provider

PROVIDERS: tuple[str, ...] = get_args(Provider)


@asynccontextmanager
async def open_squad(provider: str, settings: Settings, env: Mapping[str, str]) -> AsyncIterator[Squad]:
    """The brains: `heuristic` (offline strategists), `gemini`, or `auto` (Gemini if credentials are set)."""
    if provider != "heuristic":
        from afs.brains.gemini.client import NO_CREDENTIALS, gemini_credentials

        credentials = gemini_credentials(env)
        if credentials is not None:
            from afs.brains.gemini.brain import open_gemini_squad

            async with open_gemini_squad(settings, credentials, env) as squad:
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


def agent_label(agent: str, usage: Mapping[str, Any] | None = None) -> str:
    """"index design — gemini-3.8-flash, version gemini-3.8-flash-002" for an agent a model
    answered for (`usage`: its entry of the squad's usage, with the version the API named),
    "index design — offline strategist" for one without."""
    spec = AGENTS.get(agent)
    role = spec.specialization.split(":", 1)[0] if spec is not None else agent
    if not usage or not usage.get("model"):
        return f"{role} — offline strategist"
    model, version = str(usage["model"]), usage.get("model_version")
    answered = f"{model}, version {version}" if version and version != model else model
    return f"{role} — {answered}"
