"""Anthropic's server-side compaction on the gateway's own trimming: `compact_20260112` in
`context_management.edits` (past its `trigger`, 150,000 input tokens by default) and the
top-level `compaction: {type: summarize}` (now). Not a model's summary: the same fold as
the Responses API's compaction (gateway/responses/compaction.py): every user message
verbatim, entity states as validated patches, a stub for each other tool result, the
recent tail kept as it is.

The answer starts with a `compaction` block. Its `content` is the compacted conversation as
text, readable and enough to go on from; its `encrypted_content` names the compacted
messages the gateway keeps (`agw-compaction-v1:<id>`, the caller's tenant only, for the
sessions' TTL). A later request that sends the block back has everything before it
dropped, as Anthropic's API drops it, and the kept messages put in its place, byte for
byte the same each turn, so the engine's prefix cache holds them; a block whose messages
expired (or that another gateway made) stands for its `content` instead, as one user
message. With `pause_after_compaction`, and for the top-level `compaction`, the block is
the whole answer (`stop_reason: compaction`) and no engine is asked; otherwise the engine
answers from the compacted conversation after it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.anthropic.convert import ChatRequest
from gateway.chat.messages import Message
from gateway.errors import InvalidRequest
from gateway.responses.compaction import Compactions, compact, compact_past, made_here
from gateway.tenants.settings import TenantPolicies
from gateway.trimming.conversation import prefix_length
from gateway.trimming.tokens import message_text, token_counter

COMPACT = "compact_20260112"
DEFAULT_TRIGGER = 150_000
# Anthropic's floor is 50,000 for its 200K-token windows; self-hosted engines are often
# smaller (the tiny one here holds 16,384), so the floor is the Responses API's.
MIN_TRIGGER = 1_000


@dataclass(frozen=True)
class Compact:
    trigger: int | None  # input tokens past which to compact; None: now
    pause: bool  # answer with the compaction block alone


def compact_edit(edit: dict[str, Any], param: str) -> Compact:
    """A `compact_20260112` edit, checked."""
    _no_instructions(edit.get("instructions"), f"{param}.instructions")
    trigger = DEFAULT_TRIGGER
    value = edit.get("trigger")
    if value is not None:
        if not isinstance(value, dict) or value.get("type") != "input_tokens":
            raise InvalidRequest(
                f"`{param}.trigger` must be `{{type: input_tokens, value}}`.",
                param=f"{param}.trigger",
            )
        number = value.get("value")
        if type(number) is not int or number < MIN_TRIGGER:
            raise InvalidRequest(
                f"`{param}.trigger.value` must be an integer of at least {MIN_TRIGGER}.",
                param=f"{param}.trigger.value",
            )
        trigger = number
    pause = edit.get("pause_after_compaction", False)
    if not isinstance(pause, bool):
        raise InvalidRequest(
            f"`{param}.pause_after_compaction` must be a boolean.",
            param=f"{param}.pause_after_compaction",
        )
    return Compact(trigger, pause)


def compaction_now(value: Any) -> Compact | None:
    """The top-level `compaction` parameter: compact the conversation now."""
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("type") != "summarize":
        raise InvalidRequest("`compaction` must be `{type: summarize}`.", param="compaction.type")
    _no_instructions(value.get("instructions"), "compaction.instructions")
    return Compact(None, pause=True)


def _no_instructions(instructions: Any, param: str) -> None:
    """Instructions steer a model's summary; the gateway's fold writes none, so it cannot
    follow them, and says so rather than drop them. Blank counts as absent, as Anthropic's."""
    if instructions is None or (isinstance(instructions, str) and not instructions.strip()):
        return
    raise InvalidRequest(
        "This gateway compacts with its own trimming, not a model's summary, so it cannot "
        "follow summarization `instructions`; leave them out.",
        param=param,
    )


class MessageCompactor:
    def __init__(self, compactions: Compactions | None, tenants: TenantPolicies) -> None:
        self._compactions = compactions  # None: no state store
        self._tenants = tenants

    async def restore(self, converted: ChatRequest, tenant: str) -> dict[str, Any]:
        """The chat body with the conversation a sent-back compaction block stands for put
        where the block was."""
        block = converted.compaction
        assert block is not None
        body = converted.body
        handle = block.get("encrypted_content")
        kept = None
        if self._compactions is not None and isinstance(handle, str) and made_here(handle):
            kept = await self._compactions.find(tenant, handle)
        if kept is None:  # expired, or made elsewhere: the block's own text
            kept = [{"role": "user", "content": block["content"]}]
        at = converted.compacted_at
        return {**body, "messages": [*body["messages"][:at], *kept, *body["messages"][at:]]}

    async def compact(
        self, body: dict[str, Any], request: Compact, tenant: str
    ) -> tuple[dict[str, Any], dict[str, Any] | None, int]:
        """The chat body compacted (when past the trigger, or now), the block the answer
        starts with and the tokens the fold saved; the body as it is, None and 0 when
        under the trigger."""
        if self._compactions is None:
            raise InvalidRequest(
                "Compaction needs the state store.", param="context_management", code="unsupported"
            )
        spec = self._tenants.of(tenant).trimming
        tokens = token_counter(spec.tokenizer)
        messages: list[Message] = body["messages"]
        if request.trigger is None:  # asked for now: a block even of a short conversation
            trimmed = compact(messages, spec, tokens)
        else:
            found = compact_past(messages, request.trigger, spec, tokens)
            if found is None or found.messages == messages:
                return body, None, 0
            trimmed = found
        compacted = trimmed.messages[prefix_length(trimmed.messages) :]
        handle = await self._compactions.put(tenant, compacted)
        text = "\n\n".join(message_text(message) for message in compacted)
        block = {"type": "compaction", "content": text, "encrypted_content": handle}
        return {**body, "messages": trimmed.messages}, block, trimmed.saved_tokens
