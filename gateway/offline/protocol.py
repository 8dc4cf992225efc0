"""The evaluation protocol of every offline figure: design on one part, report on another.

A figure chosen and reported on the same data flatters itself: the tier router's design,
picked by its dev-fold score (0.587), scored 0.389 on MMLU subjects it never saw. So the
groups of every dev set (an MMLU subject, a tau-bench task with all its trials) are split
once, by a hash of the group's name that nobody picks:

- the **design** part is where choices are made (features, heads, weights, thresholds,
  watermarks): look at it as often as you like;
- the **report** part is only for the figure a document states. A choice made after
  looking at it makes it a design part too, and the figure must then come from other data.

The split is fixed (sha256 of the group name, even first byte: design), written down
here before any choice was made on it, and the same on every machine. Groups never
straddle it, so no trial of a tau-bench task and no question of an MMLU subject informs
the part that reports on it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable
from typing import Literal, TypeVar

Part = Literal["design", "report"]
PARTS: tuple[Part, Part] = ("design", "report")
T = TypeVar("T")

# `tau-bench/airline/gpt-4o/task12/trial3` -> `tau-bench/airline/gpt-4o/task12`: the
# trials of one task share its user, its instructions and its tool results.
_TRIAL = re.compile(r"/trial\d+$")


def part_of(group: str) -> Part:
    return "design" if hashlib.sha256(group.encode()).digest()[0] % 2 == 0 else "report"


def split(items: Iterable[T], group_of: Callable[[T], str]) -> dict[Part, list[T]]:
    """The items of each part, in their order."""
    parts: dict[Part, list[T]] = {"design": [], "report": []}
    for item in items:
        parts[part_of(group_of(item))].append(item)
    return parts


def conversation_group(record: dict[str, object], index: int) -> str:
    """A conversation's group: its `group` field, else its `id` without a trailing
    `/trialN`, else its line number (each conversation its own group)."""
    group = record.get("group")
    if isinstance(group, str) and group:
        return group
    name = record.get("id")
    if isinstance(name, str) and name:
        return _TRIAL.sub("", name)
    return f"line-{index + 1}"
