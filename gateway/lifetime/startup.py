"""A start-up the operator has to fix, said in one line instead of a traceback.

Starlette answers a failed lifespan start-up with the traceback as its message, which
uvicorn prints: right for a bug, noise for a refusal whose message already says what to
do ("the state directory ... is in use by another gateway; stop it, or ..."). Code that
refuses to start raises `StartupRefused`; `lifespan_saying_refusals_plainly` hands uvicorn
that message alone. Any other start-up failure keeps its traceback.

Raised as such, or as a subclass: the state directory in use (gateway/state/store.py), an
API keys file that cannot be read (gateway/tenants/key_file.py; read as the app is built,
before uvicorn runs: `gateway serve` prints it and exits 2), a router artifact that cannot
be used (gateway/tiering/learned.py; on a reload, the reason the new policy is rejected).
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class StartupRefused(RuntimeError):
    """The gateway cannot start as configured; the message says why and what to change."""


async def lifespan_saying_refusals_plainly(
    app: ASGIApp, scope: Scope, receive: Receive, send: Send
) -> None:
    """Runs `app`'s lifespan; a `StartupRefused` reaches the server as its message."""
    failure: Message | None = None  # the start-up's failure, sent once its kind is known

    async def hold_startup_failure(message: Message) -> None:
        nonlocal failure
        if message["type"] == "lifespan.startup.failed":
            failure = message
        else:
            await send(message)

    try:
        await app(scope, receive, hold_startup_failure)
    except StartupRefused as exc:
        failure = {"type": "lifespan.startup.failed", "message": f"gateway: {exc}"}
        raise
    finally:
        if failure is not None:
            await send(failure)
