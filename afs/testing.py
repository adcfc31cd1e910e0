"""Fakes that ship with AFS, for tests, demos and docs.

`ScriptedBrain` and `HangingBrain` stand in for an agent's brain (a proposal
chosen by the test; no answer at all).

`FakeGemini` speaks the `generateContent` REST protocol of the Gemini API (and
the Vertex AI path for it), scripted per test with a queue of `FakeReply`:
a JSON body or a status code, headers (Retry-After), a delay. It records every
`generateContent` request it receives in `requests`, and every `models.get` in
`lookups`: that one answers from the model list, not the script (any model
exists, except those named in `FakeModels.retired`, which get the 404 of a shut-down
model). Like the real API, every answer names the `modelVersion` that produced it
(`versions[model]`, else the model's own name; `routed` sends a retired name to
another model, as Google re-routes) and, for a model in `stages`, its
`modelStatus` (stage, retirement time, message). `reply_zero_quota(model)` is the
429 of a model without quota on the key's tier (a QuotaFailure detail with
quotaValue "0", and a RetryInfo that a client must not obey). A request to
`:streamGenerateContent?alt=sse` gets its answer as server-sent events:
`reply_stream` sends a text in chunks with waits between them (thinking, a stall);
any other scripted answer is sent as one event.
It has two sides, sharing one script:

* `serve_fake_gemini(fake)` — a real HTTP server on 127.0.0.1 (an ephemeral
  port) in a thread; point `AFS_GEMINI_BASE_URL` at it, from this process or
  another one (the CLI in a subprocess).
* `fake.transport()` — an `httpx.MockTransport` for an in-process client. Its
  delays are `trio.sleep`, so they run on trio's (virtual) clock.

    fake = FakeGemini(reply_json({"insights": [...], ...}), reply_error(429, retry_after=3))
    with serve_fake_gemini(fake) as base_url:
        ...
    assert "SELECT" in fake.requests[0].prompt

The command line in a subprocess, one helper for every test that runs it:
`run_afs("sandbox", "status", "--json", home=…)` (to its end, output captured),
`await run_afs_async(…, AFS_STORE_URL=…)` from trio code, `afs_command(…)` for a
process a test starts and stops itself.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import trio

from afs.models import AnalysisContext, AnalysisResult, OptimizationProposal

_GENERATE = re.compile(r"/models/(?P<model>[^/:]+):(?:stream)?[gG]enerateContent$")
_MODEL = re.compile(r"/models/(?P<model>[^/:]+)$")  # models.get
_STATUS_NAMES = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
                 404: "NOT_FOUND", 429: "RESOURCE_EXHAUSTED", 500: "INTERNAL",
                 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}


@dataclass(frozen=True)
class FakeReply:
    """One scripted answer: status, JSON body (or raw text), headers, and a delay before it."""

    body: Any = None
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    drop: bool = False  # hang up without an answer (a transport error on the client's side)
    # a streamed answer: (the wait before it, the chunk) for each server-sent event; a stall is
    # a long wait; None: the body, sent as one event when the request asked for a stream
    events: tuple[tuple[float, Any], ...] | None = None

    def encoded(self) -> bytes:
        return self.body.encode() if isinstance(self.body, str) else json.dumps(self.body).encode()

    def sse(self) -> tuple[tuple[float, bytes], ...]:
        """The server-sent events of a streamed answer (`streamGenerateContent?alt=sse`)."""
        events = self.events if self.events is not None else ((0.0, self.body),)
        return tuple((wait, b"data: " + json.dumps(chunk).encode() + b"\r\n\r\n") for wait, chunk in events)


@dataclass(frozen=True)
class FakeRequest:
    """One request the fake received."""

    method: str
    path: str
    model: str | None
    headers: Mapping[str, str]  # lower-case names
    body: Mapping[str, Any]

    @property
    def texts(self) -> list[str]:
        """The text parts of the conversation, in order (system instruction excluded)."""
        return [part.get("text", "") for content in self.body.get("contents") or ()
                for part in content.get("parts") or ()]

    @property
    def prompt(self) -> str:
        """The last user turn: the prompt the model is answering."""
        turns = self.body.get("contents") or ()
        last = turns[-1] if turns else {}
        return "\n".join(part.get("text", "") for part in last.get("parts") or ())

    @property
    def system(self) -> str:
        instruction = self.body.get("systemInstruction") or self.body.get("system_instruction") or {}
        return "\n".join(part.get("text", "") for part in instruction.get("parts") or ())

    @property
    def generation_config(self) -> Mapping[str, Any]:
        config: Mapping[str, Any] = self.body.get("generationConfig") or {}
        return config


def reply_text(text: str, *, prompt_tokens: int = 1000, output_tokens: int = 200,
               thoughts_tokens: int = 0, delay_s: float = 0.0) -> FakeReply:
    """A successful `generateContent` answer whose text is `text`, with usage metadata."""
    usage = {"promptTokenCount": prompt_tokens, "candidatesTokenCount": output_tokens,
             "totalTokenCount": prompt_tokens + output_tokens + thoughts_tokens}
    if thoughts_tokens:
        usage["thoughtsTokenCount"] = thoughts_tokens
    body = {
        "candidates": [{"content": {"role": "model", "parts": [{"text": text}]},
                        "finishReason": "STOP", "index": 0}],
        "usageMetadata": usage,
        "modelVersion": "fake",
    }
    return FakeReply(body=body, delay_s=delay_s)


@dataclass(frozen=True)
class Pacing:
    """How a streamed answer (`reply_stream`) arrives: in `pieces` chunks, the first after
    `first_s` (thinking), the others `gap_s` apart; `stall_s` > 0 holds the last chunk back that
    long (a stalled stream)."""

    pieces: int = 3
    first_s: float = 0.0
    gap_s: float = 0.0
    stall_s: float = 0.0


AT_ONCE = Pacing()  # three chunks, no waits


def reply_stream(text: str, pacing: Pacing = AT_ONCE, *, prompt_tokens: int = 1000,
                 output_tokens: int = 200) -> FakeReply:
    """A streamed answer: `text` in chunks, as `pacing` says. The last chunk carries the finish
    reason and the usage, as the API's does."""
    pieces, gap_s, first_s, stall_s = pacing.pieces, pacing.gap_s, pacing.first_s, pacing.stall_s
    size = max(1, -(-len(text) // pieces))
    parts = [text[i:i + size] for i in range(0, len(text), size)] or [""]
    events = []
    for number, part in enumerate(parts):
        chunk: dict[str, Any] = {"candidates": [{"content": {"role": "model", "parts": [{"text": part}]},
                                                 "index": 0}], "modelVersion": "fake"}
        last = number == len(parts) - 1
        if last:
            chunk["candidates"][0]["finishReason"] = "STOP"
            chunk["usageMetadata"] = {"promptTokenCount": prompt_tokens,
                                      "candidatesTokenCount": output_tokens,
                                      "totalTokenCount": prompt_tokens + output_tokens}
        wait = first_s if number == 0 else gap_s + (stall_s if last else 0.0)
        events.append((wait, chunk))
    return FakeReply(body=events[-1][1], events=tuple(events))


def reply_drop(delay_s: float = 0.0) -> FakeReply:
    """No answer at all: the connection is closed (the client sees a transport error)."""
    return FakeReply(drop=True, delay_s=delay_s)


def reply_stopped(finish_reason: str, text: str = "", **kwargs: Any) -> FakeReply:
    """An answer that stopped for `finish_reason` (MAX_TOKENS, SAFETY, …), with `text` so far."""
    reply = reply_text(text, **kwargs)
    body = json.loads(json.dumps(reply.body))
    body["candidates"][0]["finishReason"] = finish_reason
    return dataclasses.replace(reply, body=body)


def reply_blocked(block_reason: str = "SAFETY", message: str = "") -> FakeReply:
    """The answer to a prompt the API blocked: no candidate, only `promptFeedback`."""
    feedback = {"blockReason": block_reason, **({"blockReasonMessage": message} if message else {})}
    return FakeReply(body={"promptFeedback": feedback,
                           "usageMetadata": {"promptTokenCount": 1000, "totalTokenCount": 1000}})


def model_resource(model: str) -> dict[str, Any]:
    """What `models.get` answers for a model that exists."""
    return {"name": f"models/{model}", "version": "fake", "displayName": model,
            "inputTokenLimit": 1_048_576, "outputTokenLimit": 65_536,
            "supportedGenerationMethods": ["generateContent", "countTokens"], "thinking": True}


def reply_json(document: Any, **kwargs: Any) -> FakeReply:
    """A successful answer whose text is `document` as JSON."""
    return reply_text(json.dumps(document), **kwargs)


def reply_zero_quota(model: str, *, metric: str = "generate_content_free_tier_requests",
                     retry_delay: str = "27s") -> FakeReply:
    """The Gemini API's 429 for a model the key's tier has no quota for (`limit: 0`)."""
    violation = {"quotaMetric": f"generativelanguage.googleapis.com/{metric}",
                 "quotaId": "GenerateRequestsPerDayPerProjectPerModel-FreeTier",
                 "quotaDimensions": {"location": "global", "model": model}, "quotaValue": "0"}
    error = {"code": 429, "status": "RESOURCE_EXHAUSTED",
             "message": (f"You exceeded your current quota, please check your plan and billing details. "
                         f"Quota exceeded for metric: generativelanguage.googleapis.com/{metric}, "
                         f"limit: 0, model: {model}\nPlease retry in {retry_delay}."),
             "details": [{"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [violation]},
                         {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": retry_delay}]}
    return FakeReply(body={"error": error}, status=429)


@dataclass(frozen=True)
class FakeStage:
    """The `modelStatus` the fake puts in a model's answers."""

    stage: str  # PREVIEW, STABLE, DEPRECATED, RETIRED, …
    retirement: str | None = None  # RFC 3339
    message: str | None = None

    def json(self) -> dict[str, Any]:
        status: dict[str, Any] = {"modelStage": self.stage}
        if self.retirement:
            status["retirementTime"] = self.retirement
        if self.message:
            status["message"] = self.message
        return status


def reply_error(status: int, message: str = "", *, retry_after: str | float | None = None,
                retry_delay: str | None = None, delay_s: float = 0.0) -> FakeReply:
    """A Google API error body; `retry_after` sets the header, `retry_delay` a RetryInfo detail."""
    error: dict[str, Any] = {"code": status, "message": message or f"fake error {status}",
                             "status": _STATUS_NAMES.get(status, "UNKNOWN")}
    if retry_delay is not None:
        error["details"] = [{"@type": "type.googleapis.com/google.rpc.RetryInfo",
                             "retryDelay": retry_delay}]
    headers = {} if retry_after is None else {"Retry-After": str(retry_after)}
    return FakeReply(body={"error": error}, status=status, headers=headers, delay_s=delay_s)


Responder = Callable[[FakeRequest], FakeReply]


@dataclass(frozen=True)
class FakeModels:
    """What `FakeGemini` says of the models it serves: the `retired` ones (models.get answers
    404), the modelVersion each one's answers name (`versions`, else its own name), its
    modelStatus (`stages`), and a retired name another model answers for (`routed`)."""

    retired: Iterable[str] = ()
    versions: Mapping[str, str] = field(default_factory=dict)
    stages: Mapping[str, FakeStage] = field(default_factory=dict)
    routed: Mapping[str, str] = field(default_factory=dict)


EVERY_MODEL_CURRENT = FakeModels()  # any model exists and answers in its own name


class FakeGemini:
    """A scripted Gemini API: replies are taken from the queue, then from `fallback`.

    With `api_key` set, a request whose `x-goog-api-key` differs gets a 401. Without
    a reply left, the answer is a 500 that says so. Thread-safe.
    """

    def __init__(self, *replies: FakeReply, fallback: Responder | None = None,
                 api_key: str | None = None, models: FakeModels = EVERY_MODEL_CURRENT) -> None:
        self._queue: deque[FakeReply] = deque(replies)
        self._lock = threading.Lock()
        self.fallback = fallback
        self.api_key = api_key
        self.retired = set(models.retired)
        self.versions = dict(models.versions)  # model → the modelVersion its answers name
        self.stages = dict(models.stages)  # model → its modelStatus
        self.routed = dict(models.routed)  # a retired name → the model that answers in its place
        self.requests: list[FakeRequest] = []
        self.lookups: list[str] = []  # the models asked for with models.get, in order

    def script(self, *replies: FakeReply) -> None:
        with self._lock:
            self._queue.extend(replies)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    def respond(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> FakeReply:
        """Record one request and choose its reply."""
        match = _GENERATE.search(path.split("?", 1)[0])
        lookup = _MODEL.search(path.split("?", 1)[0]) if method == "GET" else None
        if lookup is not None:
            return self._model(lookup["model"], headers)
        try:
            document = json.loads(body or b"{}")
        except ValueError:
            document = {}
        request = FakeRequest(method, path, match["model"] if match else None,
                              {k.lower(): v for k, v in headers.items()},
                              document if isinstance(document, dict) else {})
        with self._lock:
            self.requests.append(request)
            if method != "POST" or match is None:
                return reply_error(404, f"fake Gemini: no such endpoint {method} {path}")
            if self.api_key is not None and request.headers.get("x-goog-api-key") != self.api_key:
                return reply_error(401, "API key not valid. Please pass a valid API key.")
            reply = self._queue.popleft() if self._queue else None
        if reply is None and self.fallback is not None:
            reply = self.fallback(request)
        if reply is None:
            return reply_error(500, "fake Gemini: no scripted reply left")
        return self._named(request.model or "", reply)

    def _named(self, model: str, reply: FakeReply) -> FakeReply:
        """An answer with the modelVersion (and modelStatus) of the model that gave it."""
        if reply.status != 200 or not isinstance(reply.body, dict) or "candidates" not in reply.body:
            return reply
        answering = self.routed.get(model, model)

        def named(chunk: Any) -> Any:
            if not isinstance(chunk, dict):
                return chunk
            chunk = dict(chunk)
            if chunk.get("modelVersion") in (None, "fake"):
                chunk["modelVersion"] = self.versions.get(answering, answering)
            if answering in self.stages and "modelStatus" not in chunk:
                chunk["modelStatus"] = self.stages[answering].json()
            return chunk

        events = None if reply.events is None else tuple((w, named(c)) for w, c in reply.events)
        return dataclasses.replace(reply, body=named(reply.body), events=events)

    def _model(self, model: str, headers: Mapping[str, str]) -> FakeReply:
        """models.get: the model's resource, a 404 for a retired one."""
        with self._lock:
            self.lookups.append(model)
            key = {k.lower(): v for k, v in headers.items()}.get("x-goog-api-key")
            if self.api_key is not None and key != self.api_key:
                return reply_error(401, "API key not valid. Please pass a valid API key.")
            if model in self.retired:
                return reply_error(404, f"models/{model} is not found for API version v1beta, or is not "
                                        f"supported for generateContent.")
        return FakeReply(body=model_resource(model))

    def transport(self) -> httpx.MockTransport:
        """An in-process transport; delays sleep on trio's clock."""

        async def handle(request: httpx.Request) -> httpx.Response:
            reply = self.respond(request.method, request.url.raw_path.decode(),
                                 dict(request.headers), await request.aread())
            if reply.delay_s:
                await trio.sleep(reply.delay_s)
            if reply.drop:
                raise httpx.RemoteProtocolError("Server disconnected without sending a response.",
                                                request=request)
            if "streamGenerateContent" in request.url.path and reply.status == 200:

                async def events() -> AsyncIterator[bytes]:
                    for wait, event in reply.sse():
                        if wait:
                            await trio.sleep(wait)
                        yield event

                return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=events())
            return httpx.Response(reply.status, headers={"content-type": "application/json",
                                                         **reply.headers},
                                  content=reply.encoded())

        return httpx.MockTransport(handle)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, fake: FakeGemini) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.fake = fake
        self.closing = threading.Event()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up (a timeout in the test) is not an error of the fake."""


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        reply = self.server.fake.respond(self.command, self.path, dict(self.headers.items()), body)
        if reply.delay_s and self.server.closing.wait(reply.delay_s):
            return
        if reply.drop:
            self.close_connection = True
            return
        if "streamGenerateContent" in self.path and reply.status == 200:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()  # no length: the events end when the connection closes
            for wait, event in reply.sse():
                if wait and self.server.closing.wait(wait):
                    return
                self.wfile.write(event)
                self.wfile.flush()
            self.close_connection = True
            return
        payload = reply.encoded()
        self.send_response(reply.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)

    do_POST = _serve
    do_GET = _serve

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the fake records requests in `FakeGemini.requests` instead."""


@contextmanager
def serve_fake_gemini(fake: FakeGemini) -> Iterator[str]:
    """Serve `fake` on 127.0.0.1 in a thread; yields the base URL; stops on exit."""
    server = _Server(fake)
    thread = threading.Thread(target=server.serve_forever, name="fake-gemini", daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        yield f"http://{host!s}:{port}"
    finally:
        server.closing.set()
        server.shutdown()
        server.server_close()
        thread.join()


# -- brains ---------------------------------------------------------------------------------
class ScriptedBrain:
    """A brain whose proposal is whatever `script(agent)` returns (tests and demos)."""

    name = "scripted"

    def __init__(self, script: Callable[[str], OptimizationProposal | Sequence[OptimizationProposal] | None]
                 ) -> None:
        self.script = script

    async def analyze(self, agent: str, ctx: AnalysisContext) -> AnalysisResult:
        return AnalysisResult(insights=("scripted",), proposed_actions=(), confidence=0.5)

    async def propose(self, agent: str, ctx: AnalysisContext,
                      analysis: AnalysisResult) -> Sequence[OptimizationProposal]:
        answer = self.script(agent)
        if answer is None:
            return ()
        return (answer,) if isinstance(answer, OptimizationProposal) else tuple(answer)


class HangingBrain:
    """A brain that never answers: its agent runs into the model time limit."""

    name = "hanging"

    async def analyze(self, agent: str, ctx: AnalysisContext) -> AnalysisResult:
        await trio.sleep_forever()

    async def propose(self, agent: str, ctx: AnalysisContext,
                      analysis: AnalysisResult) -> Sequence[OptimizationProposal]:
        await trio.sleep_forever()


# -- the command line in a subprocess ----------------------------------------------------------
def afs_command(*args: str | bytes) -> list[str | bytes]:
    """`afs ARGS` as this interpreter runs it (`python -m afs`): the argv of a subprocess."""
    return [sys.executable, "-m", "afs", *args]


def afs_environment(env: Mapping[str, str] | None = None, home: Path | str | None = None,
                    **more: str) -> dict[str, str]:
    """The subprocess's environment: `env` (default: this process's), then AFS_HOME=home when
    given, then `more` (AFS_STORE_URL=…)."""
    merged = dict(os.environ if env is None else env)
    if home is not None:
        merged["AFS_HOME"] = str(home)
    return merged | more


def _checked(args: Sequence[str | bytes], done: subprocess.CompletedProcess[Any],
             check: bool) -> subprocess.CompletedProcess[Any]:
    if check and done.returncode != 0:
        stderr = done.stderr.decode(errors="replace") if isinstance(done.stderr, bytes) else done.stderr
        raise AssertionError(f"afs {' '.join(map(str, args))} -> {done.returncode}\n{stderr}")
    return done


@dataclass(frozen=True)
class Child:
    """How `run_afs` runs its process: what it reads on stdin, how long it may take, and the
    (non-root) uid and gid it runs as (through setpriv; None: this process's)."""

    stdin: bytes | str | None = None
    timeout_s: float = 300.0
    as_user: int | None = None


AS_IS = Child()  # no input, five minutes, as this user


def run_afs(*args: str | bytes, env: Mapping[str, str] | None = None, home: Path | str | None = None,
            text: bool = False, check: bool = False,
            child: Child = AS_IS) -> subprocess.CompletedProcess[Any]:
    """Run `afs ARGS` to its end, its output captured (str with `text`, else bytes). `env`,
    `home`: as afs_environment; `check`: AssertionError with its stderr unless it exits 0;
    `child`: its input, time limit and user (`Child`)."""
    stdin, timeout, as_user = child.stdin, child.timeout_s, child.as_user
    command = afs_command(*args)
    if as_user is not None:
        command = ["setpriv", f"--reuid={as_user}", f"--regid={as_user}", "--clear-groups", *command]
    done = subprocess.run(command, capture_output=True, text=text, input=stdin, timeout=timeout,
                          env=afs_environment(env, home), check=False)
    return _checked(args, done, check)


async def run_afs_async(*args: str | bytes, env: Mapping[str, str] | None = None,
                        home: Path | str | None = None, check: bool = False,
                        **more: str) -> subprocess.CompletedProcess[bytes]:
    """run_afs for trio code: cancelling the caller kills the process. `more`: variables set
    over `env` (AFS_STORE_URL=…)."""
    done = await trio.run_process(afs_command(*args), capture_stdout=True, capture_stderr=True,
                                  check=False, env=afs_environment(env, home, **more))
    return _checked(args, done, check)
