"""The practical floor for a Python gateway: a bare aiohttp reverse proxy, nothing else.

    python -m tests.bench.overhead.passthrough --port N --upstream http://127.0.0.1:M

Every request goes to the one upstream as it came (method, path, query, body, headers but
the hop-by-hop ones); the answer streams back chunk by chunk as it arrives. The request body
is read whole first, as every real gateway does to route on it. No parsing, no routing, no
retries, no metrics: whatever the gateway costs above this is what its features cost.
"""

from __future__ import annotations

import argparse
import asyncio

import aiohttp
import uvloop
from aiohttp import web

HOP = {"host", "connection", "keep-alive", "transfer-encoding", "content-length", "upgrade"}


async def serve(port: int, upstream: str) -> None:
    # One pooled client without a connection cap, so the proxy never queues a request.
    client = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None)
    )

    async def proxy(request: web.Request) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        async with client.request(
            request.method, upstream + request.path_qs, data=await request.read(), headers=headers
        ) as answer:
            response = web.StreamResponse(
                status=answer.status,
                headers={k: v for k, v in answer.headers.items() if k.lower() not in HOP},
            )
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", proxy)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, backlog=1024).start()
    await asyncio.Event().wait()  # until SIGTERM ends the process


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    args = parser.parse_args()
    uvloop.run(serve(args.port, args.upstream.rstrip("/")))


if __name__ == "__main__":
    main()
