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

It runs on uvloop so that the mock, shared by every target, is as cheap as it can be: what
it costs is in the direct figures and so cancels out of every overhead.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import time
from typing import Any

import orjson
import uvloop
from aiohttp import web

CHUNKS = 20
METRICS = (
    b"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 0\n"
    b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n"
    b"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc 0\n"
)


class MockEngine:
    def __init__(self, model: str, service_ms: float) -> None:
        self.model = model
        self.service_s = service_ms / 1000
        self._ids = itertools.count()

    def app(self) -> web.Application:
        # Large bodies (the 50k-token prompt is about 200 KB) are normal here, as at vLLM.
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.Response()

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=METRICS, content_type="text/plain")

    async def models(self, request: web.Request) -> web.Response:
        card = {"id": self.model, "object": "model", "created": 0, "owned_by": "vllm"}
        return _json({"object": "list", "data": [card]})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body: dict[str, Any] = orjson.loads(await request.read())
        if body.get("model") != self.model:
            error = {
                "message": f"The model `{body.get('model')}` does not exist.",
                "type": "NotFoundError",
                "param": "model",
                "code": 404,
            }
            return _json({"error": error}, status=404)
        ident = request.headers.get("X-Request-Id") or f"chatcmpl-mock-{next(self._ids)}"
        # A rough count; what matters is that every target relays the same usage.
        usage = {
            "prompt_tokens": request.content_length // 4 if request.content_length else 0,
            "completion_tokens": CHUNKS,
            "total_tokens": 0,
        }
        usage["total_tokens"] = usage["prompt_tokens"] + CHUNKS
        created = int(time.time())
        if not body.get("stream"):
            if self.service_s:
                await asyncio.sleep(self.service_s)
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
            )
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        gap = self.service_s / CHUNKS
        base = {"id": ident, "object": "chat.completion.chunk", "created": created}
        for i in range(CHUNKS):
            if gap:
                await asyncio.sleep(gap)
            delta = {"role": "assistant", "content": " tok"} if i == 0 else {"content": " tok"}
            choice = {
                "index": 0,
                "delta": delta,
                "logprobs": None,
                "finish_reason": "stop" if i == CHUNKS - 1 else None,
            }
            await response.write(_event({**base, "model": self.model, "choices": [choice]}))
        options = body.get("stream_options") or {}
        if options.get("include_usage"):
            await response.write(
                _event({**base, "model": self.model, "choices": [], "usage": usage})
            )
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(obj), status=status, content_type="application/json")


def _event(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


async def serve(port: int, model: str, service_ms: float) -> None:
    runner = web.AppRunner(MockEngine(model, service_ms).app(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, backlog=1024).start()
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
