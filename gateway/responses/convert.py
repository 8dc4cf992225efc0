"""Between the Responses API's shapes and Chat Completions'.

Input items become chat messages (consecutive `function_call` items one assistant message
with several tool calls; `function_call_output` a tool message; a `reasoning` item the
`reasoning` of the assistant message after it, in the current turn); function tools and
`tool_choice` are rewritten; the engine's chat completion becomes a Response object whose
output is a message item and/or function_call items (and the engine's reasoning, where it
has a reasoning parser, as a reasoning item). Tools: gateway/responses/tools.py. Item
references are refused with a 400 naming the field.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from typing import Any

from gateway.chat.custom_tools import custom_arguments
from gateway.chat.messages import Message
from gateway.errors import InvalidRequest
from gateway.responses.tools import NO_TOOLS, EngineTools, engine_name
from gateway.untrusted.media_urls import check_media_url

_ROLES = {"user", "assistant", "system", "developer"}


def _text_of(content: Any, where: str) -> str:
    """A tool output's (or an instruction's) text: its parts must all be text."""
    made = _content(content, where, ())
    if isinstance(made, str):
        return made
    raise InvalidRequest("These parts must be text.", param=where, code="unsupported_content")


_TEXT_PARTS = ("input_text", "output_text", "text")
_DETAILS = ("low", "high", "auto")


def _content(content: Any, where: str, media_hosts: Collection[str]) -> str | list[dict[str, Any]]:
    """A message's content (at `where`) as chat content: its text, joined (so a text-only
    history has the same bytes whatever parts it came in), or, with images, chat parts in
    order. An assistant's `refusal` part is what it said. An image is passed by its
    `image_url` (a `data:` URL, or one on a host the policy allows: the engine would fetch
    it); a `file_id` names a file this gateway does not keep."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest("Content must be a string or a list of parts.", param=where)
    parts = [_part(p, f"{where}[{j}]", media_hosts) for j, p in enumerate(content)]
    if any(p["type"] == "image_url" for p in parts):
        return parts
    return "".join(p["text"] for p in parts)


def _part(part: Any, param: str, media_hosts: Collection[str]) -> dict[str, Any]:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in _TEXT_PARTS or kind == "refusal":
        assert isinstance(part, dict)
        return {
            "type": "text",
            "text": str(part.get("refusal" if kind == "refusal" else "text", "")),
        }
    if kind != "input_image":
        raise InvalidRequest(
            f"Content parts of type `{kind}` are not supported here; send text or images.",
            param=param,
            code="unsupported_content",
        )
    assert isinstance(part, dict)
    url = part.get("image_url")
    if not isinstance(url, str) or not url:
        raise InvalidRequest(
            "An `input_image` needs its `image_url` (a data: URL): this gateway keeps no "
            "files, so a `file_id` names nothing here.",
            param=param,
            code="unsupported_content",
        )
    check_media_url(url, media_hosts, f"{param}.image_url")
    image = {"url": url}
    if part.get("detail") in _DETAILS:
        image["detail"] = part["detail"]
    return {"type": "image_url", "image_url": image}


def input_messages(
    items: Any,
    compacted: dict[int, list[Message]] | None = None,
    media_hosts: Collection[str] = (),
) -> list[Message]:
    """`compacted`: the messages each `compaction` item stands for, by its index
    (gateway/responses/compaction.py); `media_hosts`: the hosts an image may be named by
    (`limits.media_url_hosts`; none: images come inline)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list):
        raise InvalidRequest("`input` must be a string or a list of items.", param="input")
    messages: list[Message] = []
    thought: str | None = None  # a reasoning item's, for the assistant message after it
    for i, item in enumerate(items):
        param = f"input[{i}]"
        if not isinstance(item, dict):
            raise InvalidRequest("Each input item must be an object.", param=param)
        kind = item.get("type", "message")
        if kind == "reasoning":
            thought = _reasoning_text(item)
            continue
        if kind == "message":
            role = item.get("role")
            if not isinstance(role, str) or role not in _ROLES:  # a list is unhashable
                raise InvalidRequest(f"Unknown role `{role}`.", param=f"{param}.role")
            role = "system" if role == "developer" else role  # templates know `system`
            content = _content(item.get("content"), f"{param}.content", media_hosts)
            messages.append({"role": role, "content": content})
        elif kind in ("function_call", "custom_tool_call"):
            if kind == "function_call":
                name = engine_name(item.get("namespace"), item.get("name"))
                arguments = item.get("arguments") or ""
            else:  # offered to the engine as a function of one string (responses/tools.py)
                name, arguments = item.get("name"), custom_arguments(item.get("input"))
            call = {
                "id": str(item.get("call_id") or item.get("id") or ""),
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
            last = messages[-1] if messages else None
            if last and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            output = item.get("output")
            messages.append({
                "role": "tool",
                "tool_call_id": str(item.get("call_id") or ""),
                "content": output if isinstance(output, str)
                           else _text_of(output, f"{param}.output"),
            })  # fmt: skip
        elif kind == "compaction" and compacted is not None and i in compacted:
            messages.extend(compacted[i])
        else:
            raise InvalidRequest(
                f"Input items of type `{kind}` are not supported by this gateway.",
                param=f"{param}.type",
                code="unsupported_item",
            )
        last = messages[-1] if messages else None
        if thought is not None and last and last["role"] == "assistant" and "reasoning" not in last:
            last["reasoning"] = thought  # the thought behind this answer or call
        thought = None
    return _reasoning_of_this_turn(messages)


def _reasoning_text(item: dict[str, Any]) -> str | None:
    """The thought a reasoning item carries: its `reasoning_text` content (an open model's
    own, as vLLM gives it), else its summary (this gateway's items hold the engine's whole
    reasoning there). None for one that holds only another provider's encrypted thought."""
    content, summary = item.get("content"), item.get("summary")
    parts: list[Any] = content if isinstance(content, list) and content else []
    if not parts and isinstance(summary, list):
        parts = summary
    texts = [p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)]
    return "\n\n".join(texts) or None


def _reasoning_of_this_turn(messages: list[Message]) -> list[Message]:
    """The engine's reasoning replayed on the assistant messages since the last user
    message only: a reasoning model reads its own thought through a tool loop (gpt-oss's
    harmony format needs it), and its chat template drops earlier turns' anyway (Qwen3's
    does), so earlier thoughts are left out rather than sent to be ignored."""
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    for i in range(last_user):
        if "reasoning" in messages[i]:
            messages[i] = {k: v for k, v in messages[i].items() if k != "reasoning"}
    return messages


_CALLABLE = ("function", "custom")  # tools the engine is offered as chat functions


def chat_tool_choice(choice: Any) -> Any:
    """The Responses API's `tool_choice` in Chat Completions' shape (`allowed_tools` is
    then read, and checked, as a chat request's: gateway/toolcalls/tool_choice.py)."""
    if choice is None or isinstance(choice, str):
        return choice
    if isinstance(choice, dict) and choice.get("type") in _CALLABLE:
        return {"type": "function", "function": {"name": choice.get("name")}}
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        listed = choice.get("tools")
        tools = [
            {"type": "function", "function": {"name": tool.get("name")}}
            if isinstance(tool, dict) and tool.get("type") in _CALLABLE
            else tool
            for tool in (listed if isinstance(listed, list) else ())
        ]
        return {
            "type": "allowed_tools",
            "allowed_tools": {"mode": choice.get("mode"), "tools": tools},
        }
    raise InvalidRequest("Unsupported `tool_choice`.", param="tool_choice")


def chat_body(
    request: dict[str, Any], messages: list[Message], stream: bool, tools: EngineTools = NO_TOOLS
) -> dict[str, Any]:
    body: dict[str, Any] = {"model": request["model"], "messages": messages}
    if not tools.tools and request.get("tool_choice") not in (None, "auto", "none"):
        raise InvalidRequest(  # as vLLM answers a chat request; dropping it would lose the ask
            "`tool_choice` asks for a tool call, and the request declares no tool the engine "
            "can call" + (f" ({', '.join(tools.dropped)} left out)." if tools.dropped else "."),
            param="tool_choice",
            code="invalid_value",
        )
    if tools.tools:
        body["tools"] = tools.tools
        if request.get("tool_choice") is not None:
            body["tool_choice"] = chat_tool_choice(request["tool_choice"])
        if request.get("parallel_tool_calls") is not None:
            body["parallel_tool_calls"] = request["parallel_tool_calls"]
    for ours, theirs in (("max_output_tokens", "max_tokens"), ("temperature", "temperature"),
                         ("top_p", "top_p")):  # fmt: skip
        if request.get(ours) is not None:
            body[theirs] = request[ours]
    text_format = (request.get("text") or {}).get("format") or {}
    if text_format.get("type") == "json_schema":
        schema = {k: text_format[k] for k in ("name", "schema", "strict") if k in text_format}
        body["response_format"] = {"type": "json_schema", "json_schema": schema}
    elif text_format.get("type") == "json_object":
        body["response_format"] = {"type": "json_object"}
    if request.get("prompt_cache_key") is not None:
        body["prompt_cache_key"] = request["prompt_cache_key"]  # affinity (prompt/blocks.py)
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


def usage_of(chat_usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if not chat_usage:
        return None
    details = chat_usage.get("prompt_tokens_details") or {}
    prompt = int(chat_usage.get("prompt_tokens") or 0)
    completion = int(chat_usage.get("completion_tokens") or 0)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {
            "cached_tokens": int(details.get("cached_tokens") or 0),
            "cache_write_tokens": 0,  # vLLM does not report cache writes
        },
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


def output_items(
    response_id: str, message: Message, tools: EngineTools = NO_TOOLS
) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:  # the engine's, from its reasoning parser
        items.append(reasoning_item(response_id, reasoning))
    content = message.get("content")
    if content:
        items.append(message_item(response_id, str(content)))
    for i, call in enumerate(message.get("tool_calls") or ()):
        function = call.get("function") or {}
        name = str(function.get("name") or "")
        ids = call_ids(response_id, i, call.get("id"), custom=name in tools.custom)
        items.append(call_item(tools, name, function.get("arguments") or "", **ids))
    return items


def call_ids(response_id: str, index: int, engine_id: Any, *, custom: bool) -> dict[str, str]:
    """A call item's `id` and `call_id` (the engine's call id, where it gave one)."""
    return {
        "id": f"{'ctc' if custom else 'fc'}_{response_id[5:]}_{index}",
        "call_id": engine_id or f"call_{response_id[5:]}_{index}",
    }


def call_item(
    tools: EngineTools,
    name: str,
    arguments: str,
    *,
    id: str,
    call_id: str,
    status: str = "completed",
) -> dict[str, Any]:
    """One call of the engine's as an output item: a `function_call`, or for a custom
    tool a `custom_tool_call` (which has no `status` in OpenAI's schema)."""
    made = tools.call_item(name, arguments)
    item = {"type": made["type"], "id": id, "call_id": call_id, **made}
    if made["type"] != "custom_tool_call":
        item["status"] = status
    return item


def reasoning_item(response_id: str, text: str) -> dict[str, Any]:
    """The engine's reasoning as a summary; nothing is encrypted (there is no key), so
    `encrypted_content` is null even when `include` asks for it."""
    return {
        "type": "reasoning",
        "id": f"rs_{response_id[5:]}",
        "summary": [{"type": "summary_text", "text": text}],
        "encrypted_content": None,
    }


def developer_item(message: Message) -> dict[str, Any]:
    """A leading system / developer message, given back as the input item it came as."""
    content = message.get("content")
    text = content if isinstance(content, str) else _text_of(content, "input")
    return {"type": "message", "role": "developer",
            "content": [{"type": "input_text", "text": text}]}  # fmt: skip


def message_item(response_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "message",
        "id": f"msg_{response_id[5:]}",
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def response_object(
    response_id: str,
    request: dict[str, Any],
    *,
    status: str,
    created_at: int,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None,
    finish_reason: str | None = None,
) -> dict[str, Any]:
    incomplete = None
    if status == "completed" and finish_reason == "length":
        status, incomplete = "incomplete", {"reason": "max_output_tokens"}
    text_format = (request.get("text") or {}).get("format") or {"type": "text"}
    response: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "completed_at": int(time.time()) if status == "completed" else None,
        "error": None,
        "incomplete_details": incomplete,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "model": request["model"],
        "output": output,
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "previous_response_id": request.get("previous_response_id"),
        "reasoning": None,
        "store": request.get("store", True),
        "temperature": request.get("temperature", 1.0),
        "text": {"format": text_format},
        "tool_choice": request.get("tool_choice", "auto"),
        "tools": request.get("tools") or [],
        "top_p": request.get("top_p", 1.0),
        "truncation": "disabled",
        "metadata": request.get("metadata") or {},
        "background": False,  # a `background` request is answered in the foreground
    }
    # Optional fields the spec types without null: present only with a value.
    if usage is not None:
        response["usage"] = usage
    if isinstance(request.get("user"), str):
        response["user"] = request["user"]
    return response
