"""The Gemini API under trio: credentials, the client, one JSON call with retries, usage, cost.

* `gemini_credentials(env)` reads the variables the SDK reads, as google-genai's
  `BaseApiClient.__init__` (`_api_client.py`, 3.6.1) reads them: `GOOGLE_GENAI_USE_ENTERPRISE`
  wins over the older `GOOGLE_GENAI_USE_VERTEXAI` ("true" or "1" is on, anything else off);
  on, it is Vertex AI / the Agent Platform, where `GOOGLE_CLOUD_PROJECT` or
  `GOOGLE_CLOUD_LOCATION` wins over an API key (application default credentials, which may
  name the project), and an API key alone is express mode; off, `GOOGLE_API_KEY` then
  `GEMINI_API_KEY` (the Gemini API). `AFS_GEMINI_BASE_URL` overrides the endpoint (tests,
  proxies).
* `open_gemini_client(credentials)` makes the SDK's async client on an
  `httpx.AsyncClient` (the SDK's default async transport needs asyncio).
* `GeminiClient.generate_json` makes one call with the model's generation
  settings (`afs.config.ModelSettings`: thinking level or budget, temperature,
  max_output_tokens) and our own retry loop (the SDK's ignores Retry-After):
  429, 5xx, timeouts and connection failures are retried after a full-jitter
  wait of up to 1, 2, 4 s (or the server's Retry-After), at most 4 attempts, a
  timed-out call once only; other 4xx fail at once with a message a person can
  act on. An answer cut at max_output_tokens, stopped by a safety filter, or a
  blocked prompt fails at once too: the same request would stop the same way, and so
  does a 429 whose QuotaFailure detail gives a quota of 0 (the model has no quota on the
  key's tier: it needs billing; waiting does not help). Requests to the Gemini API carry
  `store: false` (the SDK refuses the field on Vertex AI). `CallStats` counts every
  attempt, failed or timed out, its tokens, its estimated cost, and the model version and
  stage the API says answered (`modelVersion`, `modelStatus`). A `SpendMeter` is checked
  before every attempt: once its cap is reached no call is made.
* `GeminiClient.check_model` is `models.get`: does the model exist (before any fork).
* `estimate_cost` prices the usage with the list prices in effect on the day (cached
  tokens at their own price): an estimate, not a bill.
"""

from __future__ import annotations

import email.utils
import json
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Literal

import httpx
import structlog
import trio
from google import genai
from google.auth import exceptions as auth_errors
from google.genai import errors as genai_errors
from google.genai import types
from pydantic import ValidationError

from afs.config import (
    ENV_GEMINI_MODEL_PREFIX,
    MODEL_RETRY,
    MODEL_SETTINGS,
    THINKING_LEVELS,
    ModelSettings,
    RetryPolicy,
)
from afs.errors import ConfigError, ModelError

log = structlog.get_logger("afs.gemini")

ENV_BASE_URL: Final = "AFS_GEMINI_BASE_URL"
API_KEY_VARIABLES: Final = ("GOOGLE_API_KEY", "GEMINI_API_KEY")  # the SDK's order of preference
GEMINI_API_VERSION: Final = "v1beta"  # structured output (responseJsonSchema) is documented there
DEFAULT_VERTEX_LOCATION: Final = "global"  # what the SDK assumes without GOOGLE_CLOUD_LOCATION
ENTERPRISE_VARIABLES: Final = ("GOOGLE_GENAI_USE_ENTERPRISE", "GOOGLE_GENAI_USE_VERTEXAI")  # first wins
NO_CREDENTIALS: Final = (
    "no Gemini credentials: set GOOGLE_API_KEY (or GEMINI_API_KEY) for the Gemini API, or "
    "GOOGLE_GENAI_USE_ENTERPRISE=true with GOOGLE_CLOUD_PROJECT (and GOOGLE_CLOUD_LOCATION) for "
    "Vertex AI / the Agent Platform; or use --provider heuristic")
ZERO_QUOTA: Final = "ZERO_QUOTA"  # ModelError.code of a 429 whose quota is 0
SPEND_CAP: Final = "SPEND_CAP"  # ModelError.code of a call the spending cap stopped

Role = Literal["user", "model"]
Turn = tuple[Role, str]  # one message of the conversation


# -- credentials and configuration -----------------------------------------------------------
@dataclass(frozen=True)
class Credentials:
    """How to reach Gemini; `api_key` never appears in repr() or in messages."""

    api_key: str | None = field(default=None, repr=False)
    vertexai: bool = False
    project: str | None = None
    location: str | None = None
    base_url: str | None = None
    source: str = ""  # the variable the key or the mode came from
    note: str = ""  # what the SDK would warn about (conflicting variables)

    def describe(self) -> str:
        if self.vertexai and self.api_key is None:
            project = f"project {self.project}" if self.project else "the project of the default credentials"
            where = f"Vertex AI ({project}, {self.location or DEFAULT_VERTEX_LOCATION}; {self.source})"
        elif self.vertexai:
            where = f"Vertex AI express mode (API key from {self.source})"
        else:
            where = f"the Gemini API (API key from {self.source})"
        return where + (f" at {self.base_url}" if self.base_url else "")


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("true", "1")


def enterprise_mode(env: Mapping[str, str]) -> tuple[bool, str, str]:
    """Vertex AI or not, the variable that decided, and a note when the two variables disagree
    (the SDK's reading: GOOGLE_GENAI_USE_ENTERPRISE wins; "true" or "1" is on, other text off)."""
    given = {name: _truthy(env[name]) for name in ENTERPRISE_VARIABLES if env.get(name) is not None}
    if not given:
        return False, "", ""
    deciding = next(name for name in ENTERPRISE_VARIABLES if name in given)
    note = ""
    if len(given) == 2 and len(set(given.values())) == 2:
        note = (f"GOOGLE_GENAI_USE_ENTERPRISE and GOOGLE_GENAI_USE_VERTEXAI disagree: "
                f"GOOGLE_GENAI_USE_ENTERPRISE={env['GOOGLE_GENAI_USE_ENTERPRISE']} is used, as the SDK does")
    return given[deciding], deciding, note


def gemini_credentials(env: Mapping[str, str]) -> Credentials | None:
    """The credentials the environment holds, read as the SDK reads them; None when it holds
    none (the Gemini API without a key). In Vertex AI mode a project or location from the
    environment wins over an API key, and without either the application default credentials
    are used (they may name the project): the SDK's order."""
    base_url = env.get(ENV_BASE_URL) or None
    key_variable = next((name for name in API_KEY_VARIABLES if env.get(name, "").strip()), None)
    api_key = env[key_variable].strip() if key_variable else None
    vertex, deciding, note = enterprise_mode(env)
    if vertex:
        project = env.get("GOOGLE_CLOUD_PROJECT") or None
        location = env.get("GOOGLE_CLOUD_LOCATION") or None
        if project or location or not (api_key and key_variable):
            return Credentials(vertexai=True, project=project, location=location or DEFAULT_VERTEX_LOCATION,
                               base_url=base_url, note=note,
                               source=f"{deciding}, GOOGLE_CLOUD_PROJECT" if project else
                               f"{deciding}, application default credentials")
        return Credentials(api_key=api_key, vertexai=True, base_url=base_url, source=key_variable,
                           note=note)
    if api_key and key_variable:
        return Credentials(api_key=api_key, base_url=base_url, source=key_variable, note=note)
    return None


# -- usage and cost -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Usage:
    """Tokens of one call or a sum of calls. `output_tokens` includes the thinking tokens (billed
    as output); `thinking_tokens` says how many of them were thinking."""

    prompt_tokens: int = 0  # cached ones included
    output_tokens: int = 0
    total_tokens: int = 0
    thinking_tokens: int = 0
    cached_tokens: int = 0  # of the prompt tokens, those read from the context cache

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.prompt_tokens + other.prompt_tokens, self.output_tokens + other.output_tokens,
                     self.total_tokens + other.total_tokens, self.thinking_tokens + other.thinking_tokens,
                     self.cached_tokens + other.cached_tokens)


def usage_of(response: types.GenerateContentResponse) -> Usage:
    meta = response.usage_metadata
    if meta is None:
        return Usage()
    prompt = meta.prompt_token_count or 0
    thinking = meta.thoughts_token_count or 0
    output = (meta.candidates_token_count or 0) + thinking
    return Usage(prompt, output, meta.total_token_count or prompt + output, thinking,
                 meta.cached_content_token_count or 0)


def today() -> str:
    return datetime.now(UTC).date().isoformat()


def estimate_cost(settings: ModelSettings, usage: Usage, day: str | None = None) -> float | None:
    """USD for `usage` at the model's list prices in effect on `day` (default today; thinking
    billed as output, cached prompt tokens at the cached price when there is one); None
    without a price."""
    price = settings.price_on(day or today())
    if price is None:
        return None
    cached = min(usage.cached_tokens, usage.prompt_tokens)
    cached_price = price.input_usd_per_mtok if price.cached_input_usd_per_mtok is None \
        else price.cached_input_usd_per_mtok
    return ((usage.prompt_tokens - cached) * price.input_usd_per_mtok + cached * cached_price
            + usage.output_tokens * price.output_usd_per_mtok) / 1e6


class SpendMeter:
    """A spending cap in USD (None: no cap) and what was spent against it, by estimate.

    `check` runs before every attempt: once the estimate so far reaches the cap, no call is
    made (a ModelError with code SPEND_CAP says so). An attempt of a model without a price
    counts as 0 and makes `unpriced` true: the cap cannot see it.
    """

    def __init__(self, cap_usd: float | None = None) -> None:
        self.cap_usd = cap_usd
        self.spent_usd = 0.0
        self.unpriced = False

    def check(self, model: str) -> None:
        if self.cap_usd is not None and self.spent_usd >= self.cap_usd:
            raise ModelError(f"{model}: the spending cap is reached ({self.spent_usd:.4f} of "
                             f"{self.cap_usd:g} USD, estimated at list prices): no more model calls "
                             f"(raise gemini.max_spend_usd or AFS_GEMINI_MAX_SPEND_USD)", code=SPEND_CAP)

    def add(self, cost: float | None) -> None:
        if cost is None:
            self.unpriced = True
        else:
            self.spent_usd += cost


@dataclass
class CallStats:
    """What one `generate_json` cost, answered or not: every attempt, the failed and the timed-out
    ones among them, and the tokens of every attempt that got an answer (billed even when the
    answer was unusable)."""

    attempts: int = 0
    failed: int = 0
    timeouts: int = 0
    usage: Usage = field(default_factory=Usage)
    cost_usd: float | None = 0.0  # estimated; None once an answered attempt had no price
    model_version: str | None = None  # the version that answered (`modelVersion`), last seen
    model_stage: str | None = None  # `modelStatus.modelStage` of the answer (Gemini API only)
    retirement: str | None = None  # `modelStatus.retirementTime`, ISO
    status_message: str | None = None  # `modelStatus.message`


# -- errors ------------------------------------------------------------------------------------
_KEY_IN_TEXT = re.compile(r"(key=)[^&\s]+")


def _clean(text: str, secret: str | None) -> str:
    text = _KEY_IN_TEXT.sub(r"\1***", " ".join(str(text).split()))
    return text.replace(secret, "***") if secret else text


# 408 and 429, and every 5xx but 501 (Not Implemented will not change on a retry)
RETRY_STATUSES: Final = frozenset({408, 429, 500, 502, 503, 504})


def retry_after_s(exc: genai_errors.APIError, now: datetime | None = None) -> float | None:
    """How long the server asks us to wait: the Retry-After header (seconds or a date), else
    the RetryInfo detail of the error body ("27s"); None when it says nothing."""
    headers = getattr(exc.response, "headers", None)  # the httpx.Response, when there is one
    header = headers.get("retry-after") if headers is not None else None
    if header:
        header = header.strip()
        try:
            return max(0.0, float(header))
        except ValueError:
            pass
        try:
            moment = email.utils.parsedate_to_datetime(header)
        except (TypeError, ValueError):
            moment = None
        if moment is not None:
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=UTC)
            return max(0.0, (moment - (now or datetime.now(UTC))).total_seconds())
    for detail in _details(exc):
        delay = detail.get("retryDelay") if isinstance(detail, dict) else None
        if isinstance(delay, str) and (match := re.fullmatch(r"\s*(\d+(?:\.\d+)?)s\s*", delay)):
            return float(match[1])
    return None


def _details(exc: genai_errors.APIError) -> list[Any]:
    body = exc.details if isinstance(exc.details, dict) else {}
    error = body.get("error", body)
    details = error.get("details") if isinstance(error, dict) else None
    return details if isinstance(details, list) else []


def zero_quota(exc: genai_errors.APIError) -> str | None:
    """The quota a 429 says is 0 (its QuotaFailure detail: a violation with quotaValue "0"),
    named by its metric or id; None when no violated quota is 0 (a rate limit: wait)."""
    for detail in _details(exc):
        kind = str(detail.get("@type", "")) if isinstance(detail, dict) else ""
        if not isinstance(detail, dict) or not kind.endswith("google.rpc.QuotaFailure"):
            continue
        for violation in detail.get("violations") or ():
            if not isinstance(violation, dict):
                continue
            value = violation.get("quotaValue")
            if value is not None and not isinstance(value, bool) and str(value).strip() == "0":
                metric = violation.get("quotaMetric") or violation.get("quotaId") or "a quota"
                return str(metric).rsplit("/", 1)[-1]
    return None


def _working_models(model: str) -> str:
    """Which models of AFS's table have free-tier quota (a key without billing can use them)."""
    free = [name for name, entry in MODEL_SETTINGS.items()
            if entry.free_tier and entry.stage == "stable" and name != model.removeprefix("models/")]
    if not free:
        return ""
    return (f"; or set a model with free-tier quota, e.g. {', '.join(free)} (gemini.models.<agent> "
            f"in settings.yaml or {ENV_GEMINI_MODEL_PREFIX}<AGENT>)")


# -- one request and its answer ---------------------------------------------------------------------
def generation_config(system: str, schema: Mapping[str, Any], settings: ModelSettings,
                      store: bool | None = None) -> types.GenerateContentConfig:
    """The request's configuration: JSON of `schema`, and the model's generation settings.

    `store` False asks the Gemini API not to log the request (it takes precedence over the
    project's logging setting); None sends nothing (Vertex AI: the SDK refuses the field)."""
    thinking = None
    if settings.thinking_level is not None:
        level = settings.thinking_level.upper()
        assert settings.thinking_level in THINKING_LEVELS, settings.thinking_level  # config checks it
        thinking = types.ThinkingConfig(thinking_level=types.ThinkingLevel(level))
    elif settings.thinking_budget is not None:
        thinking = types.ThinkingConfig(thinking_budget=settings.thinking_budget)
    return types.GenerateContentConfig(
        system_instruction=system, temperature=settings.temperature,
        max_output_tokens=settings.max_output_tokens, thinking_config=thinking,
        response_mime_type="application/json", response_json_schema=dict(schema), store=store)


# Finish reasons after which the same request would stop the same way: no re-prompt, no retry.
_FILTERED: Final = frozenset({"SAFETY", "PROHIBITED_CONTENT", "BLOCKLIST", "SPII", "RECITATION",
                              "IMAGE_SAFETY", "MODEL_ARMOR", "LANGUAGE"})


@dataclass(frozen=True)
class ModelRequest:
    """One question to a model, as `generate_json` sends it: the model and its generation
    settings, the system prompt, the conversation, the JSON schema of the answer, and how long
    an attempt may wait (`call_timeout_s`; with `stall_s` the answer is streamed)."""

    model: str
    system: str
    turns: Sequence[Turn]
    schema: Mapping[str, Any]
    settings: ModelSettings
    call_timeout_s: float  # the wait for the answer (streamed: for its first chunk)
    stall_s: float | None  # streamed: the longest wait for the next chunk; None: not streamed


@dataclass(frozen=True)
class ModelReply:
    text: str
    usage: Usage  # of the answered attempt
    attempts: int  # 1 + retries
    finish_reason: str | None = None
    model_version: str | None = None  # what answered, as the API says


def _note_answer(stats: CallStats, response: types.GenerateContentResponse) -> None:
    """The model version and status an answer names, into `stats`."""
    if response.model_version:
        stats.model_version = response.model_version
    status = response.model_status
    if status is not None:
        if status.model_stage is not None:
            stats.model_stage = status.model_stage.value.lower()
        if status.retirement_time is not None:
            stats.retirement = status.retirement_time.isoformat()
        stats.status_message = status.message or stats.status_message


def _reply(model: str, response: types.GenerateContentResponse, attempt: int,
           settings: ModelSettings) -> ModelReply | ModelError:
    """The answer, or the ModelError of an answer that stopped for good: a blocked prompt, an
    answer cut at max_output_tokens, one stopped by a safety filter."""
    feedback = response.prompt_feedback
    if feedback is not None and feedback.block_reason is not None:
        blocked = feedback.block_reason.value
        detail = f": {feedback.block_reason_message}" if feedback.block_reason_message else ""
        return ModelError(f"{model}: the API blocked the prompt ({blocked}{detail}); the query or the "
                          f"data values in it tripped the filter: nothing to re-prompt", code=blocked)
    candidates = response.candidates or []
    finish = candidates[0].finish_reason if candidates else None
    reason = finish.value if finish is not None else None
    if reason == "MAX_TOKENS":
        return ModelError(f"{model}: the answer was cut at max_output_tokens ({settings.max_output_tokens},"
                          f" thinking included): raise gemini.model_settings.{model}.max_output_tokens or"
                          f" lower its thinking in settings.yaml", code=reason)
    if reason in _FILTERED:
        return ModelError(f"{model}: the answer was stopped by the API's {reason} filter: nothing to "
                          f"re-prompt", code=reason)
    if not candidates:
        return ModelError(f"{model}: the API returned no answer candidate", code=reason)
    return ModelReply(text=response.text or "", usage=usage_of(response), attempts=attempt,
                      finish_reason=reason, model_version=response.model_version)


# -- the client ------------------------------------------------------------------------------------

class GeminiClient:
    """The SDK's async client plus what it needs under trio; made by `open_gemini_client`."""

    def __init__(self, sdk: genai.Client, credentials: Credentials, google_auth: Any = None) -> None:
        self.sdk = sdk
        self.credentials = credentials
        self._google_auth = google_auth  # Vertex AI credentials, refreshed here in a thread
        self._auth_lock = trio.Lock()  # the agents share the credentials: one refresh at a time

    async def _refresh_google_auth(self) -> None:
        # The SDK refreshes tokens with asyncio.to_thread; with a valid token it never does.
        auth = self._google_auth
        if auth is None or auth.valid:
            return
        async with self._auth_lock:
            if not auth.valid:  # another agent may have refreshed it while this one waited
                from google.auth.transport.requests import Request

                await trio.to_thread.run_sync(auth.refresh, Request(), abandon_on_cancel=True)

    async def generate_json(self, request: ModelRequest, *, policy: RetryPolicy = MODEL_RETRY,
                            stats: CallStats | None = None, meter: SpendMeter | None = None) -> ModelReply:
        """Ask the request's model for JSON matching its schema; retries per `policy`; raises
        ModelError.

        `stats` (when given) counts every attempt, answered or not, their tokens and cost, and
        the model version that answered. `meter` is checked before every attempt and charged
        after every answered one. With the request's `stall_s`, the answer is streamed
        (`streamGenerateContent`): `call_timeout_s` bounds the wait for its first chunk (the
        thinking), `stall_s` each wait for the next, so an answer that keeps coming is not cut
        by one wall clock; a stalled stream counts as a timed-out attempt.
        """
        model, settings = request.model, request.settings
        call_timeout_s, stall_s = request.call_timeout_s, request.stall_s
        stats = stats if stats is not None else CallStats()
        config = generation_config(request.system, request.schema, settings,
                                   store=None if self.credentials.vertexai else False)
        contents: list[types.ContentUnion] = [
            types.Content(role=role, parts=[types.Part(text=text)]) for role, text in request.turns]
        secret = self.credentials.api_key
        for attempt in range(1, policy.attempts + 1):
            if meter is not None:
                meter.check(model)
            stats.attempts += 1
            with trio.move_on_after(call_timeout_s) as scope:
                try:
                    await self._refresh_google_auth()
                    if stall_s is None:
                        response = await self.sdk.aio.models.generate_content(
                            model=model, contents=contents, config=config)
                    else:
                        response = await self._streamed(model, contents, config, stall_s, scope)
                except genai_errors.APIError as exc:
                    failure = self._failure(model, exc, policy)
                except httpx.TransportError as exc:
                    failure = ModelError(f"{model}: cannot reach the Gemini API ({type(exc).__name__}:"
                                         f" {_clean(str(exc), secret)})", retryable=True)
                except auth_errors.GoogleAuthError as exc:
                    offline = isinstance(exc, auth_errors.TransportError)  # token endpoint unreachable
                    hint = "" if offline else ": run `gcloud auth application-default login`"
                    failure = ModelError(f"{model}: cannot refresh the Vertex AI credentials"
                                         f" ({type(exc).__name__}: {_clean(str(exc), secret)}){hint}",
                                         retryable=offline or exc.retryable)
                except (json.JSONDecodeError, ValidationError) as exc:  # a 200 that is not Gemini's
                    failure = ModelError(f"{model}: the answer is not a Gemini response"
                                         f" ({type(exc).__name__}: {_clean(str(exc), secret)[:200]}):"
                                         f" check {ENV_BASE_URL} if it is set")
                else:
                    usage = usage_of(response)
                    stats.usage += usage
                    cost = estimate_cost(settings, usage)
                    stats.cost_usd = None if cost is None or stats.cost_usd is None else stats.cost_usd + cost
                    if meter is not None:
                        meter.add(cost)
                    _note_answer(stats, response)
                    reply = _reply(model, response, attempt, settings)
                    if isinstance(reply, ModelError):
                        stats.failed += 1
                        raise reply  # the same request would stop the same way: no retry
                    return reply
            stats.failed += 1
            if scope.cancelled_caught:
                stats.timeouts += 1
                waited = f"{call_timeout_s:g} s" if stall_s is None else \
                    f"{call_timeout_s:g} s, or the stream stalled for {stall_s:g} s"
                failure = ModelError(f"{model}: no answer within {waited}", retryable=True)
                if stats.timeouts >= policy.max_timeouts:
                    raise ModelError(f"{failure} ({stats.timeouts} attempts timed out; a thinking model"
                                     f" may need a longer call_timeout_s in gemini.model_settings."
                                     f"{model})", retryable=True)
            if not failure.retryable or attempt == policy.attempts:
                if failure.retryable:
                    raise ModelError(f"{failure} (gave up after {attempt} attempts)", status=failure.status,
                                     code=failure.code, retryable=True)
                raise failure
            wait = policy.backoff(attempt) if failure.retry_after_s is None else failure.retry_after_s
            log.warning("model_retry", model=model, attempt=attempt, status=failure.status,
                        error=str(failure), wait_s=round(wait, 3))
            await trio.sleep(wait)
        raise AssertionError("unreachable: the last attempt returns or raises")  # pragma: no cover

    async def _streamed(self, model: str, contents: list[types.ContentUnion],
                        config: types.GenerateContentConfig, stall_s: float,
                        scope: trio.CancelScope) -> types.GenerateContentResponse:
        """One streamed answer, its chunks joined into one response. After the first chunk the
        attempt's deadline moves to `stall_s` past each chunk (`scope` is the attempt's)."""
        stream = await self.sdk.aio.models.generate_content_stream(model=model, contents=contents,
                                                                   config=config)
        chunks: list[types.GenerateContentResponse] = []
        async for chunk in stream:
            chunks.append(chunk)
            scope.deadline = trio.current_time() + stall_s
        if not chunks:
            return types.GenerateContentResponse()
        last = chunks[-1]
        text = "".join(chunk.text or "" for chunk in chunks if chunk.candidates)
        candidates = [c for chunk in chunks for c in chunk.candidates or ()]
        finish = next((c.finish_reason for c in reversed(candidates) if c.finish_reason is not None), None)
        joined = [types.Candidate(content=types.Content(role="model", parts=[types.Part(text=text)]),
                                  finish_reason=finish)] if candidates else None
        return types.GenerateContentResponse(
            candidates=joined, prompt_feedback=chunks[0].prompt_feedback,
            usage_metadata=next((c.usage_metadata for c in reversed(chunks) if c.usage_metadata), None),
            model_version=next((c.model_version for c in reversed(chunks) if c.model_version), None),
            model_status=next((c.model_status for c in reversed(chunks) if c.model_status), None),
            sdk_http_response=last.sdk_http_response)

    async def check_model(self, model: str, policy: RetryPolicy = MODEL_RETRY,
                          timeout_s: float = 30.0) -> types.Model | None:
        """`models.get`: the model's description; None when the API has no such model (404).

        Other failures raise ModelError (credentials, permission, the API down).
        """
        for attempt in range(1, policy.attempts + 1):
            with trio.move_on_after(timeout_s) as scope:
                try:
                    await self._refresh_google_auth()
                    return await self.sdk.aio.models.get(model=model)
                except genai_errors.APIError as exc:
                    if exc.code == 404:
                        return None
                    failure = self._failure(model, exc, policy)
                except httpx.TransportError as exc:
                    failure = ModelError(f"{model}: cannot reach the Gemini API ({type(exc).__name__}:"
                                         f" {_clean(str(exc), self.credentials.api_key)})", retryable=True)
            if scope.cancelled_caught:
                failure = ModelError(f"{model}: models.get gave no answer within {timeout_s:g} s",
                                     retryable=True)
            if not failure.retryable or attempt == policy.attempts:
                raise failure
            await trio.sleep(policy.backoff(attempt) if failure.retry_after_s is None
                             else failure.retry_after_s)
        raise AssertionError("unreachable: the last attempt returns or raises")  # pragma: no cover

    def _failure(self, model: str, exc: genai_errors.APIError, policy: RetryPolicy) -> ModelError:
        """The ModelError for an API error: retryable or not, with a message to act on."""
        status, code = exc.code, exc.status
        detail = _clean(f"{status} {code or ''}: {exc.message or ''}".replace(" :", ":"),
                        self.credentials.api_key)
        key_hint = ("check the API key in " + " or ".join(API_KEY_VARIABLES)
                    if self.credentials.api_key else
                    "check the application default credentials (gcloud auth application-default login)")
        if status == 429 and (zero := zero_quota(exc)) is not None:
            return ModelError(f"{model}: no quota for this model on this key ({zero}, limit 0): the model "
                              f"needs billing on the project (a paid tier); waiting will not help"
                              f"{_working_models(model)}", status=status, code=ZERO_QUOTA)
        if status in RETRY_STATUSES or (status is not None and 500 <= status <= 599 and status != 501):
            what = f"{model}: {'rate limited' if status == 429 else 'the API failed'} ({detail})"
            asked = retry_after_s(exc)
            if asked is not None and asked > policy.max_wait_s:
                return ModelError(f"{what}; the API asks to wait {asked:g} s, longer than AFS waits"
                                  f" ({policy.max_wait_s:g} s): try again later or check the quota",
                                  status=status, code=code)
            return ModelError(what, status=status, code=code, retryable=True, retry_after_s=asked)
        if status == 401 or "api key" in (exc.message or "").lower():
            message = f"{model}: the API rejected the credentials ({detail}): {key_hint}"
        elif status == 403:
            message = (f"{model}: permission denied ({detail}): check that the key or project may use "
                       f"{model} (API enabled, billing, region)")
        elif status == 404:
            message = (f"{model}: model not found ({detail}): check the model name "
                       f"(gemini.models.<agent> in settings.yaml or {ENV_GEMINI_MODEL_PREFIX}<AGENT>)")
        else:
            message = f"{model}: the API refused the request ({detail})"
        return ModelError(message, status=status, code=code)


def _default_google_auth() -> tuple[Any, str | None]:
    """Application default credentials for Vertex AI, and the project they name (blocking:
    run it in a thread)."""
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    try:
        auth, project = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    except DefaultCredentialsError as exc:
        raise ConfigError(f"Vertex AI needs application default credentials: run `gcloud auth "
                          f"application-default login` or set GOOGLE_APPLICATION_CREDENTIALS ({exc})"
                          ) from exc
    return auth, project


@asynccontextmanager
async def open_gemini_client(credentials: Credentials, *,
                             transport: httpx.AsyncBaseTransport | None = None,
                             google_auth: Any = None) -> AsyncIterator[GeminiClient]:
    """A Gemini client on its own httpx.AsyncClient, closed on exit.

    `transport` replaces the network (tests: `FakeGemini.transport()`); `google_auth`
    replaces the application default credentials of Vertex AI mode.
    """
    project = credentials.project
    if credentials.vertexai and credentials.api_key is None and google_auth is None:
        google_auth, found = await trio.to_thread.run_sync(_default_google_auth)
        project = project or found
        if not project:
            raise ConfigError("Vertex AI needs a project: set GOOGLE_CLOUD_PROJECT (the application "
                              "default credentials name none)")
    async with httpx.AsyncClient(timeout=None, transport=transport) as http:
        options = types.HttpOptions(
            httpx_async_client=http, base_url=credentials.base_url,
            api_version=None if credentials.vertexai else GEMINI_API_VERSION)
        try:
            sdk = genai.Client(vertexai=credentials.vertexai, api_key=credentials.api_key,
                               project=project, location=credentials.location,
                               credentials=google_auth if credentials.api_key is None else None,
                               http_options=options)
        except ValueError as exc:
            raise ConfigError(f"cannot configure the Gemini client: {_clean(str(exc), credentials.api_key)}"
                              ) from exc
        yield GeminiClient(sdk, credentials, google_auth)
