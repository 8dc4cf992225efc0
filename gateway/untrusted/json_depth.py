"""How deep a parsed JSON value nests, found without recursion and cheaply.

Two ways, each the cheaper one for one shape of value (measured on the request bodies of
`make bench`, tests/bench/overhead/bodies.py, on a 2-core machine):

- `deeper_by_walk` goes level by level through arrays and objects only. It costs per
  member (a string costs one type test), so a conversation of long messages is cheap
  (the 228 KB long-prompt body's messages: 1 us; the 25 KB tau-bench body's 40: 14 us),
  a dense JSON schema is not (tau-bench's 14 tool schemas: 28 us).
- `DepthProbe` lets orjson do it in C. orjson refuses to serialise past a fixed depth
  (`ORJSON_MAX_DEPTH`, found once at import); a value put at the bottom of a chain of
  lists exactly long enough fails to serialise if, and only if, it nests deeper than the
  limit. It costs per byte (the same 14 tool schemas: 10 us; the long prompt: 125 us).

Parsed JSON holds exactly `dict` and `list` containers (orjson makes no subclasses), so
`type(x) in _CONTAINERS` is exact.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import orjson

_CONTAINERS = frozenset({dict, list})


def _orjson_max_depth() -> int | None:
    """The deepest nesting orjson serialises (254 in orjson 3.x); None if it has no
    ceiling below 10,000 (every check then walks)."""
    value: list[Any] = []
    for depth in range(1, 10_000):
        try:
            orjson.dumps(value)
        except TypeError:
            return depth - 1
        value = [value]
    return None


ORJSON_MAX_DEPTH = _orjson_max_depth()


def deeper_by_walk(value: Any, level: int, limit: int) -> bool:
    """Whether `value`, a container at `level` (the body is level 1), holds containers
    past level `limit`."""
    nodes = [value]
    while nodes:
        if level > limit:
            return True
        found: list[Any] = []
        add = found.append
        for node in nodes:
            for child in node.values() if type(node) is dict else node:
                if type(child) in _CONTAINERS:
                    add(child)
        nodes = found
        level += 1
    return False


class DepthProbe:
    """`deeper(value)`: whether a container at level 2 of a body (a top-level field)
    nests past `limit`, by one orjson.dumps.

    The chain of lists is built once per thread and reused: its bottom slot holds the
    value only for the duration of the call."""

    def __init__(self, limit: int, max_depth: int) -> None:
        # A field at level 2 whose own depth is d reaches level d + 1: too deep when
        # d > limit - 1. Under `wrappers` lists, orjson sees wrappers + d levels and
        # fails when that passes max_depth, i.e. exactly when d > limit - 1.
        self._wrappers = max_depth - limit + 1
        self._local = threading.local()

    def deeper(self, value: Any) -> bool:
        local = self._local
        bottom: list[Any] | None = getattr(local, "bottom", None)
        if bottom is None:
            bottom = [None]
            chain = bottom
            for _ in range(self._wrappers - 1):
                chain = [chain]
            local.bottom, local.chain = bottom, chain
        bottom[0] = value
        try:
            orjson.dumps(local.chain)
        except TypeError:  # what orjson parsed it can serialise: only depth fails here
            return True
        finally:
            bottom[0] = None
        return False


@functools.cache
def depth_probe(limit: int) -> DepthProbe | None:
    """The probe for a policy's `limits.max_json_depth` (None: orjson has no ceiling to
    use, walk instead)."""
    if ORJSON_MAX_DEPTH is None or limit + 8 > ORJSON_MAX_DEPTH:
        return None
    return DepthProbe(limit, ORJSON_MAX_DEPTH)
