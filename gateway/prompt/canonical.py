"""Prompt canonicalization: the same meaning renders the same bytes, so the engine's
prefix cache sees the same prefix.

- Tools are sorted by function name and every schema is rebuilt with sorted keys (JSON
  object order carries no meaning). Agent frameworks reorder both between turns, and a
  reordered tool list invalidates every cached block after the system prompt.
- Volatile values declared in the policy (dates, times, UUIDs, ids) are cut out of the
  first system message, which then stays byte-identical across requests; the values
  follow in a note after the conversation. Off unless the policy turns it on for a model,
  because it moves text the model reads. The patterns run with RE2 (linear in the
  prompt's length, whatever the pattern: gateway/untrusted/regex.py).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.policy.canonicalize import CanonicalizeSpec
from gateway.policy.volatile_presets import PRESETS
from gateway.untrusted.regex import LinearRegex


def sorted_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: sorted_keys(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [sorted_keys(v) for v in value]
    return value


def _tool_name(tool: Any) -> str:
    if isinstance(tool, dict):
        function = tool.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if isinstance(name, str):
            return name
    return ""


@dataclass(frozen=True)
class Fingerprint:
    """What a session's stable prefix looked like: compared turn to turn."""

    system: str
    tools: str

    def changes_from(self, previous: Fingerprint) -> list[str]:
        return [
            part for part in ("system", "tools") if getattr(self, part) != getattr(previous, part)
        ]

    def encode(self) -> str:
        return f"{self.system}:{self.tools}"

    @classmethod
    def decode(cls, text: str) -> Fingerprint | None:
        system, sep, tools = text.partition(":")
        return cls(system, tools) if sep else None


@dataclass(frozen=True, slots=True)
class Canonical:
    body: dict[str, Any] | None  # the rewritten body; None when the client's is canonical
    tools_json: bytes | None  # the canonical tools serialised, reused for prefix hashing


class Canonicalizer:
    _CACHE_SIZE = 256  # distinct tool sets remembered; agents reuse a handful

    def __init__(self, spec: CanonicalizeSpec) -> None:
        self.spec = spec
        # Serialised tools as sent -> (canonical tools or None if already canonical, their
        # bytes). An agent sends the same tool set every turn: canonicalize it once.
        self._tools_cache: OrderedDict[bytes, tuple[list[Any] | None, bytes]] = OrderedDict()
        volatile = spec.volatile
        self._patterns: list[tuple[str, LinearRegex]] = []
        if volatile is not None:
            for item in volatile.patterns:
                self._patterns.append((item.name, LinearRegex(item.regex or PRESETS[item.name])))

    def apply(self, body: dict[str, Any]) -> Canonical:
        changed = False
        tools_json: bytes | None = None
        tools = body.get("tools")
        if isinstance(tools, list) and tools:
            if self.spec.sort_tools or self.spec.sort_schema_keys:
                canonical, tools_json = self._canonical_tools(tools)
                if canonical is not None:
                    body = {**body, "tools": canonical}
                    changed = True
            else:
                tools_json = orjson.dumps(tools)
        if self._patterns:
            moved = self._move_volatile(body)
            if moved is not None:
                body, changed = moved, True
        return Canonical(body if changed else None, tools_json)

    def _canonical_tools(self, tools: list[Any]) -> tuple[list[Any] | None, bytes]:
        key = orjson.dumps(tools)
        cached = self._tools_cache.get(key)
        if cached is not None:
            self._tools_cache.move_to_end(key)
            return cached
        canonical = list(tools)
        if self.spec.sort_tools:
            canonical.sort(key=_tool_name)
        if self.spec.sort_schema_keys:
            canonical = [sorted_keys(t) for t in canonical]
        canonical_json = orjson.dumps(canonical)
        result = (canonical, canonical_json) if canonical_json != key else (None, key)
        self._tools_cache[key] = result
        if len(self._tools_cache) > self._CACHE_SIZE:
            self._tools_cache.popitem(last=False)
        return result

    def _move_volatile(self, body: dict[str, Any]) -> dict[str, Any] | None:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return None
        first = messages[0]
        if not isinstance(first, dict) or first.get("role") not in ("system", "developer"):
            return None
        content = first.get("content")
        if not isinstance(content, str):
            return None
        found: list[str] = []
        for name, pattern in self._patterns:

            def cut(matched: str, name: str = name) -> str:
                found.append(f"{name}={matched}")
                return f"[{name}]"

            content = pattern.sub(cut, content)
        if not found:
            return None
        volatile = self.spec.volatile
        assert volatile is not None
        note = f"{volatile.note_prefix} {'; '.join(found)}"
        rest = [{**first, "content": content}, *messages[1:]]
        if volatile.placement == "trailing_system":
            rest.append({"role": "system", "content": note})
        else:  # last_user: appended to the last user message, the end of the prompt
            for i in range(len(rest) - 1, 0, -1):
                message = rest[i]
                if message.get("role") == "user" and isinstance(message.get("content"), str):
                    rest[i] = {**message, "content": f"{message['content']}\n\n{note}"}
                    break
            else:
                rest.append({"role": "user", "content": note})
        return {**body, "messages": rest}


def fingerprint(body: dict[str, Any]) -> Fingerprint:
    def digest(value: Any) -> str:
        return hashlib.blake2b(orjson.dumps(value), digest_size=8).hexdigest()

    messages = body.get("messages")
    system: Any = None
    first = messages[0] if isinstance(messages, list) and messages else None
    if isinstance(first, dict) and first.get("role") in ("system", "developer"):
        system = first.get("content")
    return Fingerprint(digest(system), digest(body.get("tools")))
