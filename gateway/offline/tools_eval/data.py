"""The calls `gateway tools-eval` replays, read where they lie: tau-bench's airline
conversations (every tool call the model made, with the tools declared beside it) and
BFCL's function docs (one tool set per file, its Python type names mapped to JSON
Schema's, and one valid call built per function)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

REPOSITORY = Path(__file__).resolve().parents[3]
DEFAULT_DATA = REPOSITORY.parent / "shared" / "data"  # ../shared/data from the repository
TAU_BENCH = "agent-trajectories/tau_bench_airline_dev.jsonl"
BFCL_DOCS = "bfcl/multi_turn_func_doc"


class DataError(Exception):
    """A data file is missing or not what it should be."""


@dataclass(frozen=True)
class RealCall:
    """One clean call, the tools declared beside it, and its parsed arguments."""

    tools: list[dict[str, Any]]
    call: dict[str, Any]
    arguments: dict[str, Any]

    @property
    def name(self) -> str:
        name: str = self.call["function"]["name"]
        return name

    @property
    def parameters(self) -> dict[str, Any]:
        for tool in self.tools:
            if tool["function"]["name"] == self.name:
                parameters: dict[str, Any] = tool["function"].get("parameters") or {}
                return parameters
        return {}


def arguments_text(real: RealCall) -> str:
    """The call's arguments as sent: JSON text ("" when there are none)."""
    text: str = real.call["function"].get("arguments") or ""
    return text


@dataclass(frozen=True)
class Dataset:
    name: str
    source: str
    role: str  # what it had to do with the checker's design
    calls: list[RealCall]
    tool_sets: int
    tools: int  # declared, over all tool sets


def load_tau_bench(data: Path, limit: int) -> Dataset:
    path = data / TAU_BENCH
    calls: list[RealCall] = []
    tool_sets: dict[bytes, int] = {}
    for record in _json_lines(path):
        tools = record.get("tools") or []
        tool_sets[orjson.dumps(tools, option=orjson.OPT_SORT_KEYS)] = len(tools)
        for message in record.get("messages") or []:
            if message.get("role") != "assistant":
                continue
            for call in message.get("tool_calls") or []:
                try:
                    arguments = orjson.loads(call["function"].get("arguments") or "{}")
                except orjson.JSONDecodeError as exc:
                    raise DataError(f"{path}: {record.get('id')}: a call is not JSON") from exc
                calls.append(RealCall(tools, call, arguments))
    role = "design set: the checker was designed looking at these conversations"
    declared = sum(tool_sets.values())
    return Dataset("tau_bench", str(path), role, _first(calls, limit), len(tool_sets), declared)


def load_bfcl(data: Path, limit: int) -> Dataset:
    folder = data / BFCL_DOCS
    files = sorted(folder.glob("*.json"))
    if not files:
        raise DataError(f"no BFCL function docs in {folder}")
    calls: list[RealCall] = []
    for path in files:
        tools = [bfcl_tool(doc) for doc in _json_lines(path)]
        calls.extend(example_call(tools, tool) for tool in tools)
    role = "held out: BFCL took no part in the checker's design"
    # One call per declared function, so the tools are as many as the calls before `limit`.
    return Dataset("bfcl", str(folder), role, _first(calls, limit), len(files), len(calls))


def bfcl_tool(doc: dict[str, Any]) -> dict[str, Any]:
    """A BFCL function doc as an OpenAI tool, its schema in JSON Schema's type names."""
    function = {
        "name": doc["name"],
        "description": doc.get("description", ""),
        "parameters": _json_schema_types(doc.get("parameters") or {"type": "dict"}),
    }
    return {"type": "function", "function": function}


_BFCL_TYPES = {"dict": "object", "float": "number", "tuple": "array"}


def _json_schema_types(schema: Any) -> Any:
    if isinstance(schema, list):
        return [_json_schema_types(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    mapped: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "type" and value == "any":
            continue  # no `type`: any value
        if key == "type" and isinstance(value, str):
            mapped[key] = _BFCL_TYPES.get(value, value)
        elif key == "properties" and isinstance(value, dict):
            mapped[key] = {name: _json_schema_types(sub) for name, sub in value.items()}
        elif key == "items":
            mapped[key] = _json_schema_types(value)
        else:
            mapped[key] = value  # enum members, defaults, descriptions: data, not schema
    return mapped


_EXAMPLE_VALUES: dict[str, Any] = {
    "string": "x",
    "integer": 1,
    "number": 1.5,
    "boolean": True,
    "array": [],
    "object": {},
    "null": None,
}


def example_call(tools: list[dict[str, Any]], tool: dict[str, Any]) -> RealCall:
    """A valid call to `tool`: its required properties, each with a value of its type."""
    function = tool["function"]
    parameters = function["parameters"]
    properties = parameters.get("properties") or {}
    arguments = {
        name: _example_value(properties.get(name) or {})
        for name in parameters.get("required") or []
    }
    call = {
        "id": f"call_{function['name']}",
        "type": "function",
        "function": {"name": function["name"], "arguments": orjson.dumps(arguments).decode()},
    }
    return RealCall(tools, call, arguments)


def _example_value(schema: dict[str, Any]) -> Any:
    if schema.get("enum"):
        return schema["enum"][0]
    declared = schema.get("type")
    if not isinstance(declared, str):
        return "x"  # untyped (BFCL's `any`)
    return _EXAMPLE_VALUES[declared]


def _json_lines(path: Path) -> Iterable[dict[str, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror}") from exc
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise DataError(f"{path}:{number}: not JSON ({exc})") from exc
        if not isinstance(record, dict):
            raise DataError(f"{path}:{number}: not a JSON object")
        yield record


def _first(calls: list[RealCall], limit: int) -> list[RealCall]:
    return calls[:limit] if limit > 0 else calls
