"""The engine client's seam: what the pipeline needs of it, which tests replace.

The client on the request path is `gateway.upstream.http1.Http1Upstream` (pooled HTTP/1.1 with
httptools); health checks and /metrics scraping use an aiohttp session (`probe_session`).
Clients turn their failures into the gateway's own errors at this boundary:
`ConnectFailed` means the request never reached the engine (safe to send elsewhere);
`UpstreamTimeout` and `UpstreamError` mean it may have.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import aiohttp

from gateway.errors import UpstreamError


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


def probe_session() -> aiohttp.ClientSession:
    """The session for what is not on the request path: health checks and the engines'
    /metrics (gateway/fleet/health.py, gateway/fleet/engine_metrics.py). Each call sets its own
    timeout; the session imposes none."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=64, keepalive_timeout=30),
        timeout=aiohttp.ClientTimeout(total=None),
        skip_auto_headers=("User-Agent",),
    )
