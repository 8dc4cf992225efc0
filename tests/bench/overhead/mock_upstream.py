"""A fake vLLM for the overhead benchmark: OpenAI-compatible, a fixed service time, loopback.

    python -m tests.bench.overhead.mock_upstream --port N [--model bench-model] [--service-ms 0]

Answers where vLLM does: `POST /v1/chat/completions` whole or streamed (20
`chat.completion.chunk` events, then the usage chunk when `stream_options.include_usage`
asks, then `data: [DONE]`), `GET /health`, `GET /metrics` (the load gauges routers scrape,
always idle), `GET /v1/models`. A request for another model gets vLLM's 404, so a target
that forgets to rewrite the model name shows up as errors rather than as speed.

Service time (`--service-ms`): a whole answer sleeps it before the body. A stream spreads it
evenly, one equal sleep before each of the 20 chunks, as decoding paces tokens: the time to
the first chunk holds 1/20 of it and every gap between chunks another 1/20. At 0 ms nothing
sleeps (not even `sleep(0)`): chunks are written back to back as fast as the process can.

It runs on uvloop and speaks HTTP/1.1 itself (an asyncio protocol and httptools' parser):
what it costs is in the direct figures and so cancels out of every overhead, but on this
2-core machine it also takes CPU from the target, and an aiohttp server spent about twice
as much per request. Each event is still its own write, as an engine sends them.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import time
from typing import Any, cast

import httptools
import orjson
import uvloop

CHUNKS = 20
METRICS = (
    b"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 0\n"
    b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n"
    b"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc 0\n"
)


NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"


class MockEngine:
    def __init__(self, model: str, service_ms: float) -> None:
        self.model = model
        self.service_s = service_ms / 1000
        self._ids = itertools.count()
        self._chunk_rests = [_chunk_rest(model, i) for i in range(CHUNKS)]

    def answer(
        self, method: bytes, path: bytes, headers: dict[bytes, bytes], body: bytes
    ) -> tuple[bytes, list[bytes] | None]:
        """The answer's head and body (whole), or its head and the events to stream."""
        if method == b"GET" and path == b"/health":
            return _whole(200, b"", b"text/plain"), None
        if method == b"GET" and path == b"/metrics":
            return _whole(200, METRICS, b"text/plain"), None
        if method == b"GET" and path == b"/v1/models":
            card = {"id": self.model, "object": "model", "created": 0, "owned_by": "vllm"}
            return _json({"object": "list", "data": [card]}), None
        if method != b"POST" or path != b"/v1/chat/completions":
            return NOT_FOUND, None
        request: dict[str, Any] = orjson.loads(body)
        if request.get("model") != self.model:
            error = {
                "message": f"The model `{request.get('model')}` does not exist.",
                "type": "NotFoundError",
                "param": "model",
                "code": 404,
            }
            return _json({"error": error}, status=404), None
        given = headers.get(b"x-request-id")
        ident = given.decode() if given else f"chatcmpl-mock-{next(self._ids)}"
        # A rough count; what matters is that every target relays the same usage.
        usage = {"prompt_tokens": len(body) // 4, "completion_tokens": CHUNKS, "total_tokens": 0}
        usage["total_tokens"] = usage["prompt_tokens"] + CHUNKS
        created = int(time.time())
        if not request.get("stream"):
            return _json(
                {
                    "id": ident,
                    "object": "chat.completion",
                    "created": created,
                    "model": self.model,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": " tok" * CHUNKS},
                            "logprobs": None,
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": usage,
                }
            ), None
        # Each chunk's bytes from a template (only the id and the time vary), as cheap as
        # an engine's own serialiser is beside the gateway's work.
        opening = b'data: {"id":%b,"object":"chat.completion.chunk","created":%d,' % (
            orjson.dumps(ident),
            created,
        )
        events = [opening + rest for rest in self._chunk_rests]
        options = request.get("stream_options") or {}
        if options.get("include_usage"):
            base = {"id": ident, "object": "chat.completion.chunk", "created": created}
            events.append(_event({**base, "model": self.model, "choices": [], "usage": usage}))
        events.append(b"data: [DONE]\n\n")
        return STREAM_HEAD, events


STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)


class Connection(asyncio.Protocol):
    """One client connection: requests parsed as they come, answered in order."""

    def __init__(self, engine: MockEngine) -> None:
        self.engine = engine
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.headers: dict[bytes, bytes] = {}
        self.url = b""
        self.body: list[bytes] = []
        self.previous: asyncio.Future[None] | None = None  # the answer still being paced

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self.transport is not None:
                self.transport.close()

    def on_message_begin(self) -> None:
        self.headers, self.url, self.body = {}, b"", []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        transport = self.transport
        assert transport is not None
        method = self.parser.get_method()
        keep_alive = self.parser.should_keep_alive()
        head, events = self.engine.answer(method, self.url, self.headers, b"".join(self.body))
        if not keep_alive:  # the client asked to close: say so, then close after the answer
            head = head.replace(b"\r\n", b"\r\nConnection: close\r\n", 1)
        paced = self.engine.service_s > 0
        if not paced and self.previous is None:
            _write_now(transport, head, events, keep_alive)
            return
        # A paced answer (or one behind it) is written by a task, after the one before.
        self.previous = asyncio.ensure_future(
            _write_paced(transport, head, events, keep_alive, self.engine.service_s, self.previous)
        )


def _write_now(
    transport: asyncio.Transport, head: bytes, events: list[bytes] | None, keep_alive: bool
) -> None:
    """At 0 ms nothing sleeps: the events are written back to back, one write each."""
    transport.write(head)
    if events is not None:
        for event in events:
            transport.write(_chunk(event))
        transport.write(b"0\r\n\r\n")
    if not keep_alive:
        transport.close()


async def _write_paced(
    transport: asyncio.Transport,
    head: bytes,
    events: list[bytes] | None,
    keep_alive: bool,
    service_s: float,
    previous: asyncio.Future[None] | None,
) -> None:
    if previous is not None:
        await previous
    if events is None:
        await asyncio.sleep(service_s)  # a whole answer sleeps its service time first
        transport.write(head)
    else:
        transport.write(head)
        gap = service_s / CHUNKS
        for i, event in enumerate(events):
            if i < CHUNKS:
                await asyncio.sleep(gap)  # one equal sleep before each token's chunk
            if transport.is_closing():
                return  # the client left mid-stream, as an engine's would
            transport.write(_chunk(event))
        transport.write(b"0\r\n\r\n")
    if not keep_alive:
        transport.close()


def _chunk_rest(model: str, i: int) -> bytes:
    """Chunk `i` of a stream after its id and time: `"model":...,"choices":[...]}` and the
    event's end."""
    delta = {"role": "assistant", "content": " tok"} if i == 0 else {"content": " tok"}
    choice = {
        "index": 0,
        "delta": delta,
        "logprobs": None,
        "finish_reason": "stop" if i == CHUNKS - 1 else None,
    }
    return orjson.dumps({"model": model, "choices": [choice]})[1:] + b"\n\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


def _whole(status: int, body: bytes, content_type: bytes) -> bytes:
    reason = b"OK" if status == 200 else b"Not Found"
    return b"HTTP/1.1 %d %b\r\nContent-Type: %b\r\nContent-Length: %d\r\n\r\n%b" % (
        status,
        reason,
        content_type,
        len(body),
        body,
    )


def _json(obj: Any, status: int = 200) -> bytes:
    return _whole(status, orjson.dumps(obj), b"application/json")


def _event(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


async def serve(port: int, model: str, service_ms: float) -> None:
    engine = MockEngine(model, service_ms)
    loop = asyncio.get_running_loop()
    await loop.create_server(lambda: Connection(engine), "127.0.0.1", port, backlog=1024)
    await asyncio.Event().wait()  # until SIGTERM ends the process


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default="bench-model", help="the served model name")
    parser.add_argument("--service-ms", type=float, default=0.0)
    args = parser.parse_args()
    uvloop.run(serve(args.port, args.model, args.service_ms))


if __name__ == "__main__":
    main()
