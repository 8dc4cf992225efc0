"""Deterministic repairs of a tool call's arguments, each made only where exactly one
reading exists; anything else is left for a re-ask, an escalation or a refusal.

- A Markdown fence around the JSON (```json ... ```): small models add one.
- JSON cut short after a complete value, its closing brackets lost (a reply stopped by
  `max_tokens` or a stop string): the brackets still open are closed, in order. A cut
  inside a string, after a key, or after a comma is not closed: the missing part had a
  value nobody can know.
- A string where the schema wants exactly one scalar type (`"5"` for an `integer`,
  `"true"` for a `boolean`), when the string is exactly that value's JSON. Not where the
  schema allows several types, or a string too.

The result is checked against the schema again by the caller: a repair that does not
make the call valid is not used.
"""

from __future__ import annotations

from typing import Any

import orjson

# Past this many characters the arguments are not scanned for brackets: they are checked
# or refused as they are (the scan is linear, but a request's budget is not ours to spend).
MAX_REPAIR_CHARS = 65_536


def unfenced(text: str) -> str | None:
    """The text inside one Markdown code fence, or None when there is no fence."""
    stripped = text.strip()
    if not (stripped.startswith("```") and stripped.endswith("```") and len(stripped) > 6):
        return None
    inner = stripped[3:-3]
    newline = inner.find("\n")
    if newline >= 0:
        tag = inner[:newline].strip()  # the fence's language: ```json
        if not tag or tag.isalnum():
            inner = inner[newline + 1 :]
    return inner.strip()


def closed(text: str) -> str | None:
    """`text` with its open brackets closed, when it stops right after a complete value
    (or an open bracket); None otherwise."""
    if len(text) > MAX_REPAIR_CHARS:
        return None
    stack: list[str] = []
    in_string = escaped = False
    last = ""  # the last significant character outside strings
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
                last = '"'
            continue
        if char == '"':
            in_string = True
        elif char in "{[":
            stack.append("}" if char == "{" else "]")
            last = char
        elif char in "}]":
            if not stack or stack.pop() != char:
                return None
            last = char
        elif not char.isspace():
            last = char
    if in_string or not stack or last in {",", ":"}:
        return None
    if last == '"' and stack[-1] == "}" and _ends_with_key(text):
        return None  # `{"a": 1, "b"`: a key without its value
    return text.rstrip() + "".join(reversed(stack))


def _ends_with_key(text: str) -> bool:
    """Whether the string the text ends with is an object key (what precedes it is `{`
    or a comma), not a value."""
    end = text.rstrip()
    index = len(end) - 2
    while index >= 0:  # back to the string's opening quote
        if end[index] == '"' and (index == 0 or end[index - 1] != "\\"):
            break
        index -= 1
    before = end[:index].rstrip()
    return before.endswith(("{", ","))


def coerced(arguments: Any, schema: Any) -> Any | None:
    """The arguments with strings turned into the one scalar type their schema allows;
    None when nothing was turned."""
    if not isinstance(arguments, dict) or not isinstance(schema, dict):
        return None
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return None
    changed = False
    result = dict(arguments)
    for name, value in arguments.items():
        sub = properties.get(name)
        if not isinstance(sub, dict):
            continue
        if isinstance(value, dict):
            inner = coerced(value, sub)
            if inner is not None:
                result[name], changed = inner, True
            continue
        if type(value) is not str or sub.keys() & {"anyOf", "oneOf", "allOf", "enum", "const"}:
            continue
        wanted = sub.get("type")
        turned = _scalar(value, wanted) if isinstance(wanted, str) else None
        if turned is not None:
            result[name], changed = turned, True
    return result if changed else None


def _scalar(text: str, wanted: str) -> Any | None:
    if wanted not in ("integer", "number", "boolean") or text != text.strip() or not text:
        return None
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if wanted == "boolean":
        return value if type(value) is bool else None
    if type(value) is bool or type(value) not in (int, float):
        return None
    if wanted == "integer":
        return value if type(value) is int else None
    return value
