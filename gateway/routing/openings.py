"""How agent conversations begin: the prefix blocks many conversations open with.

An agent framework starts every conversation with the same system prompt and tool list.
Only the first replica to serve one holds that prefix, so for each new conversation it
looks cheaper there by the whole shared prefix, and every new conversation lands on it
until load pushes conversations away mid-way; moving one then recomputes its whole
history elsewhere (measured on `tests/bench/tau_routing.py`: all 4 first agents on one
replica, then 3-4 agents moved, about 5,000 tokens a run). A prefix that many
conversations open with will be on every replica soon whatever the router does, so it
must not decide where a conversation lives: the router prices a conversation's first
request as if every replica held its shared opening, and session affinity (rendezvous
hashing) and load place the conversation, once, before it has a history to move.

`record` is called with the blocks of each conversation's first request, once per
conversation; `shared_lead` is how many leading blocks of a request at least `threshold`
conversations opened with. Bounded: the least recently opened-with blocks are forgotten.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class ConversationOpenings:
    def __init__(self, threshold: int, capacity: int = 1 << 16) -> None:
        self._threshold = threshold
        self._capacity = capacity
        self._opened: OrderedDict[int, int] = OrderedDict()  # block -> conversations

    def shared_lead(self, blocks: Sequence[int]) -> int:
        """Leading blocks of `blocks` that at least `threshold` conversations began with
        (0 when the threshold is 0: the rule is off)."""
        if not self._threshold:
            return 0
        opened, need, lead = self._opened, self._threshold, 0
        for block in blocks:
            if opened.get(block, 0) < need:
                break
            lead += 1
        return lead

    def record(self, blocks: Sequence[int]) -> None:
        """A conversation began with these blocks."""
        if not self._threshold:
            return
        opened = self._opened
        for block in blocks:
            opened[block] = opened.get(block, 0) + 1
            opened.move_to_end(block)
        while len(opened) > self._capacity:
            opened.popitem(last=False)
