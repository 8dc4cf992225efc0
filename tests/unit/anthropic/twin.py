"""The engine twin the Anthropic API's unit tests talk to: a scripted replica that
answers a chat completion (whole or streamed) in words, or with a call to the first tool
when made to, and counts 42 tokens for `/tokenize`."""

from __future__ import annotations

from typing import Any

import orjson

from tests.fakes import Call, Scripted

WEATHER: Any = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
USAGE = {"prompt_tokens": 40, "completion_tokens": 3, "total_tokens": 43,
         "prompt_tokens_details": {"cached_tokens": 32}}  # fmt: skip
CALL_DELTAS = [
    b'{"choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,'
    b'"id":"call_9","type":"function","function":{"name":"get_weather","arguments":""}}]}}]}',
    b'{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":'
    b'{"arguments":"{\\"city\\": "}}]}}]}',
    b'{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":'
    b'{"arguments":"\\"Oslo\\"}"}}]}}]}',
    b'{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}',
]
TEXT_DELTAS = [
    b'{"choices":[{"index":0,"delta":{"role":"assistant","content":"Sunny"}}]}',
    b'{"choices":[{"index":0,"delta":{"content":" today"}}]}',
    b'{"choices":[{"index":0,"delta":{},"finish_reason":"stop","stop_reason":null}]}',
]


def engine(call: Call) -> Scripted:
    """Calls the first tool it is given when made to (tool_choice names it); else answers
    `Sunny today`. `/tokenize` counts 42."""
    if call.url.endswith("/tokenize"):
        return Scripted(body=b'{"count": 42, "max_model_len": 2048, "tokens": []}')
    body = orjson.loads(call.body)
    calls = isinstance(body.get("tool_choice"), dict) or body.get("tool_choice") == "required"
    usage = b',"usage":' + orjson.dumps(USAGE)
    if body.get("stream"):
        deltas = CALL_DELTAS if calls else TEXT_DELTAS
        final = b'{"choices":[]' + usage + b"}"
        chunks = [b"data: " + d + b"\n\n" for d in [*deltas, final]] + [b"data: [DONE]\n\n"]
        return Scripted(chunks=chunks, content_type="text/event-stream")
    message: dict[str, Any] = {"role": "assistant", "content": "Sunny today"}
    if calls:
        message = {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_9", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]}  # fmt: skip
    completion = {
        "id": "c", "object": "chat.completion", "created": 1, "model": "served-tiny",
        "choices": [{"index": 0, "message": message,
                     "finish_reason": "tool_calls" if calls else "stop"}],
        "usage": USAGE,
    }  # fmt: skip
    return Scripted(body=orjson.dumps(completion))
