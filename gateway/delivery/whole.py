"""Reading an engine's answer whole, streamed or not, when it must be seen entire before
the client gets it (its checks decide whether it is sent at all).

The replica's slot and its breaker outcome are given back here, exactly once: ok when the
answer was read, failed when the engine broke, timed out or sent something that is not an
answer, released when the reader was cancelled (the client went away).
"""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from gateway.chat.conformance import NotAnAnswer, conform_completion
from gateway.chat.messages import Message
from gateway.chat.replies import reply_of
from gateway.chat.stream import chat_events
from gateway.delivery.events import EventSteps
from gateway.errors import UpstreamError, UpstreamTimeout
from gateway.resilience.dispatcher import Dispatch, SlotOutcome
from gateway.telemetry.record import ResultFacts
from gateway.upstream.client import UpstreamResponse


@dataclass(frozen=True)
class Answer:
    """An answer read whole: the reply it holds, and what the client gets: the body of a
    completion (`completion`: that body parsed, when it was), or the events of a stream."""

    reply: Message | None
    usage: dict[str, Any] | None
    payload: bytes = b""
    media_type: str = "application/json"
    events: list[bytes] | None = None
    completion: dict[str, Any] | None = None


async def _read_stream(response: UpstreamResponse, steps: EventSteps, idle_s: float) -> Answer:
    events: list[bytes] = []
    stream = chat_events(response.next_chunk, idle_s=idle_s)
    async with aclosing(stream):
        async for event in stream:
            if (passed := await steps.take(event)) is not None:
                events.append(passed)
    response.release()
    reply = steps.reply
    assert reply is not None  # collected: an answer read whole is read for its reply
    return Answer(reply.message(), reply.usage, events=events)


async def read_answer(
    dispatch: Dispatch,
    facts: ResultFacts,
    *,
    stream: bool,
    hide_usage: bool,
    conform: bool,
    idle_s: float,
) -> Answer:
    """The whole answer and the reply it holds; a stream keeps its events as sent."""
    response = dispatch.response
    outcome: SlotOutcome = "released"  # cancelled: the client went away
    try:
        async with asyncio.timeout_at(dispatch.deadline):
            if stream:
                steps = EventSteps(facts, hide_usage=hide_usage, conform=conform, collect=True)
                answer = await _read_stream(response, steps, idle_s)
            else:
                answer = await _read_completion(response, facts)
        outcome = "ok"
        facts.reply = answer.reply
        return answer
    except TimeoutError:
        outcome = "failed"
        response.abort()
        raise UpstreamTimeout("The engine did not finish within the request deadline.") from None
    except UpstreamError:
        outcome = "failed"
        response.abort()
        raise
    except NotAnAnswer as exc:  # a body, or a chunk, of the wrong shape (a 502)
        outcome = "failed"
        response.abort()
        raise exc.upstream_error() from None
    finally:
        dispatch.finish(outcome)


async def _read_completion(response: UpstreamResponse, facts: ResultFacts) -> Answer:
    # Parsed once: conformance, telemetry, the reply and the Responses API read one parse.
    payload, completion = conform_completion(await response.read())
    facts.take(completion)
    reply, usage = reply_of(completion)
    return Answer(reply, usage, payload, response.content_type, completion=completion)
