"""A start-up the operator has to fix is said in one line; any other failure keeps its
traceback (gateway/lifetime/startup.py), as uvicorn prints them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.types import ASGIApp, Message
from uvicorn import Config
from uvicorn.lifespan.on import LifespanOn

from gateway.app import create_app
from gateway.lifetime.startup import StartupRefused, lifespan_saying_refusals_plainly
from gateway.policy import parse_policy
from gateway.policy.sessions import StateSpec
from gateway.state import store as store_module
from gateway.state.store import StateStore
from tests.fakes import Call, FakeUpstream, Scripted
from tests.unit.clients import TINY_POLICY


def failing_app(error: BaseException) -> Starlette:
    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        raise error
        yield  # pragma: no cover

    return Starlette(lifespan=lifespan)


async def startup_messages(app: ASGIApp) -> tuple[list[Message], BaseException | None]:
    sent: list[Message] = []
    incoming = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])

    async def receive() -> Message:
        return next(incoming)

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
    try:
        await lifespan_saying_refusals_plainly(app, scope, receive, send)
    except BaseException as exc:  # what the server would get
        return sent, exc
    return sent, None


async def test_a_refusal_reaches_the_server_as_its_message_alone() -> None:
    sent, raised = await startup_messages(failing_app(StartupRefused("stop the other one")))
    assert sent == [{"type": "lifespan.startup.failed", "message": "gateway: stop the other one"}]
    assert isinstance(raised, StartupRefused)


async def test_any_other_start_up_failure_keeps_its_traceback() -> None:
    sent, raised = await startup_messages(failing_app(ValueError("a bug")))
    assert [m["type"] for m in sent] == ["lifespan.startup.failed"]
    assert "Traceback" in sent[0]["message"] and "ValueError: a bug" in sent[0]["message"]
    assert isinstance(raised, ValueError)


async def test_a_start_that_succeeds_is_passed_through() -> None:
    sent, raised = await startup_messages(Starlette())
    assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert raised is None


def never_asked(call: Call) -> Scripted:
    raise AssertionError("no request reaches a gateway that did not start")


async def test_a_gateway_refused_its_state_directory_says_so_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """What `gateway serve` prints when another gateway holds its `state.embedded_dir`:
    the reason and what to do, then uvicorn's own line; no traceback."""
    monkeypatch.setattr(store_module, "_CLAIM_TRIES", 3)  # not the 5 s a dying server gets
    directory = tmp_path / "state"
    first = StateStore(StateSpec(embedded_dir=str(directory)))
    await first.open()
    try:
        policy = parse_policy(TINY_POLICY + f"state: {{embedded_dir: '{directory}'}}\n")
        config = Config(create_app(policy, upstream=FakeUpstream(never_asked)), lifespan="on")
        config.load()
        lifespan = LifespanOn(config)
        await lifespan.startup()
        assert lifespan.should_exit
        assert capsys.readouterr().err.splitlines() == [
            "INFO:     Waiting for application startup.",
            f"ERROR:    gateway: the state directory {directory} is in use by another gateway "
            "(or another worker: `--workers N` needs `state.redis_url`); stop it, or give this "
            "gateway a `state.embedded_dir` of its own",
            "ERROR:    Application startup failed. Exiting.",
        ]
    finally:
        await first.close()
