"""Regular expressions a client or a policy wrote, compiled with RE2.

RE2 matches in time linear in the text, whatever the pattern: no pattern can hold the
event loop. It refuses what only a backtracking engine can run (backreferences,
lookaround, `\\Z`: write `\\z`); such a pattern is refused with RE2's reason. `\\d`, `\\w`
and `\\b` are ASCII in RE2 (they are Unicode in Python's `re`), as in JSON Schema's
ECMA-262 patterns.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import re2

# A compiled program larger than this is refused ("pattern too large"); RE2's own default
# (8 MiB) lets one client pattern take that much memory per cached copy.
_MAX_PROGRAM_BYTES = 2 * 1024 * 1024


class UnsafePattern(ValueError):
    """A pattern RE2 cannot compile; `reason` is RE2's own words."""

    def __init__(self, pattern: str, reason: str) -> None:
        super().__init__(f"{pattern!r} is not a pattern RE2 can run: {reason}")
        self.pattern = pattern
        self.reason = reason


def _options() -> Any:
    options = re2.Options()
    options.log_errors = False  # a refused pattern is the caller's error, not a log line
    options.max_mem = _MAX_PROGRAM_BYTES
    return options


class LinearRegex:
    """One compiled pattern; `search`, `fullmatch` and `sub` as in `re`, in linear time."""

    __slots__ = ("_compiled", "pattern")

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        try:
            # re2 keeps its own small LRU of compiled patterns: compiling the same pattern
            # again (a request's schema, a route's guardrail) costs a lookup.
            self._compiled: Any = re2.compile(pattern, _options())
        except re2.error as exc:
            raise UnsafePattern(pattern, _reason(exc)) from None

    def __eq__(self, other: object) -> bool:  # a policy reloaded unchanged compares equal
        return isinstance(other, LinearRegex) and other.pattern == self.pattern

    def __hash__(self) -> int:
        return hash(self.pattern)

    def search(self, text: str) -> bool:
        return self._compiled.search(text) is not None

    def fullmatch(self, text: str) -> bool:
        return self._compiled.fullmatch(text) is not None

    def sub(self, replace: Callable[[str], str], text: str) -> str:
        """`text` with every match replaced by `replace(matched text)`."""
        replaced: str = self._compiled.sub(lambda match: replace(match.group(0)), text)
        return replaced


def _reason(exc: Exception) -> str:
    detail = exc.args[0] if exc.args else exc
    if isinstance(detail, bytes):  # the binding passes RE2's message through as bytes
        return detail.decode("utf-8", "replace")
    return str(detail)
