"""A start-up the operator has to fix is said in one line; any other failure keeps its
traceback (gateway/lifetime/startup.py), as uvicorn prints them."""

from __future__ import annotations

import subprocess
import sys
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


async def test_a_start_up_that_fails_late_leaves_the_state_directory_free(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A router artifact that cannot be read is found after the embedded Redis started and
    the engines' probe session opened: both are closed as the start-up fails, so the
    directory is free at once (no second gateway is kept waiting) and nothing is left
    unclosed; the reason is one line."""
    directory = tmp_path / "state"
    missing = tmp_path / "router.npz"
    policy = parse_policy(
        TINY_POLICY
        + "  auto: {tiering: default}\n"
        + f"state: {{embedded_dir: '{directory}'}}\n"
        + "tiering:\n  default:\n    tiers: {small: chat, large: chat}\n"
        + f"    learned: {{artifact: '{missing}'}}\n"
    )
    config = Config(create_app(policy), lifespan="on")
    config.load()
    lifespan = LifespanOn(config)
    await lifespan.startup()
    assert lifespan.should_exit
    errors = [line for line in capsys.readouterr().err.splitlines() if "ERROR" in line]
    assert errors == [
        f"ERROR:    gateway: {missing}: not a router artifact ([Errno 2] No such file or "
        f"directory: '{missing}')",
        "ERROR:    Application startup failed. Exiting.",
    ]
    again = StateStore(StateSpec(embedded_dir=str(directory)))
    await again.open()  # would wait 5 s, then be refused, were the directory still held
    await again.close()


def test_an_unreadable_keys_file_is_one_line_and_exit_status_2(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        TINY_POLICY + f"auth: {{keys_file: '{tmp_path / 'missing-keys'}'}}\n"
        f"state: {{embedded_dir: '{tmp_path / 'state'}'}}\n"
    )
    served = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--policy", str(policy)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert served.returncode == 2
    assert served.stderr == (
        f"gateway: cannot read the API keys file {tmp_path / 'missing-keys'}: "
        "No such file or directory\n"
    )
