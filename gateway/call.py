"""The values the request path's steps pass along: `Call`, the one per-request value
each step of `Pipeline.handle` (gateway/pipeline.py) reads and returns with what it
decided, and what a step answers with: a `Reply` read whole, a `Live` stream, or the
`Settled` answer whose tool calls were judged (gateway/tool_call_steps.py)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from gateway.approvals.gate import Guard
from gateway.chat.inbound import InboundRequest
from gateway.delivery.relay import StreamRelay
from gateway.delivery.whole import Answer
from gateway.request_context import RequestContext
from gateway.resilience.dispatcher import Dispatch
from gateway.routing.costs import RouteRequest
from gateway.session_steps import Checkpointer
from gateway.sessions.ids import SessionRef
from gateway.sessions.turns import Turn
from gateway.tenants.settings import TenantSettings
from gateway.tiering.chooser import TierChoice
from gateway.toolcalls.checker import ToolCheck


@dataclass(frozen=True)
class Call:
    """One request as the steps of `handle` make it: each step reads it and returns it
    with what it decided."""

    request: InboundRequest
    context: RequestContext
    tenant: TenantSettings
    session: SessionRef | None = None
    turn: Turn | None = None  # the session turn this call is, when it is kept
    unsaved: SessionRef | None = None  # its store was down: the turn is served, not kept
    # The client did not ask for the stream's usage chunk; the gateway did (`_with_usage`).
    hide_usage: bool = False
    guard: Guard | None = None  # may call a tool that needs a person's approval
    route: RouteRequest | None = None
    choice: TierChoice | None = None
    tools: ToolCheck | None = None  # the check of the tool calls it may answer with
    # Response headers set along the way (which parts of the prompt prefix changed),
    # sent with whatever answers the call.
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def client_usage(self) -> bool:
        """Whether a stream's client asked for the usage chunk (the gateway always does)."""
        return self.request.stream and not self.hide_usage

    def but(self, **changes: Any) -> Call:
        """This call with `changes`, as `dataclasses.replace` makes it but without its
        field-by-field frozen `__init__`: each step makes one, and `replace` was 4% of the
        gateway's CPU per request (py-spy, `make bench` at c=32). A Call has no derived
        state to invalidate, so copying its fields is the whole of it."""
        assert changes.keys() <= _CALL_FIELDS, changes.keys() - _CALL_FIELDS
        copy = object.__new__(Call)
        vars(copy).update(vars(self), **changes)
        return copy


_CALL_FIELDS = frozenset(f.name for f in fields(Call))


@dataclass(frozen=True)
class Reply:
    """An answer read (or written) whole, and how the turn it answers is kept."""

    answer: Answer
    headers: dict[str, str]  # how it was served
    commit: Checkpointer | None  # None: not a new answer of the engine, the turn is unsaved
    keep_as: str | None = None  # the response cache's key for it, when it may be kept


@dataclass(frozen=True)
class Live:
    """A stream relayed as the engine sends it; its turn is committed by the relay, before
    `[DONE]` is passed on."""

    relay: StreamRelay
    headers: dict[str, str]


@dataclass(frozen=True)
class Settled:
    """An answer read whole and where it came from, as its tool calls left it."""

    choice: TierChoice
    dispatch: Dispatch
    headers: dict[str, str]
    answer: Answer
    stands: bool = True  # False: refused, the gateway's answer instead of the engine's
    held: tuple[str, ...] = ()  # tools an analyzer holds for a person's approval
