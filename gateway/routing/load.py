"""Recent prefill work per replica: the load signal affinity must not override.

Work is counted in prefix blocks (uncached blocks, plus one per request) at dispatch and
decays with a half-life, so the value tracks each replica's recent share of prefill work
without a model of engine speed. It is what bounds affinity: a replica that has taken far
more recent work than the others stops winning on cache hits alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable

_NOTHING = (0.0, 0.0)


class LoadTracker:
    def __init__(self, half_life_s: float, clock: Callable[[], float]) -> None:
        self._rate = math.log(2) / half_life_s
        self._clock = clock
        self._work: dict[str, tuple[float, float]] = {}  # replica -> (work, as of)

    def now(self) -> float:
        return self._clock()

    def recent(self, replica: str) -> float:
        return self.recent_many([replica])[0]

    def recent_many(self, replicas: list[str]) -> list[float]:
        """Decayed work of several replicas at one instant (one clock read)."""
        now, rate, known = self._clock(), self._rate, self._work
        out = []
        for replica in replicas:
            work, since = known.get(replica, _NOTHING)
            out.append(work * math.exp(-rate * (now - since)) if work and now > since else work)
        return out

    def add(self, replica: str, work: float) -> None:
        self._work[replica] = (self.recent(replica) + work, self._clock())

    def forget(self, replica: str) -> None:
        self._work.pop(replica, None)
