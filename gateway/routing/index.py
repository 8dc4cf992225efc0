"""What the gateway believes each replica holds in its prefix cache.

One LRU of block hashes per replica, sized like the engine's cache: a block the engine
would have evicted is forgotten here too. Read by scoring (`match`, pure lookups) and
written only in the router's after-dispatch hook (`record`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class PrefixIndex:
    def __init__(self, blocks_per_replica: int) -> None:
        self._capacity = blocks_per_replica
        self._caches: dict[str, OrderedDict[int, None]] = {}

    def match(self, replica: str, blocks: Sequence[int]) -> int:
        """How many leading blocks of this prefix the replica is believed to hold."""
        cache = self._caches.get(replica)
        if not cache:
            return 0
        held = 0
        for block in blocks:
            if block not in cache:
                break
            held += 1
        return held

    def record(self, replica: str, blocks: Sequence[int]) -> None:
        cache = self._caches.setdefault(replica, OrderedDict())
        for block in blocks:
            if block in cache:
                cache.move_to_end(block)
            else:
                cache[block] = None
        while len(cache) > self._capacity:
            cache.popitem(last=False)

    def forget(self, replica: str) -> None:
        """A restarted or removed engine has an empty cache."""
        self._caches.pop(replica, None)
