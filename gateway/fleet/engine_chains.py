"""Which of a conversation's KV blocks each engine still holds, from its own KV events.

The router believes in prefix blocks of prompt bytes and keeps an LRU per replica sized
like the engine's cache (gateway/routing/index.py); the engine evicts in its own blocks
of tokens, on its own schedule, and says so in `BlockRemoved` events whose hashes (of
token ids) match nothing the gateway computes. Matching them needs no tokenizer for an
agent's conversation: each turn resends the previous one whole, so the engine's chain of
blocks for turn n+1 runs through the last whole block of turn n's prompt (its *tip*), and
the engine holds turn n+1's prefix up to the first block of that chain it has removed.

- `BlockStored` events give each block its parent, so its depth in the chain (vLLM hashes
  block i over blocks 0..i: depth d covers prompt tokens [(d-1)·size, d·size)).
- A turn's tip is found after its answer, lazily (its events are published after the
  engine's step, and may reach the gateway after the answer does, or after the next
  turn's): among the blocks the engine stored from the turn's sending until a second
  after its answer, the one at depth floor(prompt tokens / block size) whose chain runs
  through the previous turn's tip; for a conversation's first turn here, the only such
  block, or none when several conversations stored one then.
- `held(...)` walks up from the tip to the first block still held (what an engine holds
  of a chain is a prefix of it) and reports how many prompt tokens of the previous turn
  the engine still holds: what routing caps its belief with (`held_at`, once per
  request) and what the prediction error of issue 24 is scored against.

A conversation is (tenant, routing session, replica), as gateway/telemetry/
cache_expectation.py keys it. Bounded: the blocks known per replica and the
conversations remembered are LRUs.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gateway.fleet.kv_event_wire import (
    PRIMARY_MEDIA,
    AllBlocksCleared,
    BlockHash,
    BlocksRemoved,
    BlocksStored,
    EventBatch,
)

# Blocks remembered per replica beyond the most it was seen to hold at once: the removed
# ones, whose place in their chains tells a conversation where its held prefix ends.
# (About 330 bytes per block with vLLM's sha256 hashes, measured: a GPU engine holding
# 300,000 blocks costs about 120 MB here.)
_REMOVED_KEPT = 65_536
# Stores remembered per depth and replica for finding a turn's tip: more than an engine
# stores at one depth between a turn's answer and its conversation's next request. (Per
# depth: under cache pressure every request recomputes hundreds of blocks, and one list
# for all depths would lose a turn's stores within seconds.)
_RECENT_PER_DEPTH = 64
_MAX_WALK = 1 << 16  # a chain longer than this is not a prompt: stop walking
# A step's events are published after the step, by another thread of the engine than the
# one that answers: a turn's stores may come this long after its answer.
_LATE_S = 1.0

Conversation = tuple[str, str, str]  # tenant, routing session, replica id


@dataclass(frozen=True, slots=True)
class Held:
    """What the engine holds of a conversation's previous turn there."""

    tokens: int  # prompt tokens of that turn still held, in whole blocks
    whole: bool  # every block of that turn's prompt is still held
    turn_tokens: int  # that turn's prompt tokens
    turn_blocks: int  # that turn's prefix blocks, as routing cut them

    @property
    def evicted(self) -> bool:
        """The engine evicted part of that turn: what routing believes is capped."""
        return not self.whole


@dataclass(slots=True)
class _Block:
    parent: BlockHash | None
    depth: int


@dataclass
class _Replica:
    known: OrderedDict[BlockHash, _Block] = field(default_factory=OrderedDict)
    held: set[BlockHash] = field(default_factory=set)
    # depth -> (stored at, hash) of the latest stores at that depth, oldest first
    recent: dict[int, deque[tuple[float, BlockHash]]] = field(default_factory=dict)
    block_size: int = 0
    peak_held: int = 0


@dataclass(slots=True)
class _Turn:
    sent_at: float
    answered_at: float
    prompt_tokens: int
    blocks: int
    # The conversation's turn before it there, until this one's tip is found (its own tip
    # may be found later than this turn is answered: the chain is kept, not broken).
    previous: _Turn | None
    tip: BlockHash | None = None
    resolved: bool = False


class EngineChains:
    def __init__(
        self, conversations: int = 100_000, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self._replicas: dict[str, _Replica] = {}
        self._turns: OrderedDict[Conversation, _Turn] = OrderedDict()
        self._capacity = conversations
        self.now = clock

    # -- the engines' events (gateway/fleet/kv_events.py) ---------------------------------

    def apply(self, replica: str, batch: EventBatch, at: float | None) -> None:
        """One step's events; `at` when a live message came (None: replayed history, whose
        stores are known but belong to no turn sent since)."""
        state = self._replicas.get(replica)
        if state is None:
            state = self._replicas[replica] = _Replica()
        for event in batch.events:
            if isinstance(event, BlocksStored):
                if event.medium in PRIMARY_MEDIA:
                    self._stored(state, event, at)
            elif isinstance(event, BlocksRemoved):
                if event.medium in PRIMARY_MEDIA:
                    state.held.difference_update(event.hashes)
            elif isinstance(event, AllBlocksCleared):
                state.held.clear()

    def forget(self, replica: str) -> None:
        """A new engine (restarted, or one that may be): nothing it held is known."""
        self._replicas.pop(replica, None)

    def _stored(self, state: _Replica, event: BlocksStored, at: float | None) -> None:
        state.block_size = event.block_size or state.block_size
        known, held = state.known, state.held
        parent = event.parent
        above = known.get(parent) if parent is not None else None
        depth = 0 if parent is None else (above.depth if above is not None else -1)
        for block in event.hashes:
            depth = depth + 1 if depth >= 0 else -1  # -1: under a parent never seen
            if depth > 0:
                known[block] = _Block(parent, depth)
                known.move_to_end(block)
                held.add(block)
                if at is not None:
                    stores = state.recent.get(depth)
                    if stores is None:
                        stores = state.recent[depth] = deque(maxlen=_RECENT_PER_DEPTH)
                    stores.append((at, block))
            parent = block
        state.peak_held = max(state.peak_held, len(held))
        limit = state.peak_held + _REMOVED_KEPT
        while len(known) > limit:
            known.popitem(last=False)

    # -- conversations (the answers: gateway/telemetry/service.py) ------------------------

    def answered(
        self, conversation: Conversation, sent_at: float, prompt_tokens: int, blocks: int
    ) -> None:
        """A turn of this conversation was answered there: its tip is looked for later.
        Nothing is kept for a replica whose events are not followed."""
        if conversation[2] not in self._replicas:
            return
        earlier = self._turns.get(conversation)
        if earlier is not None:
            self._tip(conversation[2], earlier)  # what can be found now: short chains back
            if earlier.resolved and earlier.tip is None:
                earlier = None  # its tip was never found: this turn starts afresh
        self._turns[conversation] = _Turn(sent_at, self.now(), prompt_tokens, blocks, earlier)
        self._turns.move_to_end(conversation)
        if len(self._turns) > self._capacity:
            self._turns.popitem(last=False)

    def held_at(self, tenant: str, session: str, replicas: Sequence[str]) -> dict[str, Held]:
        """`held` at each of these replicas where it is known (the router's question, once
        per request: nothing to do while no replica's events are followed)."""
        if not self._replicas:
            return {}
        out = {}
        for replica in replicas:
            held = self.held((tenant, session, replica))
            if held is not None:
                out[replica] = held
        return out

    def held(self, conversation: Conversation) -> Held | None:
        """What the engine holds of the conversation's last turn there; None when that is
        not known (no turn answered there, no events followed, its tip not found)."""
        state = self._replicas.get(conversation[2])
        turn = self._turns.get(conversation) if state is not None else None
        if state is None or turn is None:
            return None
        tip = self._tip(conversation[2], turn)
        if tip is None:
            return None
        # vLLM frees a request's blocks tail first and a hit touches a whole prefix, so
        # what an engine holds of a chain is a prefix of it (the router's index assumes
        # the same): walk up from the tip to the first block still held.
        entry = state.known.get(tip)
        block: BlockHash | None = tip
        steps = 0
        while entry is not None and block not in state.held and steps < _MAX_WALK:
            block = entry.parent
            entry = state.known.get(block) if block is not None else None
            steps += 1
        if block is not None and entry is None:
            return None  # the chain runs into blocks forgotten here: cannot tell
        depth = entry.depth if entry is not None and block in state.held else 0
        whole = block == tip
        return Held(
            tokens=depth * state.block_size,
            whole=whole,
            turn_tokens=turn.prompt_tokens,
            turn_blocks=turn.blocks,
        )

    def _tip(self, replica: str, turn: _Turn) -> BlockHash | None:
        if turn.resolved:
            return turn.tip
        state = self._replicas.get(replica)
        until = turn.answered_at + _LATE_S
        if state is None or not state.block_size:  # no stores heard of: none will be found
            if self.now() > until:
                turn.resolved, turn.previous = True, None
            return None
        depth = turn.prompt_tokens // state.block_size
        found = {block for at, block in state.recent.get(depth, ()) if turn.sent_at <= at <= until}
        previous = self._tip(replica, turn.previous) if turn.previous is not None else None
        if turn.previous is not None and previous is None and not turn.previous.resolved:
            return None  # the turn before is still being looked for: so is this one
        if previous is not None:
            through = state.known.get(previous)
            if through is not None and through.depth == depth:
                found.add(previous)  # nothing new to store: the previous tip again
            found = {b for b in found if self._runs_through(state, b, previous)}
        if len(found) == 1:
            turn.tip, turn.resolved = found.pop(), True
        elif self.now() > until:  # every store of the turn is in: none, or several alike
            turn.resolved = True
        if turn.resolved:
            turn.previous = None  # the chain back is no longer needed
        return turn.tip

    @staticmethod
    def _runs_through(state: _Replica, block: BlockHash, ancestor: BlockHash) -> bool:
        target = state.known.get(ancestor)
        if target is None:
            return False
        entry = state.known.get(block)
        current: BlockHash | None = block
        while entry is not None and entry.depth > target.depth:
            current = entry.parent
            entry = state.known.get(current) if current is not None else None
        return current == ancestor
