"""The engine client: one pooled aiohttp session, and the seam tests replace.

aiohttp, not httpx, on this hot path: proxying to a local upstream it added 208 us at p50
and served 6.3k requests/s at 32 concurrent, where httpx added 681 us and served 0.73k/s
(shared/docs/measured-facts.md; README's dependency table).

Every aiohttp exception is turned into the gateway's own here, at the boundary:
`ConnectFailed` means the request never reached the engine (safe to send elsewhere);
`UpstreamTimeout` and `UpstreamError` mean it may have.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import aiohttp

from gateway.errors import UpstreamError, UpstreamTimeout


class ConnectFailed(UpstreamError):
    """The engine could not be reached; nothing was sent."""


class UpstreamResponse(Protocol):
    status: int
    content_type: str
    retry_after: str | None  # the engine's Retry-After header, if any

    async def read(self) -> bytes: ...

    async def next_chunk(self) -> bytes:
        """The next bytes as they arrive; b"" at the end of the body."""
        ...

    def release(self) -> None:
        """The body was read to the end: the connection goes back to the pool."""

    def abort(self) -> None:
        """Stop early: the connection is dropped, which makes vLLM abort the request."""


class Upstream(Protocol):
    async def post(
        self, url: str, body: bytes, headers: Mapping[str, str], *, connect_timeout_s: float
    ) -> UpstreamResponse: ...

    async def close(self) -> None: ...


class _AiohttpResponse:
    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self.status = resp.status
        self.content_type = resp.headers.get("Content-Type", "application/json")
        self.retry_after = resp.headers.get("Retry-After")

    async def read(self) -> bytes:
        try:
            return await self._resp.read()
        except aiohttp.ClientError as exc:
            raise UpstreamError(f"engine connection failed while reading: {exc}") from exc
        finally:
            self._resp.release()

    async def next_chunk(self) -> bytes:
        try:
            return await self._resp.content.readany()
        except aiohttp.ClientError as exc:
            raise UpstreamError(f"engine connection failed mid-stream: {exc}") from exc

    def release(self) -> None:
        self._resp.release()

    def abort(self) -> None:
        self._resp.close()


class AiohttpUpstream:
    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}  # built once per setting

    @classmethod
    def create(cls, *, max_connections: int = 1024) -> AiohttpUpstream:
        connector = aiohttp.TCPConnector(
            limit=max_connections,
            limit_per_host=0,
            keepalive_timeout=30,
            enable_cleanup_closed=True,
        )
        # Timeouts are per request (see pipeline); the session imposes none of its own.
        session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None),
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
        )
        return cls(session)

    async def post(
        self, url: str, body: bytes, headers: Mapping[str, str], *, connect_timeout_s: float
    ) -> UpstreamResponse:
        timeout = self._timeouts.get(connect_timeout_s)
        if timeout is None:
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s)
            self._timeouts[connect_timeout_s] = timeout
        try:
            resp = await self.session.post(url, data=body, headers=dict(headers), timeout=timeout)
        except aiohttp.ClientConnectorError as exc:
            # Covers refused connections and connect timeouts: the request was never sent.
            raise ConnectFailed(f"cannot connect to the engine: {exc.os_error or exc}") from exc
        except aiohttp.ServerTimeoutError as exc:
            raise UpstreamTimeout("the engine did not answer in time") from exc
        except aiohttp.ClientError as exc:
            raise UpstreamError(f"engine request failed: {exc}") from exc
        except TimeoutError:
            raise
        return _AiohttpResponse(resp)

    async def close(self) -> None:
        await self.session.close()
