"""`gateway serve` says it serves only once it does (gateway/edge/server.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from starlette.applications import Starlette
from uvicorn import Config

from engine.supervisor import free_port
from gateway.edge.server import ServerSayingItServes
from gateway.lifetime.startup import StartupRefused

SERVING = "gateway: serving 1 model(s) from test.yaml on http://127.0.0.1:PORT/v1"


def refusing_app() -> Starlette:
    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        raise StartupRefused("the state directory is in use")
        yield  # pragma: no cover

    return Starlette(lifespan=lifespan)


def server_for(app: Starlette) -> ServerSayingItServes:
    config = Config(app, host="127.0.0.1", port=free_port(), lifespan="on", log_level="warning")
    return ServerSayingItServes(config, SERVING)


async def test_the_serving_line_comes_once_the_server_listens(
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = server_for(Starlette())
    serving = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(10):
            while not server.started:
                assert capsys.readouterr().out == ""  # not before
                await asyncio.sleep(0.01)
        assert capsys.readouterr().out.splitlines() == [SERVING]
    finally:
        server.should_exit = True
        await serving


async def test_a_refused_start_up_never_says_it_serves(
    capsys: pytest.CaptureFixture[str],
) -> None:
    server = server_for(refusing_app())
    with pytest.raises(SystemExit) as exited:
        await server.serve()
    assert exited.value.code == 3  # uvicorn's start-up failure, `gateway serve`'s too
    printed = capsys.readouterr()
    assert SERVING not in printed.out
    assert "Application startup failed. Exiting." in printed.err
