"""The HTTP client of `afs serve` (what `afs optimize --server URL` uses)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any

import httpx

from afs.errors import ServiceError


class ServiceClient:
    def __init__(self, url: str, token: str | None = None, timeout_s: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self._http = httpx.AsyncClient(base_url=self.url, headers=headers, timeout=timeout_s)

    async def __aenter__(self) -> ServiceClient:
        return self

    async def __aexit__(self, *exc: tuple[type[BaseException] | None, BaseException | None,
                                          TracebackType | None]) -> None:
        await self._http.aclose()

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = await self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ServiceError(f"cannot reach the AFS service at {self.url}: {exc}") from exc
        return _checked(response)

    async def health(self) -> dict[str, Any]:
        data: dict[str, Any] = await self._call("GET", "/healthz")
        return data

    async def submit(self, body: dict[str, Any]) -> dict[str, Any]:
        data: dict[str, Any] = (await self._call("POST", "/v1/tasks", json=body))["task"]
        return data

    async def get(self, task_id: str) -> dict[str, Any]:
        data: dict[str, Any] = await self._call("GET", f"/v1/tasks/{task_id}")
        return data

    async def cancel(self, task_id: str) -> dict[str, Any]:
        data: dict[str, Any] = (await self._call("DELETE", f"/v1/tasks/{task_id}"))["task"]
        return data

    async def events(self, task_id: str, after: int = 0) -> AsyncIterator[dict[str, Any]]:
        """The task's events as they happen, until it ends."""
        headers = {"Last-Event-ID": str(after)} if after else {}
        try:
            async with self._http.stream("GET", f"/v1/tasks/{task_id}/events", headers=headers,
                                         timeout=httpx.Timeout(30.0, read=None)) as response:
                if response.status_code >= 400:
                    await response.aread()
                    _checked(response)
                async for kind, data in parse_sse(response.aiter_lines()):
                    if kind != "end":  # after "end" the server closes the stream
                        yield json.loads(data)
        except httpx.HTTPError as exc:
            raise ServiceError(f"lost the event stream of {task_id}: {exc}") from exc


async def parse_sse(lines: AsyncIterator[str]) -> AsyncIterator[tuple[str, str]]:
    """(event, data) pairs from Server-Sent Events lines."""
    kind, data = "message", list[str]()
    async for line in lines:
        if not line:
            if data:
                yield kind, "\n".join(data)
            kind, data = "message", list[str]()
        elif line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())


def _checked(response: httpx.Response) -> Any:
    try:
        body = response.json()
    except ValueError:
        body = {"error": response.text[:200]}
    if response.status_code >= 400:
        field = f" ({body.get('field')})" if isinstance(body, dict) and body.get("field") else ""
        message = body.get("error") if isinstance(body, dict) else str(body)
        raise ServiceError(f"the AFS service refused: {message}{field}", status=response.status_code)
    return body
