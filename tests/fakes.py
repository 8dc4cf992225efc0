"""In-memory twin of the engine client, for unit tests of the gateway's logic.

What the product promises about vLLM itself is proven in tests/integration against real
replicas; this twin only lets a test script what "the engine" does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gateway.errors import UpstreamError
from gateway.upstream.client import ConnectFailed, UpstreamResponse


@dataclass
class Scripted:
    status: int = 200
    body: bytes = b'{"ok": true}'
    chunks: list[bytes] = field(default_factory=list)
    content_type: str = "application/json"
    connect_refused: bool = False
    break_after: int | None = None  # chunks sent before the connection drops
    chunk_delay_s: float = 0.0
    post_delay_s: float = 0.0
    retry_after: str | None = None


@dataclass
class Call:
    url: str
    body: bytes
    headers: dict[str, str]


class _FakeResponse:
    def __init__(self, script: Scripted) -> None:
        self._script = script
        self.status = script.status
        self.content_type = script.content_type
        self.retry_after = script.retry_after
        self._sent = 0
        self.released = False
        self.aborted = False

    async def read(self) -> bytes:
        self.released = True
        return self._script.body

    async def next_chunk(self) -> bytes:
        script = self._script
        if script.break_after is not None and self._sent >= script.break_after:
            raise UpstreamError("engine connection failed mid-stream: reset")
        if self._sent >= len(script.chunks):
            return b""
        if script.chunk_delay_s:
            await asyncio.sleep(script.chunk_delay_s)
        chunk = script.chunks[self._sent]
        self._sent += 1
        return chunk

    def release(self) -> None:
        self.released = True

    def abort(self) -> None:
        self.aborted = True


class FakeUpstream:
    def __init__(self, script: Callable[[Call], Scripted]) -> None:
        self._script = script
        self.calls: list[Call] = []
        self.responses: list[_FakeResponse] = []

    async def post(
        self, url: str, body: bytes, headers: Mapping[str, str], *, connect_timeout_s: float
    ) -> UpstreamResponse:
        call = Call(url, body, dict(headers))
        self.calls.append(call)
        scripted = self._script(call)
        if scripted.post_delay_s:
            await asyncio.sleep(scripted.post_delay_s)
        if scripted.connect_refused:
            raise ConnectFailed("cannot connect to the engine: refused")
        response = _FakeResponse(scripted)
        self.responses.append(response)
        return response

    async def close(self) -> None:
        pass
