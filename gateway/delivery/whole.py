"""Reading an engine's answer whole, streamed or not, when it must be seen entire before
the client gets it (its checks decide whether it is sent at all).

The replica's slot and its breaker outcome are given back here, exactly once: ok when the
answer was read, failed when the engine broke, timed out or sent something that is not an
answer, released when the reader was cancelled (the client went away).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from gateway.chat.conformance import NotAnAnswer, conform_event, conform_response
from gateway.chat.messages import Message
from gateway.chat.replies import ReplyCollector, reply_from_completion
from gateway.chat.sse import SSEFramer
from gateway.errors import UpstreamError, UpstreamTimeout
from gateway.resilience.dispatcher import Dispatch, Outcome
from gateway.telemetry.record import ResultFacts
from gateway.upstream.client import UpstreamResponse


@dataclass(frozen=True)
class Answer:
    """An answer read whole: the reply it holds, and what the client gets: the body of a
    completion, or the events of a stream."""

    reply: Message | None
    usage: dict[str, Any] | None
    payload: bytes = b""
    media_type: str = "application/json"
    events: list[bytes] | None = None


async def _read_stream(
    response: UpstreamResponse, facts: ResultFacts, hide_usage: bool, conform: bool, idle_s: float
) -> Answer:
    framer, collector, events = SSEFramer(), ReplyCollector(), []
    while True:
        try:
            async with asyncio.timeout(idle_s):
                chunk = await response.next_chunk()
        except TimeoutError:
            raise UpstreamTimeout("The engine stopped sending mid-stream.") from None
        if not chunk:
            break
        for event in framer.feed(chunk):
            collector.feed(event)
            if facts.observe_event(event) and hide_usage:
                continue
            events.append(conform_event(event) if conform else event)
    if not collector.done:  # the body ended, the stream did not: an answer cut short
        raise UpstreamError("The engine's stream ended without [DONE].")
    response.release()
    return Answer(collector.message(), collector.usage, events=events)


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
    outcome: Outcome = "released"  # cancelled: the client went away
    try:
        async with asyncio.timeout_at(dispatch.deadline):
            if stream:
                answer = await _read_stream(response, facts, hide_usage, conform, idle_s)
            else:
                payload = conform_response(await response.read())
                reply, usage = reply_from_completion(payload, facts.take)
                answer = Answer(reply, usage, payload, response.content_type)
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
