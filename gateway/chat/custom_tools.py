"""OpenAI's `custom` tools (free-form tools, 2025) as the engine can take them, and back.

A custom tool's input is text, not JSON arguments: unconstrained, or under a grammar the
client gives (Lark or a regular expression). vLLM knows only function tools, so each
custom tool is offered to it as a function of one string argument, `input`:

- a `regex` grammar becomes that string's `pattern` (anchored: the whole input must
  match), which the gateway's tool-call check holds every call to (RE2, in linear time;
  a pattern RE2 cannot run leaves the argument unchecked) and which the engine enforces
  where it constrains the call (a named `tool_choice`, a `strict` tool);
- a `lark` grammar is compiled (a 400 when it does not compile) and put in the argument's
  schema as `x-grammar`, where the tool-call check matches every call's input against it
  with llguidance, bounded (gateway/untrusted/lark_grammars.py) and the model reads it;
  the engine does not enforce it. A grammar of more than 8,000 characters is described
  only (its start, in the argument's description), as before.

The engine's call of such a function comes back to the client as a custom call with that
`input`. Both APIs that have custom tools use this: the Responses API
(gateway/responses/tools.py) and Chat Completions, whose request and answer are rewritten
here, around the pipeline, as legacy `functions` are (gateway/chat/legacy_functions.py):

- `tools[i] = {"type": "custom", "custom": {"name", "description", "format"}}` -> that
  function; `tool_choice` `{"type": "custom", "custom": {"name"}}` -> the function named,
  and the same inside `allowed_tools`;
- an assistant message's `{"type": "custom", "custom": {"name", "input"}}` call -> a
  function call whose arguments are `{"input": ...}`, so every turn's prompt says the same
  bytes for the same history;
- in the answer, each call to a custom tool -> `{"id", "type": "custom", "custom":
  {"name", "input"}}`; in a stream, the call is sent as one delta once it is complete
  (its arguments are the JSON of its input, which means nothing to the client until they
  are whole).
Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson

from gateway.chat.sse import data_event
from gateway.chat.stream import DONE, ChatEvent
from gateway.errors import InvalidRequest
from gateway.untrusted.lark_grammars import (
    GRAMMAR_CHARS,
    GRAMMAR_KEYWORD,
    UnusableGrammar,
    lark_grammar,
)

CUSTOM_INPUT = "input"  # the one argument a custom tool's function takes


def custom_function(
    name: str,
    description: Any,
    syntax: Any = None,
    definition: Any = None,
    *,
    param: str = "tools",
) -> dict[str, Any]:
    """A custom tool as a chat function tool of one string, its grammar (if any) applied
    where it can be (`regex`, `lark`) and described in any case. `param`: where the
    grammar's definition is in the client's request, for the 400 of one that does not
    compile."""
    described = "The tool's whole input, as free text."
    argument: dict[str, Any] = {"type": "string"}
    if isinstance(definition, str) and definition:
        syntax = syntax if isinstance(syntax, str) else ""
        if syntax == "lark" and len(definition) <= GRAMMAR_CHARS:
            try:
                lark_grammar(definition)
            except UnusableGrammar as exc:
                raise InvalidRequest(
                    f"Invalid Lark grammar: {exc}.", param=param, code="invalid_grammar"
                ) from None
            # Read by the tool-call check (gateway/toolcalls/arguments_schema.py) and by
            # the model, as part of the tool's schema.
            argument[GRAMMAR_KEYWORD] = {"syntax": "lark", "definition": definition}
            described += f" It must follow the lark grammar in `{GRAMMAR_KEYWORD}`."
        else:
            described += f" It must follow this {syntax} grammar:\n{definition[:GRAMMAR_CHARS]}"
        if syntax == "regex" and len(definition) <= GRAMMAR_CHARS:
            argument["pattern"] = f"^(?:{definition})$"
    argument["description"] = described
    parameters = {
        "type": "object",
        "properties": {CUSTOM_INPUT: argument},
        "required": [CUSTOM_INPUT],
        "additionalProperties": False,
    }
    function: dict[str, Any] = {"name": name, "parameters": parameters}
    if isinstance(description, str):
        function["description"] = description
    return {"type": "function", "function": function}


def custom_input(arguments: str) -> str:
    """A custom tool's input from the function call the engine made: its `input`, or the
    arguments as they are when they are not that object (the tool-call check has then
    judged them already)."""
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments
    value = parsed.get(CUSTOM_INPUT) if isinstance(parsed, dict) else None
    return value if isinstance(value, str) else arguments


def custom_arguments(text: Any) -> str:
    """A history's custom call as the engine's function call made it."""
    return orjson.dumps({CUSTOM_INPUT: text if isinstance(text, str) else ""}).decode()


# Chat Completions


def to_functions(body: dict[str, Any]) -> tuple[dict[str, Any], frozenset[str]] | None:
    """The request with its custom tools, tool choice and history calls as functions, and
    the custom tools' names; None when it declares no custom tool. Every chat request
    that declares tools is asked, so this is a look at each tool's type (about 1 us for
    tau-bench's 14); a history that calls a custom tool the request does not declare is
    refused by gateway/chat/inbound.py, which reads every call anyway."""
    tools = body.get("tools")
    if tools.__class__ is not list:
        return None
    for tool in tools:
        if tool.__class__ is dict and tool.get("type") == "custom":
            break
    else:
        return None
    names: set[str] = set()
    out = dict(body)
    out["tools"] = [_tool(tool, i, names) for i, tool in enumerate(tools)]
    if "tool_choice" in body:
        out["tool_choice"] = _tool_choice(body["tool_choice"])
    messages = body.get("messages")
    if isinstance(messages, list):
        out["messages"] = [_message(m, i) for i, m in enumerate(messages)]
    return out, frozenset(names)


def _tool(tool: Any, i: int, names: set[str]) -> Any:
    if not isinstance(tool, dict) or tool.get("type") != "custom":
        return tool  # the pipeline checks (and refuses) the rest
    spec = tool.get("custom")
    name = spec.get("name") if isinstance(spec, dict) else None
    if not isinstance(spec, dict) or not isinstance(name, str) or not name:
        raise InvalidRequest(
            f"Missing required parameter: 'tools[{i}].custom.name'.",
            param=f"tools[{i}].custom.name",
            code="missing_required_parameter",
        )
    syntax = definition = None
    form = spec.get("format")
    if isinstance(form, dict) and form.get("type") == "grammar":
        grammar = form.get("grammar")
        if isinstance(grammar, dict):
            syntax, definition = grammar.get("syntax"), grammar.get("definition")
    names.add(name)
    where = f"tools[{i}].custom.format.grammar.definition"
    return custom_function(name, spec.get("description"), syntax, definition, param=where)


def _tool_choice(choice: Any) -> Any:
    if not isinstance(choice, dict):
        return choice
    if choice.get("type") == "custom":
        return _named(choice, "tool_choice")
    allowed = choice.get("allowed_tools")
    if choice.get("type") != "allowed_tools" or not isinstance(allowed, dict):
        return choice  # gateway/toolcalls/tool_choice.py refuses a malformed one
    listed = allowed.get("tools")
    if not isinstance(listed, list):
        return choice
    where = "tool_choice.allowed_tools.tools"
    tools = [
        _named(t, f"{where}[{i}]") if isinstance(t, dict) and t.get("type") == "custom" else t
        for i, t in enumerate(listed)
    ]
    return {**choice, "allowed_tools": {**allowed, "tools": tools}}


def _named(choice: dict[str, Any], param: str) -> dict[str, Any]:
    """`{"type": "custom", "custom": {"name": n}}` as the function it was offered as."""
    spec = choice.get("custom")
    name = spec.get("name") if isinstance(spec, dict) else None
    if not isinstance(name, str) or not name:
        raise InvalidRequest(
            f"Missing required parameter: '{param}.custom.name'.",
            param=f"{param}.custom.name",
            code="missing_required_parameter",
        )
    return {"type": "function", "function": {"name": name}}


def _message(message: Any, i: int) -> Any:
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    if not isinstance(calls, list) or not any(
        isinstance(c, dict) and c.get("type") == "custom" for c in calls
    ):
        return message
    return {**message, "tool_calls": [_call(c, f"messages[{i}].tool_calls[{j}]")
                                      for j, c in enumerate(calls)]}  # fmt: skip


def _call(call: Any, param: str) -> Any:
    if not isinstance(call, dict) or call.get("type") != "custom":
        return call
    spec = call.get("custom")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise InvalidRequest(
            f"`{param}.custom` must be an object with a `name` and an `input`.",
            param=f"{param}.custom",
            code="invalid_value",
        )
    function = {"name": spec["name"], "arguments": custom_arguments(spec.get("input"))}
    rest = {k: v for k, v in call.items() if k != "custom"}
    return {**rest, "type": "function", "function": function}


def to_custom_calls(completion: dict[str, Any], names: frozenset[str]) -> dict[str, Any]:
    """A whole chat completion with its calls to custom tools as custom calls."""
    choices = completion.get("choices")
    if not isinstance(choices, list):
        return completion
    out = []
    for choice in choices:
        message = choice.get("message") if isinstance(choice, dict) else None
        if isinstance(message, dict) and isinstance(calls := message.get("tool_calls"), list):
            message = {**message, "tool_calls": [_custom_call(c, names) for c in calls]}
            choice = {**choice, "message": message}
        out.append(choice)
    return {**completion, "choices": out}


def _custom_call(call: Any, names: frozenset[str]) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return call
    name = function.get("name")
    if not isinstance(name, str) or name not in names:
        return call
    arguments = function.get("arguments")
    text = custom_input(arguments) if isinstance(arguments, str) else ""
    rest = {k: v for k, v in call.items() if k not in ("function", "type")}
    return {**rest, "type": "custom", "custom": {"name": name, "input": text}}


def custom_call_events(
    names: frozenset[str],
) -> Callable[[AsyncIterator[bytes]], AsyncIterator[bytes]]:
    """A chat stream's events with each call to a custom tool sent as one custom call,
    when it is complete: when its arguments are whole JSON (as the gateway's tool-call
    check sends every call), else when a later call of its choice begins or the choice
    finishes. Events without calls to custom tools pass as they are."""

    async def convert(events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        calls = _CustomCalls(names)
        async for event in events:
            chat = ChatEvent.of(event)
            if not calls.open and event.find(b'"tool_calls"') < 0:
                yield event
                continue
            chunks = chat.chunks()
            if not chunks or any(c is DONE for c in chunks):
                yield event
                continue
            for chunk in chunks:
                assert isinstance(chunk, dict)
                rewritten = calls.chunk(chunk)
                if rewritten is not None:
                    yield ChatEvent.parsed_as(data_event(orjson.dumps(rewritten)), rewritten)

    return convert


class _CustomCalls:
    """The calls to custom tools of one stream still being written, by (choice, index)."""

    def __init__(self, names: frozenset[str]) -> None:
        self._names = names
        self._open: dict[tuple[Any, Any], dict[str, Any]] = {}

    @property
    def open(self) -> bool:
        return bool(self._open)

    def chunk(self, chunk: dict[str, Any]) -> dict[str, Any] | None:
        """The chunk to send for one engine chunk (None: nothing of it is left to send)."""
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            return chunk
        out = [self._choice(c) for c in choices]
        sent = [c for c in out if c is not None]
        if not sent and choices:
            return None
        return {**chunk, "choices": sent}

    def _choice(self, choice: Any) -> Any:
        if not isinstance(choice, dict):
            return choice
        at = choice.get("index")
        delta = choice.get("delta")
        deltas = delta.get("tool_calls") if isinstance(delta, dict) else None
        out: list[Any] = []
        for part in deltas if isinstance(deltas, list) else ():
            out += self._part(at, part)
        if choice.get("finish_reason") is not None:  # every call of the choice is complete
            out += [self._whole(key) for key in sorted(k for k in self._open if k[0] == at)]
        if not isinstance(deltas, list) and not out:
            return choice
        kept = delta if isinstance(delta, dict) else {}
        rest = {k: v for k, v in kept.items() if k != "tool_calls"}
        if out:
            rest["tool_calls"] = out
        if not rest and choice.get("finish_reason") is None and not _other_fields(choice):
            return None  # a delta that only carried part of a custom call
        return {**choice, "delta": rest}

    def _part(self, at: Any, part: Any) -> list[Any]:
        """What to send for one tool-call delta: it, a finished custom call, or nothing."""
        index = part.get("index") if isinstance(part, dict) else None
        if type(index) is not int or type(at) is not int:  # no call the engine would make
            return [part]
        ended = [self._whole(k) for k in sorted(self._open) if k[0] == at and k[1] != index]
        key = (at, index)
        function = part.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if key not in self._open and (not isinstance(name, str) or name not in self._names):
            return [*ended, part]
        state = self._open.setdefault(key, {"id": None, "name": name, "arguments": ""})
        if isinstance(part.get("id"), str):
            state["id"] = part["id"]
        if isinstance(function, dict) and isinstance(function.get("arguments"), str):
            state["arguments"] += function["arguments"]
        if _whole_json(state["arguments"]):
            ended.append(self._whole(key))
        return ended

    def _whole(self, key: tuple[Any, Any]) -> dict[str, Any]:
        state = self._open.pop(key)
        call: dict[str, Any] = {"index": key[1]}
        if state["id"] is not None:
            call["id"] = state["id"]
        text = custom_input(state["arguments"])
        return {**call, "type": "custom", "custom": {"name": state["name"], "input": text}}


def _whole_json(text: str) -> bool:
    if not text.endswith("}"):
        return False
    try:
        return isinstance(orjson.loads(text), dict)
    except orjson.JSONDecodeError:
        return False


def _other_fields(choice: dict[str, Any]) -> bool:
    """Whether a choice carries more than its index and a delta (logprobs, say)."""
    return any(k not in ("index", "delta", "finish_reason") for k in choice if choice[k])
