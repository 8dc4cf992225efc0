"""The Responses API's tools as the engine can take them.

- `function` tools become chat function tools.
- `namespace` tools (a named group of functions: Codex CLI sends its sub-agent tools as one)
  are flattened: each function is offered to the engine as `<namespace>__<name>`, and a
  call of it comes back to the client as a `function_call` item with `namespace` and
  `name` apart, as OpenAI answers (a history's calls carrying `namespace` are joined the
  same way, so every turn's prompt says the same bytes).
- `custom` tools (OpenAI's free-form tools, whose input is text, optionally under a Lark or
  regex grammar) become functions of one string argument, `input`, as in Chat Completions
  (gateway/chat/custom_tools.py: a regex grammar is that string's pattern, a Lark one is
  described), and a call comes back as a `custom_tool_call` item with that `input`; a
  history's custom calls and outputs go to the engine the same way.
- Tools the engine cannot run (hosted: `web_search`, `file_search`, `code_interpreter`,
  `image_generation`, `computer_use_preview`, `mcp`, ...; and built-ins whose calls are
  not function calls: `local_shell`, ...) are left out of what the engine sees, and named in
  `X-Gateway-Tools-Dropped` and a log line; with `limits.hosted_tools: refuse` they are a
  400 instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.chat.custom_tools import custom_function, custom_input
from gateway.errors import InvalidRequest

_JOIN = "__"  # `<namespace>__<name>`: characters every tool parser and template accepts
_FUNCTION_KEYS = ("name", "description", "parameters", "strict")


@dataclass(frozen=True)
class EngineTools:
    tools: list[dict[str, Any]]  # chat function tools
    dropped: tuple[str, ...] = ()  # what the engine was not offered, by type (or name)
    # engine name -> (namespace, name): the flattened functions of namespace tools
    namespaced: dict[str, tuple[str, str]] = field(default_factory=dict)
    custom: frozenset[str] = frozenset()  # names of the custom tools

    def call_item(self, engine_name: str, arguments: str) -> dict[str, Any]:
        """A call's output item, but for its ids and status: a `custom_tool_call` with
        its `input` for a custom tool, else a `function_call`."""
        if engine_name in self.custom:
            return {
                "type": "custom_tool_call",
                "name": engine_name,
                "input": custom_input(arguments),
            }
        return {"type": "function_call", **self.item_name(engine_name), "arguments": arguments}

    def item_name(self, engine_name: str) -> dict[str, str]:
        """A call's `name` (and `namespace`) as the client offered the function."""
        if engine_name in self.namespaced:
            namespace, name = self.namespaced[engine_name]
            return {"name": name, "namespace": namespace}
        return {"name": engine_name}


NO_TOOLS = EngineTools([])


def engine_name(namespace: Any, name: Any) -> Any:
    """The name the engine knows a function by (a namespaced one's, joined)."""
    if isinstance(namespace, str) and namespace and isinstance(name, str):
        return f"{namespace}{_JOIN}{name}"
    return name


def engine_tools(tools: Any, *, refuse_hosted: bool = False) -> EngineTools:
    if tools is None:
        return NO_TOOLS
    if not isinstance(tools, list):
        raise InvalidRequest("`tools` must be a list.", param="tools")
    out: list[dict[str, Any]] = []
    dropped: list[str] = []
    namespaced: dict[str, tuple[str, str]] = {}
    custom: set[str] = set()
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or not isinstance(kind, str):
            raise InvalidRequest("Each tool must be an object with a `type`.", param=f"tools[{i}]")
        if kind == "function":
            out.append(_function(tool, f"tools[{i}]"))
        elif kind == "custom":
            function = _custom(tool, f"tools[{i}]")
            custom.add(function["function"]["name"])
            out.append(function)
        elif kind == "namespace":
            namespace = tool.get("name")
            if not isinstance(namespace, str) or not namespace:
                raise InvalidRequest("A namespace needs a `name`.", param=f"tools[{i}].name")
            inner = tool.get("tools")
            if not isinstance(inner, list):
                raise InvalidRequest("`tools` must be a list.", param=f"tools[{i}].tools")
            for j, function in enumerate(inner):
                where = f"tools[{i}].tools[{j}]"
                if not isinstance(function, dict) or function.get("type") != "function":
                    dropped.append(f"{namespace}.{_label(function)}")
                    continue
                flat = _function(function, where)
                name = flat["function"]["name"]
                joined = engine_name(namespace, name)
                flat["function"]["name"] = joined
                namespaced[joined] = (namespace, name)
                out.append(flat)
        elif refuse_hosted:
            raise InvalidRequest(
                f"Tools of type `{kind}` run where the engine cannot; this gateway is set to "
                "refuse them (`limits.hosted_tools`).",
                param=f"tools[{i}].type",
                code="unsupported_tool",
            )
        else:
            dropped.append(_label(tool))
    return EngineTools(out, tuple(dropped), namespaced, frozenset(custom))


def _function(tool: dict[str, Any], param: str) -> dict[str, Any]:
    if not isinstance(tool.get("name"), str) or not tool["name"]:
        raise InvalidRequest("A function tool needs a `name`.", param=f"{param}.name")
    return {"type": "function", "function": {k: tool[k] for k in _FUNCTION_KEYS if k in tool}}


def _custom(tool: dict[str, Any], param: str) -> dict[str, Any]:
    """A custom tool as a function of one string (gateway/chat/custom_tools.py)."""
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequest("A custom tool needs a `name`.", param=f"{param}.name")
    form = tool.get("format")
    grammar = form if isinstance(form, dict) and form.get("type") == "grammar" else {}
    syntax, definition = grammar.get("syntax"), grammar.get("definition")
    where = f"{param}.format.definition"
    return custom_function(name, tool.get("description"), syntax, definition, param=where)


def _label(tool: Any) -> str:
    """How a dropped tool is named in the header: its name, else its type."""
    if not isinstance(tool, dict):
        return "?"
    name = tool.get("name")
    return str(name if isinstance(name, str) and name else tool.get("type"))[:64]
