"""The prompt tokens routing expected its pick to have cached, in the engine's units.

Routing believes in prefix blocks of prompt bytes (gateway/prompt/blocks.py); the engine
reports cached *tokens* (`usage.prompt_tokens_details.cached_tokens`), in whole KV blocks.
Issue 24's prediction error compares the two, so the blocks believed held must become
tokens. Scaling by the prompt's share of blocks (`prompt_tokens * cached / total`) was
off by a part of a block on nearly every request: 0.0095 of all prompt tokens on the
tau-bench run against real vLLM, where the engines' caches held exactly what the router
believed. That is unit conversion, not belief, and it hid the errors that matter (a cache
lost, an eviction).

An agent's next turn resends the previous one whole, so when routing believes the
replica holds everything up to the previous turn's last block, the engine holds that
turn's prompt in whole KV blocks: `floor(previous prompt tokens / granule) * granule`
(the request logs of that run: 9,772 tokens, then 9,760 cached on the next turn). The
granule is the engine's KV block size, learned as the greatest common divisor of the
cached counts the pool's engines report (32 for `cpu-tiny`; 1 for an engine that caches
single tokens, which then needs no rounding), trusted once `_TRUSTED_AFTER` counts went
into it (the first count alone is its own divisor). Anything else falls back to the share
of blocks, rounded down to the granule.

Pure bookkeeping on facts known before the request was answered (earlier turns' reports)
plus its own prompt size; bounded: the least recently seen conversations are forgotten.
"""

from __future__ import annotations

import math
from collections import OrderedDict

from gateway.telemetry.record import RequestRecord

# (tenant, session, replica) -> (the last whole block of its last prompt there, the
# tokens of that prompt the engine then held)
_Turn = tuple[int, int]
_TRUSTED_AFTER = 4  # nonzero cached counts before their common divisor is the granule


class CacheExpectation:
    def __init__(self, conversations: int = 100_000) -> None:
        self._capacity = conversations
        self._last: OrderedDict[tuple[str, str, str], _Turn] = OrderedDict()
        self._divisor: dict[str, tuple[int, int]] = {}  # pool -> (gcd of counts, counts)

    def observe(self, record: RequestRecord) -> int | None:
        """What routing expected for this answered request (None when it routed on no
        blocks or the engine did not report its prompt); then learn from its report."""
        expected = self._expected(record)
        self._learn(record)
        return expected

    def _expected(self, record: RequestRecord) -> int | None:
        prompt, blocks, held = record.result.prompt_tokens, record.blocks, record.cached_blocks
        if not blocks or prompt is None or record.replica is None:
            return None
        if held == 0:
            return 0
        granule = self._granule(record.pool)
        # The engine's events: it evicted the rest of the conversation's last turn there.
        evicted = record.engine_held_tokens if record.engine_evicted else None
        session = record.route_session
        last = self._last.get((record.tenant, session, record.replica)) if session else None
        if last is not None and last[0] == blocks[held - 1]:
            expected = min(last[1], prompt)
        else:
            expected = prompt * held // len(blocks) // granule * granule
        return min(expected, evicted) if evicted is not None else expected

    def _learn(self, record: RequestRecord) -> None:
        cached, prompt = record.result.cached_tokens, record.result.prompt_tokens
        if record.pool is not None and cached:
            divisor, counts = self._divisor.get(record.pool, (0, 0))
            self._divisor[record.pool] = (math.gcd(divisor, cached), counts + 1)
        session, blocks = record.route_session, record.blocks
        if session is None or not blocks or not prompt or record.replica is None:
            return
        if record.status >= 400:
            return  # not computed by the engine, or not all of it
        granule = self._granule(record.pool)
        key = (record.tenant, session, record.replica)
        self._last[key] = (blocks[-1], prompt // granule * granule)
        self._last.move_to_end(key)
        if len(self._last) > self._capacity:
            self._last.popitem(last=False)

    def _granule(self, pool: str | None) -> int:
        """The pool's engines' caching unit in tokens, as far as their reports tell."""
        divisor, counts = self._divisor.get(pool or "", (1, 0))
        return divisor if counts >= _TRUSTED_AFTER else 1
