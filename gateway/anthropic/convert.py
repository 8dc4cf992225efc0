"""Between the Anthropic Messages API's shapes and Chat Completions'.

A Messages request becomes the chat request the engine is sent, the way vLLM's own Messages
API converts it (vllm/entrypoints/anthropic/serving.py), so the engine sees the same prompt
(tests/integration/test_anthropic.py compares the counts): `system` the first message,
its blocks joined, less Claude Code's `x-anthropic-billing-header` block (a per-request
hash that would make every prompt's prefix new to the engine's cache); `system` messages
inside the conversation (Claude Code's reminders) kept where they are; text blocks
message text; `tool_use` blocks an assistant's tool calls and
`tool_result` blocks tool messages (placed first: a chat template wants results right
after the calls they answer); base64 images image parts. Client tools become function
tools, `tool_choice` is rewritten, `stop_sequences` become `stop`, an `output_config`
JSON schema the `response_format`. Tools Anthropic runs or
defines (`web_search_*`, `bash_*`, `text_editor_*`, ...) are left out of what the engine sees
(the caller is told which, in a header), and so are their calls and results in a history
from Anthropic's API (`server_tool_use`, `web_search_tool_result`, ...). Text documents
and search results are text, their title first; a PDF or URL document is refused. Thinking
blocks in the history become the assistant message's `reasoning`, as vLLM's own endpoint
passes them (its chat template decides what it renders), for the turns Anthropic's rules
keep (gateway/anthropic/context_editing.py: the last one by default, none with thinking
off); `thinking` is accepted, and the engine's own reasoning, where it has a reasoning
parser, is returned in thinking blocks; nothing is invented where it has none.

The answer's way back: gateway/anthropic/answer.py.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.chat.messages import Message
from gateway.errors import InvalidRequest

_ROLES = {"user", "assistant", "system"}
_BILLING_HEADER = "x-anthropic-billing-header"
_SAMPLING = ("temperature", "top_p", "top_k")
# Claude Code's `metadata.user_id`: `user_<hash>_account_<uuid>_session_<uuid>` (or a JSON
# object with `session_id`, in later versions): the session part names the conversation.
_SESSION_IN_USER_ID = re.compile(r"_session_([0-9A-Za-z-]{8,64})$")
_SESSION_ID = re.compile(r"[0-9A-Za-z-]{8,64}")
_MAX_USER_ID = 1000  # longer is no id a client sends: not parsed
# Blocks of tools Anthropic runs (server tools, MCP connectors) in an assistant's history:
# left out, as the engine ran none of them (their results end in `_tool_result`).
_SERVER_BLOCKS = frozenset({"server_tool_use", "mcp_tool_use", "container_upload"})


@dataclass(frozen=True)
class ChatRequest:
    """What a Messages request becomes: the chat body, and what the answer needs."""

    body: dict[str, Any]
    dropped_tools: tuple[str, ...]  # tools the engine cannot run, left out
    thinking: bool  # the client asked for thinking blocks
    conversation: str | None  # the client's own conversation id (Claude Code's session)
    # The last `compaction` block of the history (its `content` and `encrypted_content`):
    # everything before it was left out, and the conversation it stands for goes at
    # `compacted_at` of the messages (gateway/anthropic/compaction.py puts it there).
    compaction: dict[str, Any] | None = None
    compacted_at: int = 0


def chat_request(
    request: dict[str, Any], session_header: str | None = None, *, refuse_hosted: bool = False
) -> ChatRequest:
    """The chat request a (parsed, limit-checked) Messages request becomes.
    `session_header`: Claude Code's `X-Claude-Code-Session-Id`, if sent."""
    messages: list[Message] = []
    system = request.get("system")
    if system is not None:
        text = _system_text(system, "system")
        if text:
            messages.append({"role": "system", "content": text})
    turns = request.get("messages")
    if not isinstance(turns, list):
        raise InvalidRequest("`messages` must be a list.", param="messages")
    first, compaction = _after_compaction(turns)
    compacted_at = len(messages)
    for i in range(first, len(turns)):
        turn = turns[i]
        if compaction is not None and i == first:  # the blocks after the compaction block
            turn = {**turn, "content": turn["content"][compaction["block"] + 1 :]}
            if not turn["content"]:
                continue
        messages += _chat_messages(turn, f"messages.{i}")
    body: dict[str, Any] = {"model": request["model"], "messages": messages}
    body["max_tokens"] = request["max_tokens"]
    tools, dropped = _chat_tools(request.get("tools"), refuse_hosted)
    if tools:
        body["tools"] = tools
        choice = request.get("tool_choice")
        if choice is not None:
            body.update(_chat_tool_choice(choice))
    stop = request.get("stop_sequences")
    if stop is not None:
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise InvalidRequest(
                "`stop_sequences` must be a list of strings.", param="stop_sequences"
            )
        if stop:
            body["stop"] = stop
    for name in _SAMPLING:
        value = request.get(name)
        if value is not None:
            if type(value) not in (int, float):
                raise InvalidRequest(f"`{name}` must be a number.", param=name)
            body[name] = value
    response_format = _response_format(request.get("output_config"))
    if response_format is not None:
        body["response_format"] = response_format
    conversation = conversation_of(request.get("metadata"))
    if session_header and _SESSION_ID.fullmatch(session_header):
        conversation = f"claude:{session_header}"
    if conversation is not None:
        body["prompt_cache_key"] = conversation  # affinity (gateway/prompt/blocks.py)
    if request.get("stream"):
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    thinking = _thinking(request.get("thinking"))
    if compaction is None:
        return ChatRequest(body, dropped, thinking, conversation)
    kept = {k: compaction[k] for k in ("content", "encrypted_content")}
    return ChatRequest(body, dropped, thinking, conversation, kept, compacted_at)


def _after_compaction(turns: list[Any]) -> tuple[int, dict[str, Any] | None]:
    """Where the history starts: at its last `compaction` block, as Anthropic's API drops
    every block before one (the block stands for them); at the start if it has none. A block
    whose `content` is null (a compaction that failed) stands for nothing and is skipped."""
    for i in range(len(turns) - 1, -1, -1):
        turn = turns[i]
        if not isinstance(turn, dict) or not isinstance(turn.get("content"), list):
            continue
        for j in range(len(turn["content"]) - 1, -1, -1):
            block = turn["content"][j]
            if not isinstance(block, dict) or block.get("type") != "compaction":
                continue
            content = block.get("content")
            if content is None:
                continue
            param = f"messages.{i}.content.{j}"
            found = {
                "content": _string(content, f"{param}.content"),
                "encrypted_content": block.get("encrypted_content"),
                "block": j,
            }
            return i, found
    return 0, None


def _response_format(output_config: Any) -> dict[str, Any] | None:
    """`output_config.format` (a JSON schema the answer must follow) as the chat request's
    `response_format`, which the gateway vets and checks like any other (`effort` has no
    counterpart in the engine and is ignored)."""
    if output_config is None:
        return None
    if not isinstance(output_config, dict):
        raise InvalidRequest("`output_config` must be an object.", param="output_config")
    output_format = output_config.get("format")
    if output_format is None:
        return None
    if (
        not isinstance(output_format, dict)
        or output_format.get("type") != "json_schema"
        or not isinstance(output_format.get("schema"), dict)
    ):
        raise InvalidRequest(
            "`output_config.format` must be `{type: json_schema, schema: {...}}`.",
            param="output_config.format",
        )
    return {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": output_format["schema"]},
    }


def conversation_of(metadata: Any) -> str | None:
    """The conversation Claude Code names in `metadata.user_id` (its session), if any:
    `{"device_id": ..., "session_id": ...}` as a JSON string (2.1), or
    `user_<hash>_account_<uuid>_session_<uuid>` (earlier versions)."""
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise InvalidRequest("`metadata` must be an object.", param="metadata")
    user_id = metadata.get("user_id")
    if user_id is None:
        return None
    if not isinstance(user_id, str):
        raise InvalidRequest("`metadata.user_id` must be a string.", param="metadata.user_id")
    if len(user_id) > _MAX_USER_ID:
        return None
    if user_id.startswith("{"):
        try:
            parsed = orjson.loads(user_id)
        except orjson.JSONDecodeError:
            return None
        session = parsed.get("session_id") if isinstance(parsed, dict) else None
        if isinstance(session, str) and _SESSION_ID.fullmatch(session):
            return f"claude:{session}"
        return None
    match = _SESSION_IN_USER_ID.search(user_id)
    return f"claude:{match.group(1)}" if match else None


def _thinking(thinking: Any) -> bool:
    if thinking is None:
        return False
    if not isinstance(thinking, dict) or thinking.get("type") not in (
        "enabled",
        "disabled",
        "adaptive",
    ):
        raise InvalidRequest(
            "`thinking` must be an object whose `type` is `enabled`, `adaptive` or `disabled`.",
            param="thinking",
        )
    return bool(thinking["type"] != "disabled")


def _system_text(content: Any, param: str) -> str:
    """A system prompt: a string, or text blocks joined, Claude Code's billing header left
    out."""
    texts = _texts(content, param, "system")
    return "".join(text for text in texts if not text.startswith(_BILLING_HEADER))


def _texts(content: Any, param: str, where: str) -> list[str]:
    """The texts of a string or a list of text blocks."""
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        raise InvalidRequest(f"`{param}` must be a string or a list of blocks.", param=param)
    texts = []
    for i, block in enumerate(content):
        if not isinstance(block, dict) or block.get("type") != "text":
            kind = block.get("type") if isinstance(block, dict) else None
            raise InvalidRequest(
                f"Blocks of type `{kind}` are not supported in a {where}; send text.",
                param=f"{param}.{i}.type",
            )
        texts.append(_string(block.get("text"), f"{param}.{i}.text"))
    return texts


def _string(value: Any, param: str) -> str:
    if not isinstance(value, str):
        raise InvalidRequest(f"`{param}` must be a string.", param=param)
    return value


def _chat_messages(turn: Any, param: str) -> list[Message]:
    if not isinstance(turn, dict):
        raise InvalidRequest("Each message must be an object.", param=param)
    role = turn.get("role")
    if not isinstance(role, str) or role not in _ROLES:
        raise InvalidRequest(
            f"Unknown role `{role}`: messages are `user` or `assistant`.",
            param=f"{param}.role",
        )
    content = turn.get("content")
    if role == "system":
        text = _system_text(content, f"{param}.content")
        return [{"role": "system", "content": text}] if text else []
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise InvalidRequest(
            "`content` must be a string or a list of blocks.", param=f"{param}.content"
        )
    if role == "assistant":
        return [_assistant(content, f"{param}.content")]
    return _user(content, f"{param}.content")


def _assistant(blocks: list[Any], param: str) -> Message:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for i, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        where = f"{param}.{i}"
        if kind == "text":
            texts.append(_string(block.get("text"), f"{where}.text"))
        elif kind == "tool_use":  # arguments serialised as vLLM's own Messages API does
            arguments = block.get("input", {})
            if not isinstance(arguments, dict):
                raise InvalidRequest("`input` must be an object.", param=f"{where}.input")
            calls.append({
                "id": _string(block.get("id"), f"{where}.id"),
                "type": "function",
                "function": {
                    "name": _string(block.get("name"), f"{where}.name"),
                    "arguments": json.dumps(arguments),
                },
            })  # fmt: skip
        elif kind == "thinking":  # the engine's reasoning, as vLLM's own endpoint passes it
            thought = block.get("thinking")
            if isinstance(thought, str) and thought:
                reasoning.append(thought)
        elif kind in ("redacted_thinking", "compaction"):
            # an encrypted thought means nothing to the engine; a compaction block is read
            # where the history starts (`_after_compaction`), and a failed one is nothing
            continue
        elif isinstance(kind, str) and (kind in _SERVER_BLOCKS or kind.endswith("_tool_result")):
            continue  # a tool Anthropic ran, in a history from its API: the engine ran none
        else:
            raise InvalidRequest(
                f"Assistant blocks of type `{kind}` are not supported by this gateway.",
                param=f"{where}.type",
            )
    message: Message = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        message["tool_calls"] = calls
    if reasoning:  # kept for the last turns only (gateway/anthropic/context_editing.py)
        message["reasoning"] = "".join(reasoning)
    return message


def _user(blocks: list[Any], param: str) -> list[Message]:
    results: list[Message] = []
    parts: list[dict[str, Any]] = []
    for i, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        where = f"{param}.{i}"
        if kind == "text":
            text = _string(block.get("text"), f"{where}.text")
            if text:
                parts.append({"type": "text", "text": text})
        elif kind == "image":
            parts.append(_image(block.get("source"), f"{where}.source"))
        elif kind == "tool_result":
            results += _tool_result(block, where)
        elif kind == "document":
            parts.append({"type": "text", "text": _document(block, where)})
        elif kind == "search_result":
            parts.append({"type": "text", "text": _search_result(block, where)})
        elif kind == "compaction":
            continue  # read where the history starts (`_after_compaction`)
        else:
            raise InvalidRequest(
                f"User blocks of type `{kind}` are not supported by this gateway.",
                param=f"{where}.type",
            )
    if not parts and not results:  # Anthropic refuses it too; the engine would get nothing
        raise InvalidRequest("Text content blocks must be non-empty.", param=param)
    if not parts:
        return results
    if len(parts) == 1 and parts[0]["type"] == "text":  # as vLLM's own conversion
        return [*results, {"role": "user", "content": parts[0]["text"]}]
    return [*results, {"role": "user", "content": parts}]


def _document(block: dict[str, Any], param: str) -> str:
    """A document as the text the engine reads: its title and context, then its text
    (a plain-text source, or a content source's text blocks). A PDF, a URL or a file id
    is refused: vLLM reads no PDF, and the gateway fetches nothing a request names."""
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "text":
        assert isinstance(source, dict)
        body = _string(source.get("data"), f"{param}.source.data")
    elif kind == "content":
        assert isinstance(source, dict)
        body = "\n".join(_texts(source.get("content"), f"{param}.source.content", "document"))
    else:
        raise InvalidRequest(
            f"Documents with a `{kind}` source are not supported by this gateway: send the "
            "document's text (a `text` or `content` source).",
            param=f"{param}.source",
        )
    head = [block[k] for k in ("title", "context") if isinstance(block.get(k), str) and block[k]]
    return "\n\n".join([*head, body])


def _search_result(block: dict[str, Any], param: str) -> str:
    """A search result as the text the engine reads: its title and source, then its text."""
    texts = _texts(block.get("content"), f"{param}.content", "search result")
    head = [block[k] for k in ("title", "source") if isinstance(block.get(k), str) and block[k]]
    return "\n\n".join(["\n".join(head), *texts] if head else texts)


def _tool_result(block: dict[str, Any], param: str) -> list[Message]:
    """A tool message with the result's texts; its images, if any, in a user message after
    it (a tool message carries text only)."""
    content = block.get("content", "")
    texts: list[str] = []
    images: list[dict[str, Any]] = []
    if isinstance(content, str):
        texts.append(content)
    elif isinstance(content, list):
        for i, item in enumerate(content):
            kind = item.get("type") if isinstance(item, dict) else None
            where = f"{param}.content.{i}"
            if kind == "text":
                texts.append(_string(item.get("text"), f"{where}.text"))
            elif kind == "image":
                images.append(_image(item.get("source"), f"{where}.source"))
            elif kind != "tool_reference":  # a deferred tool's name: nothing to show
                raise InvalidRequest(
                    f"Tool result blocks of type `{kind}` are not supported.", param=where
                )
    elif content is not None:
        raise InvalidRequest(
            "`content` must be a string or a list of blocks.", param=f"{param}.content"
        )
    call_id = _string(block.get("tool_use_id"), f"{param}.tool_use_id")
    result: list[Message] = [{"role": "tool", "tool_call_id": call_id, "content": "\n".join(texts)}]
    if images:
        result.append({"role": "user", "content": images})
    return result


def _image(source: Any, param: str) -> dict[str, Any]:
    """A base64 image, as a data URL the engine decodes itself. Image URLs are refused:
    the engine would fetch them, and the gateway never fetches what a request names."""
    if not isinstance(source, dict) or source.get("type") != "base64":
        raise InvalidRequest(
            "Only base64 image sources are supported (this gateway fetches no URLs).",
            param=param,
        )
    media = _string(source.get("media_type"), f"{param}.media_type")
    data = _string(source.get("data"), f"{param}.data")
    return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{data}"}}


def _chat_tools(tools: Any, refuse_hosted: bool) -> tuple[list[dict[str, Any]], tuple[str, ...]]:
    if tools is None:
        return [], ()
    if not isinstance(tools, list):
        raise InvalidRequest("`tools` must be a list.", param="tools")
    out: list[dict[str, Any]] = []
    dropped: list[str] = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise InvalidRequest("Each tool must be an object.", param=f"tools.{i}")
        name = _string(tool.get("name"), f"tools.{i}.name")
        if tool.get("type") not in (None, "custom"):  # run or defined by Anthropic
            if refuse_hosted:
                raise InvalidRequest(
                    f"Tools of type `{tool['type']}` run where the engine cannot; this gateway "
                    "is set to refuse them (`limits.hosted_tools`).",
                    param=f"tools.{i}.type",
                )
            dropped.append(name)
            continue
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise InvalidRequest(
                "`input_schema` must be an object.", param=f"tools.{i}.input_schema"
            )
        function: dict[str, Any] = {"name": name, "parameters": schema}
        description = tool.get("description")
        if description is not None:
            description = _string(description, f"tools.{i}.description")
        examples = _input_examples(tool.get("input_examples"), f"tools.{i}.input_examples")
        if examples:
            description = f"{description}\n\n{examples}" if description else examples
        if description is not None:
            function["description"] = description
        if tool.get("strict") is True:  # the engine constrains the call to the schema
            function["strict"] = True
        out.append({"type": "function", "function": function})
    return out, tuple(dropped)


def _input_examples(examples: Any, param: str) -> str | None:
    """A tool's `input_examples` as its description's last lines: the only place a chat
    template shows them to the model (Anthropic's API puts them in its prompt too)."""
    if examples is None:
        return None
    if not isinstance(examples, list) or not all(isinstance(e, dict) for e in examples):
        raise InvalidRequest("`input_examples` must be a list of objects.", param=param)
    if not examples:
        return None
    lines = (orjson.dumps(e, option=orjson.OPT_SORT_KEYS).decode() for e in examples)
    return "Examples of input:\n" + "\n".join(lines)


def _chat_tool_choice(choice: Any) -> dict[str, Any]:
    if not isinstance(choice, dict):
        raise InvalidRequest("`tool_choice` must be an object.", param="tool_choice")
    kind = choice.get("type")
    fields: dict[str, Any] = {}
    if kind == "auto":
        fields["tool_choice"] = "auto"
    elif kind == "any":
        fields["tool_choice"] = "required"
    elif kind == "none":
        fields["tool_choice"] = "none"
    elif kind == "tool":
        name = _string(choice.get("name"), "tool_choice.name")
        fields["tool_choice"] = {"type": "function", "function": {"name": name}}
    else:
        raise InvalidRequest(
            "`tool_choice.type` must be `auto`, `any`, `tool` or `none`.",
            param="tool_choice.type",
        )
    if choice.get("disable_parallel_tool_use") is True:
        fields["parallel_tool_calls"] = False
    return fields
