"""What the gateway believes each replica holds in its prefix cache.

One LRU of block hashes per replica, sized like the engine's cache: a block the engine
would have evicted is forgotten here too. Like vLLM, which frees a request's blocks in
reverse so that tails are evicted before the prefixes they extend, `record` touches a
request's blocks last-to-first; what is held is then always a prefix-closed set, and
`match` can binary-search the leading run instead of walking it. Read by scoring
(`match`, pure lookups) and written only in the router's after-dispatch hook (`record`).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence


class PrefixIndex:
    def __init__(self, blocks_per_replica: int) -> None:
        self._capacity = blocks_per_replica
        self._caches: dict[str, OrderedDict[int, None]] = {}

    def match(self, replica: str, blocks: Sequence[int]) -> int:
        """How many leading blocks of this prefix the replica is believed to hold."""
        cache = self._caches.get(replica)
        if not cache or not blocks or blocks[0] not in cache:
            return 0
        low, high = 1, len(blocks)  # blocks[:low] held; find the largest such low
        while low < high:
            middle = (low + high + 1) // 2
            if blocks[middle - 1] in cache:
                low = middle
            else:
                high = middle - 1
        return low

    def record(self, replica: str, blocks: Sequence[int]) -> None:
        """Make the request's blocks the most recent, its last block the oldest of them."""
        cache = self._caches.setdefault(replica, OrderedDict())
        held = self.match(replica, blocks)
        for block in reversed(blocks[held:]):  # the new tail: usually one turn's worth
            if block in cache:
                cache.move_to_end(block)
            else:
                cache[block] = None
        # The held run (most of a long agent history) is moved in one pass in C.
        deque(map(cache.move_to_end, reversed(blocks[:held])), maxlen=0)
        while len(cache) > self._capacity:
            cache.popitem(last=False)

    def forget(self, replica: str) -> None:
        """A restarted or removed engine has an empty cache."""
        self._caches.pop(replica, None)
