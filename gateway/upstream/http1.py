"""The engine client on the hot path: HTTP/1.1 over pooled keep-alive connections, on
asyncio's protocol layer with httptools parsing the answers.

Why not aiohttp here: profiled at 32 concurrent requests, aiohttp's client was about a
tenth of the gateway's CPU per request (request and response objects, header multidicts,
URL objects, payload writers, tracing signals); this does the one thing the gateway needs
(POST bytes to an engine, read the answer whole or as it arrives) with a few calls per
request. httptools is the C parser uvicorn already uses for the gateway's own server.
aiohttp stays for the health checks and the engines' /metrics (gateway/fleet/health.py,
gateway/fleet/engine_metrics.py), off the hot path.

Errors follow `gateway.upstream.client`'s contract: `ConnectFailed` when nothing was sent,
`UpstreamError` when the connection broke after it may have been.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import cast
from urllib.parse import urlsplit

import httptools

from gateway.errors import UpstreamError
from gateway.upstream.client import ConnectFailed, UpstreamResponse

# A stream's bytes wait here until the relay takes them; past this much the socket is
# paused, so a slow client holds back the engine instead of filling the gateway's memory.
# The relay takes all that is buffered at once (`take`), so reading resumes then.
_PAUSE_AT = 256 * 1024


@dataclass(frozen=True)
class _Target:
    host: str
    port: int
    tls: bool
    head: bytes  # "POST <path> HTTP/1.1\r\nHost: ...\r\n", built once per URL
    endpoint: tuple[str, int, bool]  # the pool's key: one connection serves every path


@lru_cache(maxsize=4096)
def _target(url: str) -> _Target:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConnectFailed(f"cannot connect to the engine: unsupported URL {url!r}")
    tls = parts.scheme == "https"
    port = parts.port or (443 if tls else 80)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    host_header = parts.netloc.rsplit("@", 1)[-1]
    head = f"POST {path} HTTP/1.1\r\nHost: {host_header}\r\n".encode("latin-1")
    return _Target(parts.hostname, port, tls, head, (parts.hostname, port, tls))


class _Connection(asyncio.Protocol):
    """One connection to an engine, carrying one request at a time.

    asyncio's defaults serve for the rest of the protocol: at end of input the transport
    closes (a half-closed engine connection is of no further use), and writing is never
    paused (a request is written in one go)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.content_type = "application/json"
        self.retry_after: str | None = None
        self.headers_done = False
        self.answered = False  # any byte of an answer arrived
        self._framed = False  # a Content-Length or chunked body; otherwise ended by a close
        self.complete = False
        self.keep_alive = False
        self.error: str | None = None
        self.body: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None

    # asyncio's side
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self.answered = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # never asked for; treat as a broken answer
            self._fail("the engine switched protocols")
        except httptools.HttpParserError as exc:
            self._fail(f"the engine's answer is not valid HTTP: {exc}")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if not self.complete and self.headers_done and not self._framed and self.error is None:
            # No length and not chunked: the answer is whatever came before the close
            # (httptools has no end-of-input call to say so itself).
            self.complete = True
        if not self.complete and self.error is None:
            self.error = f"the engine closed the connection: {exc or 'end of stream'}"
        self._wake()

    # httptools' side
    def on_header(self, name: bytes, value: bytes) -> None:
        lowered = name.lower()
        if lowered == b"content-type":
            self.content_type = value.decode("latin-1")
        elif lowered == b"retry-after":
            self.retry_after = value.decode("latin-1")
        elif lowered in (b"content-length", b"transfer-encoding"):
            self._framed = True

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self.headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
        self._buffered += len(body)
        if self._buffered > _PAUSE_AT and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self._parser.should_keep_alive()
        self._wake()

    # the client's side
    def send(self, head: bytes, body: bytes) -> None:
        assert self.transport is not None
        self.transport.writelines((head, body))

    async def wait(self) -> None:
        """Until something changes: headers, body bytes, the end, or a failure."""
        waiter = self._loop.create_future()
        self._waiter = waiter
        try:
            await waiter
        finally:
            self._waiter = None

    def take(self) -> bytes:
        """Every body byte buffered so far."""
        if len(self.body) == 1:
            data = self.body.popleft()
        else:
            data = b"".join(self.body)
            self.body.clear()
        self._buffered = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return data

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()  # at once: an engine notices and stops generating

    def reusable(self) -> bool:
        return self.complete and self.keep_alive and not self.closed and self.error is None

    def ready_for_next(self) -> None:
        self._reset()

    def _fail(self, reason: str) -> None:
        self.error = reason
        self.close()
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class _Response:
    """An engine's answer as `UpstreamResponse`: the connection goes back to the pool
    once the body was read to the end, and is closed otherwise."""

    def __init__(self, conn: _Connection, pool: _Pool) -> None:
        self._conn = conn
        self._pool: _Pool | None = pool
        self.status = conn.status
        self.content_type = conn.content_type
        self.retry_after = conn.retry_after

    async def read(self) -> bytes:
        conn = self._conn
        parts: list[bytes] = []
        try:
            while not conn.complete:
                if conn.body:  # taken as it comes, or a paused socket would never finish
                    parts.append(conn.take())
                elif conn.error is not None:
                    raise UpstreamError(f"engine connection failed while reading: {conn.error}")
                else:
                    await conn.wait()
            if not parts:
                return conn.take()
            parts.append(conn.take())
            return b"".join(parts)
        finally:
            self.release()

    async def next_chunk(self) -> bytes:
        conn = self._conn
        while True:
            if conn.body:
                return conn.take()
            if conn.complete:
                return b""
            if conn.error is not None:
                raise UpstreamError(f"engine connection failed mid-stream: {conn.error}")
            await conn.wait()

    def release(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        if self._conn.reusable() and not self._conn.body:
            pool.put(self._conn)
        else:
            self._conn.close()

    def abort(self) -> None:
        self._pool = None
        self._conn.close()

    def __del__(self) -> None:
        # Dropped without release() or abort() (a bug elsewhere): never a leaked socket.
        if self._pool is not None:
            self._conn.close()


class _Pool:
    """Idle keep-alive connections to one engine, most recently used first."""

    def __init__(self, keepalive_s: float) -> None:
        self._idle: deque[_Connection] = deque()
        self._keepalive_s = keepalive_s

    def get(self) -> _Connection | None:
        idle = self._idle
        now = time.monotonic()
        while idle and (idle[0].closed or now - idle[0].idle_since > self._keepalive_s):
            idle.popleft().close()  # the oldest first: gone stale
        while idle:
            conn = idle.pop()
            if not conn.closed:
                return conn
        return None

    def put(self, conn: _Connection) -> None:
        conn.ready_for_next()
        conn.idle_since = time.monotonic()
        self._idle.append(conn)

    def close(self) -> None:
        while self._idle:
            self._idle.pop().close()


class _Stale(Exception):
    """A pooled connection the engine had already closed."""


class Http1Upstream:
    """`gateway.upstream.client.Upstream` over pooled HTTP/1.1 connections."""

    def __init__(self, *, keepalive_s: float = 30.0) -> None:
        self._pools: dict[tuple[str, int, bool], _Pool] = {}
        self._keepalive_s = keepalive_s
        self._tls: ssl.SSLContext | None = None

    async def post(
        self, url: str, body: bytes, headers: Mapping[str, str], *, connect_timeout_s: float
    ) -> UpstreamResponse:
        target = _target(url)
        pool = self._pools.get(target.endpoint)
        if pool is None:
            pool = self._pools[target.endpoint] = _Pool(self._keepalive_s)
        lines = "".join([f"{name}: {value}\r\n" for name, value in headers.items()])
        if lines.count("\n") != len(headers) or lines.count("\r") != len(headers):
            # a line break inside a name or value would smuggle in headers of its own
            raise UpstreamError("refused to send the engine a header with a line break")
        head = b"%s%sContent-Length: %d\r\n\r\n" % (target.head, lines.encode(), len(body))
        conn = pool.get()
        if conn is not None:
            try:
                return await self._exchange(conn, pool, head, body, reused=True)
            except _Stale:
                pass  # the engine had closed it (its keep-alive ran out): a new connection
        conn = await self._connect(target, connect_timeout_s)
        return await self._exchange(conn, pool, head, body, reused=False)

    async def _exchange(
        self, conn: _Connection, pool: _Pool, head: bytes, body: bytes, *, reused: bool
    ) -> _Response:
        """Sends the request; returns once the answer's headers are in."""
        try:
            conn.send(head, body)
            while not conn.headers_done:
                if conn.error is not None:
                    if reused and conn.closed and not conn.answered:
                        # Closed by the engine without a byte of answer: an idle connection
                        # it let go of as the request went out (uvicorn, vLLM's server,
                        # closes idle ones after 5 s), which never read the request.
                        raise _Stale
                    raise UpstreamError(f"engine request failed: {conn.error}")
                await conn.wait()
        except BaseException:
            conn.close()  # cancelled or failed mid-request: the connection is unusable
            raise
        return _Response(conn, pool)

    async def _connect(self, target: _Target, timeout_s: float) -> _Connection:
        loop = asyncio.get_running_loop()
        tls = self._tls_context() if target.tls else None
        try:
            async with asyncio.timeout(timeout_s):
                _, protocol = await loop.create_connection(
                    lambda: _Connection(loop), target.host, target.port, ssl=tls
                )
        except TimeoutError as exc:
            raise ConnectFailed(
                f"cannot connect to the engine: no connection within {timeout_s:g}s"
            ) from exc
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to the engine: {exc}") from exc
        return protocol

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls

    async def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
