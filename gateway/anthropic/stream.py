"""A chat completion stream, re-told as the Anthropic Messages API's events, as it arrives.

`message_start` (the message, empty) and a `ping` first; then each content block in turn:
`content_block_start`, its `content_block_delta`s (`thinking_delta`, `text_delta`, or a
tool call's arguments as one `input_json_delta`), `content_block_stop`; when the engine's
stream ends, `message_delta` with the stop reason and the usage (and, for a request with
context edits, what they cleared), then `message_stop`. The
usage is known only at the end (the engine's last chunk), so `message_start` counts zero
and `message_delta` carries every count (Anthropic's SDKs take its input and cache counts
too). A tool call's block starts as soon as the engine names the tool, but its arguments
are sent whole when the call ends: Anthropic's `input` is a JSON object, and only the whole
arguments show whether the engine's are one (if not, they are kept under `arguments`, as
in a whole answer). An engine failure mid-stream, a chunk of the wrong shape included, becomes an
`error` event, and the stream ends there.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson

from gateway.anthropic.answer import message_shell, stop_reason, tool_input, usage_of
from gateway.chat.conformance import NotAnAnswer, check_shape
from gateway.chat.stream import DONE, chunks_of, first_choice
from gateway.errors import anthropic_error_type


class MessageEvents:
    def __init__(
        self,
        message_id: str,
        request: dict[str, Any],
        *,
        thinking: bool,
        applied_edits: list[dict[str, Any]] | None = None,
        compaction: dict[str, Any] | None = None,
    ) -> None:
        self._id = message_id
        self._applied_edits = applied_edits  # the request's context edits, if it had any
        self._compaction = compaction  # the block the answer starts with, if compacted
        self._request = request
        self._thinking = thinking
        self._blocks = 0  # content blocks opened so far
        self._open: str | None = None  # the open block: "thinking", "text", or a call's key
        self._calls: dict[int, list[str]] = {}  # chat tool-call index -> its argument parts
        self._usage: dict[str, Any] | None = None
        self._finish_reason: str | None = None
        self._engine_stop: Any = None

    @staticmethod
    def _event(kind: str, payload: dict[str, Any]) -> bytes:
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"

    def _start(self) -> list[bytes]:
        message = message_shell(self._id, self._request)
        events = [
            self._event("message_start", {"type": "message_start", "message": message}),
            self._event("ping", {"type": "ping"}),
        ]
        if self._compaction is not None:
            events += self._compaction_block(self._compaction)
        return events

    def _compaction_block(self, block: dict[str, Any]) -> list[bytes]:
        """A compaction block as Anthropic streams one: started empty, its content and
        `encrypted_content` in one `compaction_delta`."""
        index = self._blocks
        self._blocks += 1
        empty = {"type": "compaction", "content": None, "encrypted_content": None}
        delta = {
            "type": "compaction_delta",
            "content": block["content"],
            "encrypted_content": block["encrypted_content"],
        }
        return [
            self._event(
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": empty},
            ),
            self._event(
                "content_block_delta",
                {"type": "content_block_delta", "index": index, "delta": delta},
            ),
            self._event("content_block_stop", {"type": "content_block_stop", "index": index}),
        ]

    def compaction_only(self) -> list[bytes]:
        """The whole stream of an answer that is its compaction block alone
        (`stop_reason: compaction`; no engine was asked)."""
        return [
            *self._start(),
            self._event("message_delta", self._message_delta("compaction", None)),
            self._event("message_stop", {"type": "message_stop"}),
        ]

    def _message_delta(self, reason: str, sequence: str | None) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": usage_of(self._usage),
        }
        if self._applied_edits is not None:
            payload["context_management"] = {"applied_edits": self._applied_edits}
        return payload

    async def convert(self, chat_events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        for event in self._start():
            yield event
        async for raw in chat_events:
            for chunk in chunks_of(raw):
                if chunk is DONE:
                    for event in self._finish():
                        yield event
                    return
                assert isinstance(chunk, dict)
                if "error" in chunk:
                    error = chunk["error"] if isinstance(chunk["error"], dict) else {}
                    yield self._error(error.get("message"))
                    return
                try:
                    check_shape(chunk, "delta")
                except NotAnAnswer as exc:
                    yield self._error(exc.upstream_error().message)
                    return
                for event in self._take(chunk):
                    yield event

    def _error(self, message: Any) -> bytes:
        text = message if isinstance(message, str) and message else None
        error = {"type": anthropic_error_type(502), "message": text or "The engine failed."}
        return self._event("error", {"type": "error", "error": error})

    def _take(self, chunk: dict[str, Any]) -> list[bytes]:
        events: list[bytes] = []
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]
        choice = first_choice(chunk)
        if choice is not None:
            if choice.get("finish_reason"):
                self._finish_reason = choice["finish_reason"]
                self._engine_stop = choice.get("stop_reason")
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if self._thinking and isinstance(reasoning, str) and reasoning:
                block = {"type": "thinking", "thinking": "", "signature": ""}
                delta_of = {"type": "thinking_delta", "thinking": reasoning}
                events += self._delta("thinking", block, delta_of)
            text = delta.get("content")
            if isinstance(text, str) and text:
                events += self._delta(
                    "text", {"type": "text", "text": ""}, {"type": "text_delta", "text": text}
                )
            for call in delta.get("tool_calls") or ():
                events += self._call(call)
        return events

    def _delta(self, key: str, block: dict[str, Any], delta: dict[str, Any]) -> list[bytes]:
        events = self._open_block(key, block) if self._open != key else []
        payload = {"type": "content_block_delta", "index": self._blocks - 1, "delta": delta}
        events.append(self._event("content_block_delta", payload))
        return events

    def _open_block(self, key: str, block: dict[str, Any]) -> list[bytes]:
        events = self._close_block()
        self._open = key
        self._blocks += 1
        payload = {"type": "content_block_start", "index": self._blocks - 1, "content_block": block}
        events.append(self._event("content_block_start", payload))
        return events

    def _close_block(self) -> list[bytes]:
        if self._open is None:
            return []
        events = []
        if self._open.startswith("call:"):  # the arguments, whole
            arguments = "".join(self._calls[int(self._open[5:])])
            partial = orjson.dumps(tool_input(arguments)).decode()
            delta = {"type": "input_json_delta", "partial_json": partial}
            payload = {"type": "content_block_delta", "index": self._blocks - 1, "delta": delta}
            events.append(self._event("content_block_delta", payload))
        self._open = None
        payload = {"type": "content_block_stop", "index": self._blocks - 1}
        events.append(self._event("content_block_stop", payload))
        return events

    def _call(self, call: dict[str, Any]) -> list[bytes]:
        index = int(call.get("index", 0))
        key = f"call:{index}"
        function = call.get("function") or {}
        events: list[bytes] = []
        if index not in self._calls:
            self._calls[index] = []
            block: dict[str, Any] = {
                "type": "tool_use",
                "id": call.get("id") or f"toolu_{self._id[4:]}_{index}",
                "name": function.get("name") or "",
                "input": {},
            }
            events += self._open_block(key, block)
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            self._calls[index].append(arguments)
        return events

    def _finish(self) -> list[bytes]:
        events = self._close_block()
        reason, sequence = stop_reason(
            self._finish_reason, self._engine_stop, self._request, bool(self._calls)
        )
        events.append(self._event("message_delta", self._message_delta(reason, sequence)))
        events.append(self._event("message_stop", {"type": "message_stop"}))
        return events
