"""Which conversations have outgrown a tier's context window, remembered for a while.

A conversation's history grows turn by turn, so once a tier's engines refused its prompt as
longer than their window, its later turns would be refused there too, each paying a round
trip to the small tier before moving to a larger window. The refusal says how many tokens
the prompt needed and the gateway knows its size in bytes: that ratio, the conversation's
own tokens per byte (code and prose differ several-fold), estimates what each later request
of the conversation needs, and one estimated past a tier's window goes straight to a tier
that holds it. A later call that is smaller (a short classification in the same session,
a history the client compacted) is estimated smaller and goes where it was chosen to.

Kept in the process, not in the state store: this is a shortcut, not a promise (another
gateway pays the refusal once and learns it too), and reading it costs no round trip.
Keyed by the conversation's hash, which names its tenant (gateway/routing/costs.py), so
nothing one tenant sends moves another's requests. A client that compacts its history is
estimated smaller from then on (its size in bytes falls) and goes back to the small tier.
Entries are forgotten `ttl_s` after their last use, and the oldest first past `capacity`.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

MAX_CONVERSATIONS = 65_536  # about 10 MB at most; a conversation past it is refused once more
TTL_S = 3_600.0  # a conversation idle this long has likely ended or been compacted


class OutgrownWindows:
    """Per conversation and model alias, the tokens per byte of the prompt a window last
    refused: `needed(conversation, alias, size)` estimates the tokens a request of `size`
    bytes in that conversation needs; None where no window refused the conversation."""

    def __init__(
        self,
        *,
        capacity: int = MAX_CONVERSATIONS,
        ttl_s: float = TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._capacity = capacity
        self._ttl_s = ttl_s
        self._clock = clock
        self._refused: OrderedDict[tuple[int, str], tuple[float, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._refused)

    def needed(self, conversation: int | None, alias: str, size: Callable[[], int]) -> int | None:
        """`size`: the request's size in bytes, asked for only when the conversation has
        a refusal on record."""
        if conversation is None or not self._refused:  # the usual case: one test, no lookup
            return None
        key = (conversation, alias)
        entry = self._refused.get(key)
        if entry is None:
            return None
        per_byte, until = entry
        now = self._clock()
        if now >= until:
            del self._refused[key]
            return None
        self._refused[key] = (per_byte, now + self._ttl_s)  # still in use: kept as long again
        self._refused.move_to_end(key)
        return int(size() * per_byte)

    def refused(self, conversation: int | None, alias: str, tokens: int, size: int) -> None:
        """A request of `size` bytes in this conversation needed at least `tokens` tokens
        (its prompt, plus the output it asked for where that is what did not fit), more
        than a window held."""
        if conversation is None or size <= 0 or tokens <= 0:
            return
        key = (conversation, alias)
        self._refused.pop(key, None)
        self._refused[key] = (tokens / size, self._clock() + self._ttl_s)
        while len(self._refused) > self._capacity:
            self._refused.popitem(last=False)
