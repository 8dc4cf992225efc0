"""The sockets clients open to `gateway serve`, bounded in time and number (the policy's
`server.header_timeout_s`, `keep_alive_s`, `max_connections`).

uvicorn alone closes a kept-alive connection that stays idle after a response
(`timeout_keep_alive`), but nothing bounds a connection that never sends a byte, one
that sends its headers a byte a second (slowloris), or how many are open; each holds a
file descriptor and a parser for as long as the client likes. `protocol_for` returns
uvicorn's httptools protocol (the one `uvicorn[standard]` runs: httptools is also the
engine client's parser, so it is always installed) with three bounds:

- A header deadline: a request's headers must be complete within `header_timeout_s` of
  the connection opening, or of the first read of a later request on it. A connection
  that misses it is closed, after a 408 in OpenAI's shape if a request had begun. The
  timer is a `loop.call_later` handle, armed at connection and only when a read leaves a
  later request's headers incomplete: a request whose headers come in one read (nearly
  every one) costs no timer.
- The keep-alive idle limit, `keep_alive_s` (uvicorn's own timer, set from the policy).
- A cap: past `max_connections` open connections, a new one closes the connection that
  has been idle longest (no byte sent yet, or waiting between requests); if none is
  idle, the new one is closed at once. A request in flight is never cut.

A request uvicorn cannot parse gets a 400 in OpenAI's shape too, instead of its text.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from typing import Any, ClassVar

import orjson
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from gateway.edge.held_heads import HeldHeads
from gateway.errors import GatewayError, InvalidRequest, RequestTimeout
from gateway.policy.schema import ServerSpec

log = logging.getLogger("gateway.edge.connections")

# Closures are summed and logged at most this often: a flood must not become a log flood.
_REPORT_EVERY_S = 60.0
# Descriptors besides the clients': one engine connection per request in flight (as
# many as clients at worst), the Redis pool, files, the listening socket.
_OTHER_DESCRIPTORS = 1024


class ConnectionBounds:
    """What the connections of one server share: the settings, the idle connections
    (oldest first), and counts of the connections closed for each reason."""

    def __init__(self, spec: ServerSpec) -> None:
        self.header_timeout_s = spec.header_timeout_s
        self.keep_alive_s = spec.keep_alive_s
        self.max_connections = spec.max_connections
        self.open = 0
        self.idle: dict[BoundedHttpProtocol, None] = {}  # a dict keeps insertion order
        self.closed: dict[str, int] = {}  # since the last report
        self._reported_at = -_REPORT_EVERY_S

    def count_closed(self, reason: str) -> None:
        self.closed[reason] = self.closed.get(reason, 0) + 1
        now = time.monotonic()
        if now - self._reported_at < _REPORT_EVERY_S:
            return
        self._reported_at = now
        counts = ", ".join(f"{n} {why}" for why, n in sorted(self.closed.items()))
        at_cap = self.closed.keys() & {"over_capacity", "refused"}
        self.closed.clear()
        log.log(
            logging.WARNING if at_cap else logging.INFO,
            "closed client connections (%s); %d open, server.max_connections %d",
            counts,
            self.open,
            self.max_connections,
        )


class BoundedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol under `bounds` (a subclass per server sets it)."""

    bounds: ClassVar[ConnectionBounds]

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        # uvicorn annotates its setting as int; its timer takes any number of seconds.
        self.timeout_keep_alive = self.bounds.keep_alive_s  # type: ignore[assignment]
        self._head_deadline: asyncio.TimerHandle | None = None
        self._reading_head = False  # a request began and its headers are not complete
        self._idle = False  # listed in bounds.idle
        self._counted = False  # counted in bounds.open

    # asyncio's side
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        # A response's head goes out with its body's first write (gateway/edge/held_heads.py).
        super().connection_made(HeldHeads(transport, self.loop))
        bounds = self.bounds
        bounds.open += 1
        self._counted = True
        self._head_deadline = self.loop.call_later(bounds.header_timeout_s, self._head_timed_out)
        self._mark_idle()
        if bounds.open > bounds.max_connections:
            oldest = next(iter(bounds.idle))
            oldest._close("refused" if oldest is self else "over_capacity")

    def data_received(self, data: bytes) -> None:
        if self._idle:
            self._idle = False
            del self.bounds.idle[self]
        super().data_received(data)
        if self._reading_head and self._head_deadline is None and self._counted:
            self._head_deadline = self.loop.call_later(
                self.bounds.header_timeout_s, self._head_timed_out
            )

    def connection_lost(self, exc: Exception | None) -> None:
        self._forget()
        super().connection_lost(exc)

    # httptools' side
    def on_message_begin(self) -> None:
        self._reading_head = True
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._reading_head = False
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None
        super().on_headers_complete()

    # uvicorn's side
    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.timeout_keep_alive_task is not None and self._counted:
            self._mark_idle()  # uvicorn armed its keep-alive timer: waiting for a request

    def send_400_response(self, msg: str) -> None:
        self._write_error(InvalidRequest(f"the request is not valid HTTP/1.1: {msg}"))
        self.transport.close()

    # the bounds
    def _head_timed_out(self) -> None:
        self._head_deadline = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            # A pipelined request's headers are the slow ones: the answer being written
            # is finished, then the connection closes.
            cycle.keep_alive = False
            return
        if self._reading_head:
            timeout = self.bounds.header_timeout_s
            self._write_error(
                RequestTimeout(f"the request's headers were not complete within {timeout:g} s")
            )
        self._close("header_timeout")

    def _mark_idle(self) -> None:
        self._idle = True
        self.bounds.idle[self] = None

    def _close(self, reason: str) -> None:
        self._forget()
        self.bounds.count_closed(reason)
        self.transport.close()

    def _forget(self) -> None:
        """Out of the bounds' books: no timer, not idle, not counted (once)."""
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None
        if self._idle:
            self._idle = False
            del self.bounds.idle[self]
        if self._counted:
            self._counted = False
            self.bounds.open -= 1

    def _write_error(self, error: GatewayError) -> None:
        body = orjson.dumps(error.body())
        head = [b"HTTP/1.1 %d %s\r\n" % (error.status, _PHRASES[error.status])]
        head += [b"%s: %s\r\n" % pair for pair in self.server_state.default_headers]
        head.append(b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body))
        head.append(b"connection: close\r\n\r\n")
        self.transport.write(b"".join(head) + body)


_PHRASES = {400: b"Bad Request", 408: b"Request Timeout"}


def protocol_for(spec: ServerSpec) -> type[BoundedHttpProtocol]:
    """The protocol class for uvicorn's `http=`: one per server, its connections sharing
    one set of bounds."""

    class Bounded(BoundedHttpProtocol):
        bounds = ConnectionBounds(spec)

    return Bounded


def raise_descriptor_limit(spec: ServerSpec) -> None:
    """Lift the process's soft limit on open files to what `max_connections` needs, as far
    as the hard limit allows (containers often start with a soft 1024): else accepting
    fails (EMFILE) before the cap is reached."""
    needed = 2 * spec.max_connections + _OTHER_DESCRIPTORS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        raised = needed if hard == resource.RLIM_INFINITY else min(hard, needed)
        resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
        soft = raised
    if soft != resource.RLIM_INFINITY and soft < needed:
        log.warning(
            "server.max_connections %d needs about %d open files, but the process may open "
            "%d: lower max_connections or raise the limit (ulimit -n)",
            spec.max_connections,
            needed,
            soft,
        )
