"""A chat completion stream, re-told as Responses API events, as it arrives.

`response.created` and `response.in_progress` first; then for the assistant's text an
output item, a content part and `response.output_text.delta` per chunk; for each tool call
a function_call item and `response.function_call_arguments.delta` (a custom tool's call:
a custom_tool_call item whose input is told whole when it is done); when the engine's
stream ends, the `.done` events, the stored record (`on_complete`, before the client hears
of it), and `response.completed`. An engine failure mid-stream, a chunk of the wrong shape
included (gateway/chat/conformance.py), becomes an `error` event, and the stream ends there.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import orjson

from gateway.chat.conformance import NotAnAnswer, check_shape
from gateway.chat.stream import DONE, chunks_of, first_choice
from gateway.delivery.served import EventStream
from gateway.responses.convert import (
    call_ids,
    call_item,
    message_item,
    reasoning_item,
    response_object,
    usage_of,
)
from gateway.responses.tools import NO_TOOLS, EngineTools


class ResponseEvents:
    def __init__(
        self,
        response_id: str,
        request: dict[str, Any],
        created_at: int,
        on_complete: Callable[[dict[str, Any]], Awaitable[None]],
        tools: EngineTools = NO_TOOLS,
        leading: Sequence[dict[str, Any]] = (),
    ) -> None:
        """`leading`: output items made before the engine was asked (a server-side
        compaction's item), sent first, whole."""
        self._id = response_id
        self._leading = list(enumerate(leading))
        self._tools = tools
        self._request = request
        self._created_at = created_at
        self._on_complete = on_complete
        self._sequence = 0
        self._outputs = len(self._leading)
        self._text: list[str] = []
        self._message_index: int | None = None
        self._reasoning: list[str] = []  # the engine's reasoning (with a reasoning parser)
        self._reasoning_index: int | None = None
        self._calls: dict[int, dict[str, Any]] = {}  # chat tool-call index -> item state
        self._usage: dict[str, Any] | None = None
        self._finish_reason: str | None = None

    def _event(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"

    def _response(self, status: str, output: list[dict[str, Any]]) -> dict[str, Any]:
        return response_object(
            self._id,
            self._request,
            status=status,
            created_at=self._created_at,
            output=output,
            usage=usage_of(self._usage),
            finish_reason=self._finish_reason,
        )

    async def convert(self, chat_events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        yield self._event("response.created", response=self._response("in_progress", []))
        yield self._event("response.in_progress", response=self._response("in_progress", []))
        for index, item in self._leading:
            yield self._event("response.output_item.added", output_index=index, item=item)
            yield self._event("response.output_item.done", output_index=index, item=item)
        async for raw in chat_events:
            for chunk in chunks_of(raw):
                if chunk is DONE:
                    for event in await self._finish():
                        yield event
                    return
                assert isinstance(chunk, dict)
                if "error" in chunk:
                    error = chunk["error"] if isinstance(chunk["error"], dict) else {}
                    yield self._error(error.get("code"), error.get("message"), error.get("param"))
                    return
                try:
                    check_shape(chunk, "delta")  # read whole: every chunk is checked here
                except NotAnAnswer as exc:
                    failure = exc.upstream_error()
                    yield self._error(failure.code, failure.message, None)
                    return
                for event in self._take(chunk):
                    yield event

    def _error(self, code: Any, message: Any, param: Any) -> bytes:
        text = message if isinstance(message, str) and message else None
        return self._event(
            "error", code=code, message=text or "The engine failed mid-response.", param=param
        )

    def _take(self, chunk: dict[str, Any]) -> list[bytes]:
        events: list[bytes] = []
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]
        choice = first_choice(chunk)
        if choice is not None:
            if choice.get("finish_reason"):
                self._finish_reason = choice["finish_reason"]
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                events += self._reasoning_delta(reasoning)
            text = delta.get("content")
            if isinstance(text, str) and text:
                events += self._text_delta(text)
            for call in delta.get("tool_calls") or ():
                events += self._call_delta(call)
        return events

    def _reasoning_delta(self, text: str) -> list[bytes]:
        """The engine's reasoning as a reasoning item's one summary part, as it comes."""
        events = []
        item_id = f"rs_{self._id[5:]}"
        if self._reasoning_index is None:
            self._reasoning_index = self._outputs
            self._outputs += 1
            item = {**reasoning_item(self._id, ""), "summary": []}
            events.append(
                self._event(
                    "response.output_item.added", output_index=self._reasoning_index, item=item
                )
            )
            events.append(
                self._event(
                    "response.reasoning_summary_part.added",
                    item_id=item_id,
                    output_index=self._reasoning_index,
                    summary_index=0,
                    part={"type": "summary_text", "text": ""},
                )
            )
        self._reasoning.append(text)
        events.append(
            self._event(
                "response.reasoning_summary_text.delta",
                item_id=item_id,
                output_index=self._reasoning_index,
                summary_index=0,
                delta=text,
            )
        )
        return events

    def _reasoning_done(self) -> tuple[list[bytes], dict[str, Any] | None]:
        if self._reasoning_index is None:
            return [], None
        text = "".join(self._reasoning)
        item = reasoning_item(self._id, text)
        common = {"item_id": item["id"], "output_index": self._reasoning_index, "summary_index": 0}
        events = [
            self._event("response.reasoning_summary_text.done", **common, text=text),
            self._event("response.reasoning_summary_part.done", **common, part=item["summary"][0]),
            self._event("response.output_item.done", output_index=self._reasoning_index, item=item),
        ]
        return events, item

    def _text_delta(self, text: str) -> list[bytes]:
        events = []
        item_id = f"msg_{self._id[5:]}"
        if self._message_index is None:
            self._message_index = self._outputs
            self._outputs += 1
            item = {**message_item(self._id, "", status="in_progress"), "content": []}
            events.append(
                self._event(
                    "response.output_item.added", output_index=self._message_index, item=item
                )
            )
            events.append(
                self._event(
                    "response.content_part.added",
                    item_id=item_id,
                    output_index=self._message_index,
                    content_index=0,
                    part={"type": "output_text", "text": "", "annotations": [], "logprobs": []},
                )
            )
        self._text.append(text)
        events.append(
            self._event(
                "response.output_text.delta",
                item_id=item_id,
                output_index=self._message_index,
                content_index=0,
                delta=text,
                logprobs=[],
            )
        )
        return events

    def _call_delta(self, call: dict[str, Any]) -> list[bytes]:
        events = []
        index = int(call.get("index", 0))
        state = self._calls.get(index)
        function = call.get("function") or {}
        if state is None:
            name = function.get("name") or ""
            custom = name in self._tools.custom  # its input is told whole, at the end
            state = self._calls[index] = {
                "type": "custom_tool_call" if custom else "function_call",
                **call_ids(self._id, index, call.get("id"), custom=custom),
                "name": name,
                "arguments": "",
                "status": "in_progress",
                "output_index": self._outputs,
            }
            self._outputs += 1
            events.append(
                self._event(
                    "response.output_item.added",
                    output_index=state["output_index"],
                    item=self._item(state),
                )
            )
        if function.get("name") and not state["name"]:
            state["name"] = function["name"]
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            state["arguments"] += arguments
            if state["type"] == "custom_tool_call":
                return events  # JSON of the function's one argument, not the input's text
            events.append(
                self._event(
                    "response.function_call_arguments.delta",
                    item_id=state["id"],
                    output_index=state["output_index"],
                    delta=arguments,
                )
            )
        return events

    def _item(self, state: dict[str, Any]) -> dict[str, Any]:
        """A call's item as the client sees it (as a whole answer's: `call_item`)."""
        return call_item(
            self._tools, state["name"], state["arguments"],
            id=state["id"], call_id=state["call_id"], status=state["status"],
        )  # fmt: skip

    async def _finish(self) -> list[bytes]:
        events, reasoning = self._reasoning_done()
        output: list[tuple[int, dict[str, Any]]] = list(self._leading)
        if reasoning is not None and self._reasoning_index is not None:
            output.append((self._reasoning_index, reasoning))
        if self._message_index is not None:
            text = "".join(self._text)
            item = message_item(self._id, text)
            part = item["content"][0]
            events.append(
                self._event(
                    "response.output_text.done",
                    item_id=item["id"],
                    output_index=self._message_index,
                    content_index=0,
                    text=text,
                    logprobs=[],
                )
            )
            events.append(
                self._event(
                    "response.content_part.done",
                    item_id=item["id"],
                    output_index=self._message_index,
                    content_index=0,
                    part=part,
                )
            )
            events.append(
                self._event(
                    "response.output_item.done", output_index=self._message_index, item=item
                )
            )
            output.append((self._message_index, item))
        for state in self._calls.values():
            state["status"] = "completed"
            item = self._item(state)
            if state["type"] == "custom_tool_call":
                events += self._custom_input(state, item["input"])
            else:
                events.append(
                    self._event(
                        "response.function_call_arguments.done",
                        item_id=state["id"],
                        output_index=state["output_index"],
                        name=self._tools.item_name(state["name"])["name"],
                        arguments=state["arguments"],
                    )
                )
            events.append(
                self._event(
                    "response.output_item.done", output_index=state["output_index"], item=item
                )
            )
            output.append((state["output_index"], item))
        response = self._response("completed", [item for _, item in sorted(output, key=_first)])
        await self._on_complete(response)
        # A response cut short by max_output_tokens ends with `response.incomplete`.
        events.append(self._event(f"response.{response['status']}", response=response))
        return events

    def _custom_input(self, state: dict[str, Any], text: str) -> list[bytes]:
        """A custom call's input, whole: the engine wrote it as JSON of one argument."""
        where = {"item_id": state["id"], "output_index": state["output_index"]}
        return [
            self._event("response.custom_tool_call_input.delta", **where, delta=text),
            self._event("response.custom_tool_call_input.done", **where, input=text),
        ]


class ConvertedStream(EventStream):
    """A chat stream (relayed or replayed) sent as Responses API events; closing it closes
    the chat stream (and gives its replica back)."""

    def __init__(self, converter: ResponseEvents, chat: EventStream) -> None:
        self._converter = converter
        self._chat = chat

    def events(self) -> AsyncIterator[bytes]:
        return self._converter.convert(self._chat.events())

    def close(self) -> None:
        self._chat.close()


def _first(pair: tuple[int, dict[str, Any]]) -> int:
    return pair[0]
