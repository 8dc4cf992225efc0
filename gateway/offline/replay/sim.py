"""Simulated replicas for replay: each an LRU prefix cache of M blocks (the truth the
router's belief is scored against) and a prefill queue for a service-time estimate.

Service model (stated in the output): one prefill at a time per replica at `prefill_tps`
tokens/s over the uncached tokens; decode then runs batched at `decode_tps` tokens/s per
request, so a request occupies its replica from arrival until its last token.
"""

from __future__ import annotations

import math
from collections import OrderedDict, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field


class LRUCache:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def leading_hits(self, blocks: Sequence[int]) -> int:
        hits = 0
        for block in blocks:
            if block not in self._blocks:
                break
            hits += 1
        return hits

    def insert(self, blocks: Sequence[int]) -> None:
        # vLLM frees a request's blocks in reverse: tails are evicted before their prefixes.
        for block in reversed(blocks):
            if block in self._blocks:
                self._blocks.move_to_end(block)
            else:
                self._blocks[block] = None
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)

    def __len__(self) -> int:
        return len(self._blocks)


@dataclass
class SimReplica:
    cache: LRUCache
    prefill_free_at: float = 0.0
    finishes: list[float] = field(default_factory=list)

    def running(self, now: float) -> int:
        self.finishes = [t for t in self.finishes if t > now]
        return len(self.finishes)


@dataclass
class Tally:
    """Hit, balance and service-time figures for one routing policy over one trace."""

    replicas: int
    window_s: float = 60.0
    hit_blocks: int = 0
    total_blocks: int = 0
    ttfts: list[float] = field(default_factory=list)
    work: dict[int, list[float]] = field(default_factory=lambda: defaultdict(list))
    last_at_s: float = 0.0

    def add(self, at_s: float, replica: int, hits: int, blocks: int, ttft: float) -> None:
        self.last_at_s = max(self.last_at_s, at_s)
        self.hit_blocks += hits
        self.total_blocks += blocks
        self.ttfts.append(ttft)
        window = self.work[int(at_s // self.window_s)]
        if not window:
            window.extend([0.0] * self.replicas)
        window[replica] += blocks - hits + 1

    @property
    def hit_rate(self) -> float:
        return self.hit_blocks / self.total_blocks if self.total_blocks else 0.0

    def imbalance_p95(self) -> float:
        """Per window: busiest replica's prefill work over the mean replica's; p95. The
        window the trace ends in is left out when there are others: it holds the trace's
        last seconds only (2 s of the Mooncake trace's 60 s windows), where two requests
        decide the ratio, and with 18 windows its ratio alone was the p95."""
        last = int(self.last_at_s // self.window_s)
        whole = [w for i, w in self.work.items() if i != last] or list(self.work.values())
        ratios = sorted(max(w) / (sum(w) / len(w)) for w in whole if sum(w) > 0)
        return percentile(ratios, 0.95) if ratios else 1.0

    def summary(self) -> dict[str, float]:
        ttfts = sorted(self.ttfts)
        return {
            "hit_rate": round(self.hit_rate, 4),
            "imbalance_p95": round(self.imbalance_p95(), 3),
            "ttft_p50_s": round(percentile(ttfts, 0.50), 3),
            "ttft_p95_s": round(percentile(ttfts, 0.95), 3),
        }


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]
