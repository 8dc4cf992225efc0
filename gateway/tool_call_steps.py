"""The pipeline's tool-call steps: an answer's tool calls judged before the client sees
them (gateway/toolcalls/checker.py), and what the policy does with an invalid one.

Valid calls stand, repaired ones in place of what the model wrote. An invalid one goes
through the policy's steps in order: asked again on the same pool with what was wrong
appended (at most `reask_max` times), escalated one tier, or refused: an error, or an
assistant message saying why. Every outcome is counted and on the request's record;
nothing is retried without bound. A live stream's calls are held until whole
(gateway/toolcalls/stream_hold.py); one that is invalid is settled here as a whole
answer would be, unstreamed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import orjson

from gateway.approvals.gateway_answers import gateway_answer
from gateway.call import Call, Settled
from gateway.chat.inbound import InboundRequest
from gateway.chat.messages import Message
from gateway.delivery.whole import Answer
from gateway.errors import InvalidToolCall
from gateway.resilience.dispatcher import Dispatch
from gateway.tiering.chooser import TierChoice, TierChooser
from gateway.toolcalls.checker import Judgement

# Sends `request` for `call` to the choice's pool (its fallbacks when it cannot answer)
# and reads the answer whole: the pipeline's dispatch, its records and headers included.
Resend = Callable[[Call, TierChoice, InboundRequest], Awaitable[Settled]]


class ToolCallSteps:
    def __init__(self, tiers: TierChooser, resend: Resend) -> None:
        self._tiers = tiers
        self._resend = resend

    async def settle(
        self, call: Call, settled: Settled, asked: InboundRequest | None = None
    ) -> Settled:
        """The answer's tool calls judged: valid or repaired calls stand; an invalid one
        is asked again, escalated or refused, as the policy says. `asked`: the request
        re-asks are built from (default: the client's; a live stream's recovery passes it
        unstreamed)."""
        tools, record = call.tools, call.context.record
        request = asked or call.request
        reasks = 0
        while tools is not None:
            calls = _calls(settled.answer)
            if calls is None and tools.demand is None:
                break  # a text answer owes nothing: only calls are checked
            judgement = tools.judge(calls or [])
            if record.tool_check is None:  # the first answer's, a label for learning
                record.tool_check = "valid" if judgement.valid else "invalid"
                record.tool_check_tier = settled.choice.tier
            if judgement.valid:
                assert calls is not None  # an answer that owes a call and made none is invalid
                answer = _judged(call, settled.answer, judgement, calls)
                return replace(settled, answer=answer, held=judgement.held)
            choice = settled.choice
            step = tools.step(
                judgement,
                reasks_left=reasks < tools.reask_max,
                can_escalate=choice.escalate_to is not None,
            )
            record.tool_call_outcome(step, judgement.summary())
            if step == "refuse":
                tools.count("refused", len(judgement.issues))
                answer = _refused(call, settled.answer, judgement, choice)
                return replace(settled, answer=answer, stands=False)
            again = request
            if step == "reask":
                tools.count("reasked", len(judgement.issues))
                reasks += 1
                body = tools.reask_body(request.body, settled.answer.reply, judgement)
                again = request.with_body(body)
            else:
                tools.count("escalated", len(judgement.issues))
                choice = self._tiers.escalated(request.model, choice, "tool_calls")
            record.escalating()  # the invalid answer is paid for all the same
            settled = await self._resend(call, choice, again)
        return settled

    async def recover_stream(
        self, call: Call, choice: TierChoice, dispatch: Dispatch, reply: Message
    ) -> Message:
        """A live stream's reply with an invalid call, settled as a whole answer would be
        (asked again unstreamed, escalated, or refused): the message whose calls (or
        refusal) finish the stream. InvalidToolCall when the refusal is an error."""
        request = call.request
        body = {k: v for k, v in request.body.items() if k not in ("stream", "stream_options")}
        unstreamed = replace(request.with_body(body), stream=False)
        first = Settled(choice, dispatch, {}, Answer(reply, None))
        settled = await self.settle(call, first, unstreamed)
        return settled.answer.reply or {"role": "assistant", "content": ""}


def _calls(answer: Answer) -> list[dict[str, Any]] | None:
    calls = answer.reply.get("tool_calls") if answer.reply is not None else None
    return calls if isinstance(calls, list) and calls else None


def _judged(
    call: Call, answer: Answer, judgement: Judgement, calls: list[dict[str, Any]]
) -> Answer:
    """The answer with its repaired calls in place (as it was when none needed one)."""
    assert call.tools is not None
    checked = judgement.review.calls
    repaired = sum(1 for made, sent in zip(calls, checked, strict=True) if made is not sent)
    if repaired < len(calls):
        call.tools.count("valid", len(calls) - repaired)
    if not repaired:
        return answer
    call.tools.count("repaired", repaired)
    call.context.record.tool_call_outcome("repair", ",".join(judgement.review.repairs))
    assert answer.reply is not None
    message = {**answer.reply, "tool_calls": checked}
    return _replaced(answer, message, call)


def _refused(call: Call, answer: Answer, judgement: Judgement, choice: TierChoice) -> Answer:
    """The refusal the policy asks for: an error, or the assistant saying why."""
    assert call.tools is not None
    if call.tools.refuse_as == "error":
        raise InvalidToolCall(
            f"The model's tool call was refused: {judgement.summary()}",
            headers=choice.header_values(),
        )
    return _replaced(answer, call.tools.refusal(judgement), call)


def _replaced(answer: Answer, message: dict[str, Any], call: Call) -> Answer:
    """The answer with another assistant message: a completion keeps all else it said
    (id, usage, logprobs); a stream read whole is told again as the gateway's own."""
    completion = answer.completion
    if completion is not None and isinstance(completion.get("choices"), list):
        first = completion["choices"][0]
        finish = "tool_calls" if message.get("tool_calls") else "stop"
        choices = [{**first, "message": {**first.get("message", {}), **message,
                                         "tool_calls": message.get("tool_calls")},
                    "finish_reason": finish}, *completion["choices"][1:]]  # fmt: skip
        changed = {**completion, "choices": choices}
        return Answer(message, answer.usage, orjson.dumps(changed), answer.media_type,
                      completion=changed)  # fmt: skip
    record = call.context.record
    return gateway_answer(
        message,
        model=record.result.response_model or call.request.model,
        stream=call.request.stream,
        usage=answer.usage,
        include_usage=call.client_usage,
        completion_id=record.result.response_id,
    )
