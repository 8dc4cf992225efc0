"""Where checkpoints live: Redis, or an in-memory twin for unit tests.

Per session up to three keys in one hash slot: `turns`, a list with one checkpoint per
completed turn (RPUSH's reply is the turn number, so concurrent gateways never hand out
the same one), `blobs`, a hash of tool sets by digest, and `snapshot`, the first turns
folded (`Stored`). A turn is appended in one MULTI/EXEC with the TTL refresh, so a reader
sees a turn whole or not at all, on any gateway replica.

A request needs its earlier turns folded, not each of them: reading every checkpoint cost
9 ms at 1,000 turns and 35 ms at 3,000 (`make bench-sessions`), on every request of the
session. So every `SNAPSHOT_EVERY` turns the gateway that appended the turn also stores
the fold up to it, and `load_stored` reads the snapshot and the turns after it in one
script. That script costs a short session about 60 us more than reading its list (Redis
copies the turns through Lua), so it is used only for sessions this process has seen
reach a snapshot; another session is read as a list, and remembered once it is long.
The snapshot is only a shortcut: it is written by a script that checks the turn
it ends with is the one this gateway just appended (no other turn came between its read
and its append, and the session was not deleted and made again), it expires with the
turns, and a session without one (older, or forked) is read whole, as before. Time travel
and forks read the turns themselves.

What a session holds (its turns, tool sets and snapshot) counts against its tenant's
`limits.stored_bytes` (gateway/state/stored_bytes.py), and is the tenant's again when
the session expires or is deleted; a fork, which only writes, is refused once the tenant
is full, and a turn is checked when it begins (sessions/turns.py).

A fork never writes over a session: the target is checked and written by one Lua script
on the target's slot, so of two forks racing to one new id exactly one lands, whole, and
the other is told the id is taken (a check-then-write from the gateway could not promise
that across replicas).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import OrderedDict
from typing import Protocol

import redis.asyncio as aioredis

from gateway.errors import Conflict, StateUnavailable
from gateway.sessions.checkpoints import Checkpoint, Stored
from gateway.sessions.ids import MAX_ID_LENGTH, SessionRef
from gateway.state.redis_client import RedisClient
from gateway.state.stored_bytes import StoredBytes

log = logging.getLogger(__name__)

_NEW_ID_TRIES = 5
# Turns between snapshots: a request reads at most this many checkpoints besides one.
SNAPSHOT_EVERY = 64
_LONG_SESSIONS_KEPT = 50_000  # sessions known to have a snapshot, least recent forgotten


class CheckpointStore(Protocol):
    async def load(self, session: SessionRef) -> list[Checkpoint]:
        """Every turn, for time travel and forks."""
        ...

    async def load_stored(self, session: SessionRef) -> Stored:
        """The turns folded, for a request continuing the session."""
        ...

    async def blobs(self, session: SessionRef) -> dict[str, bytes]: ...

    async def append(
        self,
        session: SessionRef,
        checkpoint: Checkpoint,
        blobs: dict[str, bytes],
        *,
        prior: Stored | None = None,
    ) -> int:
        """Store a completed turn; return its number (1-based). `prior`: the session's
        turns before it, folded (`load_stored`), from which the store may keep a snapshot."""
        ...

    async def fork(self, source: SessionRef, turns: int, target: SessionRef) -> bool:
        """`target` becomes a copy of `source`'s first `turns` turns; False, and nothing
        written, when `target` exists already."""
        ...

    async def delete(self, session: SessionRef) -> bool: ...


# KEYS: the target's turns and blobs (one hash tag: one slot). ARGV: TTL (s), number of
# turns, the turns, then the blobs as name, value pairs. 1 when written; 0 when the target
# exists (nothing is written). Pushed in batches: Lua's unpack stops at 8,000 values.
FORK = """
if redis.call('EXISTS', KEYS[1], KEYS[2]) > 0 then return 0 end
local ttl, turns = ARGV[1], tonumber(ARGV[2])
local function write(command, key, first, last)
  if first > last then return end
  for i = first, last, 1000 do
    redis.call(command, key, unpack(ARGV, i, math.min(i + 999, last)))
  end
  redis.call('EXPIRE', key, ttl)
end
write('RPUSH', KEYS[1], 3, 2 + turns)
write('HSET', KEYS[2], 3 + turns, #ARGV)  -- 1,000 a batch: name, value pairs stay whole
return 1
"""


# KEYS: turns, snapshot. The snapshot (or nil when there is none, or it counts more turns
# than the list holds), then the turns after it: the whole list without one.
LOAD_STORED = """
local snapshot = redis.call('GET', KEYS[2])
local from = 0
if snapshot then
  local turns = tonumber(string.match(snapshot, '^(%d+)\\n'))
  if turns and turns <= redis.call('LLEN', KEYS[1]) then from = turns else snapshot = false end
end
local out = redis.call('LRANGE', KEYS[1], from, -1)
table.insert(out, 1, snapshot)
return out
"""

# KEYS: turns, snapshot. ARGV: the turn number, the checkpoint this gateway appended as
# it, the snapshot, its TTL (s). Written only when that turn is still the checkpoint there.
# 0 when not written, else 1 + the length of the snapshot it replaced.
KEEP_SNAPSHOT = """
if redis.call('LINDEX', KEYS[1], tonumber(ARGV[1]) - 1) ~= ARGV[2] then return 0 end
local before = redis.call('STRLEN', KEYS[2])
redis.call('SET', KEYS[2], ARGV[3], 'EX', ARGV[4])
return before + 1
"""


class RedisCheckpoints:
    def __init__(
        self, redis: RedisClient, *, ttl_s: int, stored: StoredBytes | None = None
    ) -> None:
        self._redis = redis
        self._ttl_s = ttl_s
        self._stored = stored
        self._fork = redis.register_script(FORK)
        self._load_stored = redis.register_script(LOAD_STORED)
        self._keep_snapshot = redis.register_script(KEEP_SNAPSHOT)
        self._long: OrderedDict[SessionRef, None] = OrderedDict()

    async def load(self, session: SessionRef) -> list[Checkpoint]:
        try:
            raw = await self._redis.lrange(session.key("turns"), 0, -1)
        except (aioredis.RedisError, OSError) as exc:
            raise _unavailable(exc) from None
        return [Checkpoint.from_json(_bytes(item)) for item in raw]

    async def load_stored(self, session: SessionRef) -> Stored:
        try:
            if session in self._long:
                self._long.move_to_end(session)
                raw = await self._load_stored(keys=[session.key("turns"), session.key("snapshot")])
                snapshot, turns = raw[0], raw[1:]
            else:
                snapshot, turns = None, await self._redis.lrange(session.key("turns"), 0, -1)
        except (aioredis.RedisError, OSError) as exc:
            raise _unavailable(exc) from None
        start = Stored.from_snapshot(_bytes(snapshot)) if snapshot else Stored()
        stored = start.then([Checkpoint.from_json(_bytes(item)) for item in turns])
        if stored.turns >= SNAPSHOT_EVERY:
            self._seen_long(session)
        return stored

    def _seen_long(self, session: SessionRef) -> None:
        self._long[session] = None
        self._long.move_to_end(session)
        if len(self._long) > _LONG_SESSIONS_KEPT:
            self._long.popitem(last=False)

    async def blobs(self, session: SessionRef) -> dict[str, bytes]:
        try:
            raw = await self._redis.hgetall(session.key("blobs"))
        except (aioredis.RedisError, OSError) as exc:
            raise _unavailable(exc) from None
        return {_bytes(k).decode(): _bytes(v) for k, v in raw.items()}

    async def append(
        self,
        session: SessionRef,
        checkpoint: Checkpoint,
        blobs: dict[str, bytes],
        *,
        prior: Stored | None = None,
    ) -> int:
        turns, blob_key = session.key("turns"), session.key("blobs")
        snapshot_key = session.key("snapshot")
        written = checkpoint.to_json()
        # A tenant without a cap has nothing counted, and no task is made for it.
        stored = self._stored if self._stored and self._stored.counts(session.tenant) else None
        # The turn's bytes are counted while it is written (another slot, another round
        # trip: waited for one after the other, the count cost a turn 190 us more), and
        # taken back if the write fails; a tool set, new only now and then, after.
        counted = None
        if stored is not None:
            counted = asyncio.ensure_future(
                stored.charge(session.tenant, "s", session.id, len(written))
            )
        try:
            async with self._redis.pipeline(transaction=True) as tx:
                for name, value in blobs.items():
                    tx.hsetnx(blob_key, name, value)
                tx.rpush(turns, written)
                tx.expire(turns, self._ttl_s)
                tx.expire(blob_key, self._ttl_s)
                tx.expire(snapshot_key, self._ttl_s)
                results = await tx.execute()
        except (aioredis.RedisError, OSError) as exc:
            if stored is not None and counted is not None:  # not written: not held
                await counted
                counted = None  # awaited: the `finally` has nothing left to wait for
                await stored.charge(session.tenant, "s", session.id, -len(written))
            raise _unavailable(exc) from None
        finally:
            if counted is not None:  # never left running, however the write ended
                await counted
        number = int(results[len(blobs)])
        added = [value for value, new in zip(blobs.values(), results, strict=False) if new]
        if stored is not None and added:
            await stored.charge(session.tenant, "s", session.id, sum(map(len, added)))
        # Only when no other turn came between the read of `prior` and this append.
        if prior is not None and number == prior.turns + 1 and number % SNAPSHOT_EVERY == 0:
            await self._keep(session, number, written, prior.then([checkpoint]))
            self._seen_long(session)
        return number

    async def _keep(self, session: SessionRef, number: int, written: bytes, fold: Stored) -> None:
        """The snapshot at this turn; a shortcut only, so a failure just leaves the last."""
        snapshot = fold.snapshot()
        try:
            kept = await self._keep_snapshot(
                keys=[session.key("turns"), session.key("snapshot")],
                args=[number, written, snapshot, self._ttl_s],
            )
        except (aioredis.RedisError, OSError) as exc:
            log.warning("session snapshot not kept (%s): read whole until the next", exc)
            return
        if kept and self._stored is not None:  # it replaced the last: its growth is held
            await self._stored.charge(session.tenant, "s", session.id, len(snapshot) - kept + 1)

    async def fork(self, source: SessionRef, turns: int, target: SessionRef) -> bool:
        if self._stored is not None:
            await self._stored.admit(target.tenant)
        try:
            items = await self._redis.lrange(source.key("turns"), 0, turns - 1)
            blobs = await self._redis.hgetall(source.key("blobs"))
            # Source and target may sit in different hash slots (cluster nodes): the source
            # is read first, the target checked and written by one script on its own slot.
            pairs = [part for name, value in blobs.items() for part in (_bytes(name), value)]
            written = await self._fork(
                keys=[target.key("turns"), target.key("blobs")],
                args=[self._ttl_s, len(items), *items, *pairs],
            )
        except (aioredis.RedisError, OSError) as exc:
            raise _unavailable(exc) from None
        if written and self._stored is not None:
            copied = sum(map(len, items)) + sum(len(_bytes(value)) for value in blobs.values())
            await self._stored.charge(target.tenant, "s", target.id, copied)
        return bool(written)

    async def delete(self, session: SessionRef) -> bool:
        try:
            removed = await self._redis.delete(
                session.key("turns"), session.key("blobs"), session.key("snapshot")
            )
            self._long.pop(session, None)
        except (aioredis.RedisError, OSError) as exc:
            raise _unavailable(exc) from None
        if self._stored is not None:
            await self._stored.forget(session.tenant, "s", session.id)
        return bool(removed)


class MemoryCheckpoints:
    """In-memory twin for unit tests."""

    def __init__(self) -> None:
        self.turns: dict[SessionRef, list[Checkpoint]] = {}
        self.blob_store: dict[SessionRef, dict[str, bytes]] = {}

    async def load(self, session: SessionRef) -> list[Checkpoint]:
        return list(self.turns.get(session, []))

    async def load_stored(self, session: SessionRef) -> Stored:
        return Stored().then(self.turns.get(session, []))

    async def blobs(self, session: SessionRef) -> dict[str, bytes]:
        return dict(self.blob_store.get(session, {}))

    async def append(
        self,
        session: SessionRef,
        checkpoint: Checkpoint,
        blobs: dict[str, bytes],
        *,
        prior: Stored | None = None,
    ) -> int:
        for name, value in blobs.items():
            self.blob_store.setdefault(session, {}).setdefault(name, value)
        self.turns.setdefault(session, []).append(checkpoint)
        return len(self.turns[session])

    async def fork(self, source: SessionRef, turns: int, target: SessionRef) -> bool:
        if target in self.turns or target in self.blob_store:
            return False
        self.turns[target] = list(self.turns.get(source, []))[:turns]
        self.blob_store[target] = dict(self.blob_store.get(source, {}))
        return True

    async def delete(self, session: SessionRef) -> bool:
        found = session in self.turns
        self.turns.pop(session, None)
        self.blob_store.pop(session, None)
        return found


async def fork_to_new_id(
    store: CheckpointStore, source: SessionRef, turns: int, prefix: str
) -> SessionRef:
    """A fork under an id the gateway makes up (`prefix` + 8 hex digits, the prefix cut to
    keep it a session id the API takes); another one when that id is taken, which happens
    about never (the fork refuses it: nothing is overwritten either way)."""
    prefix = prefix[: MAX_ID_LENGTH - 8]
    for _ in range(_NEW_ID_TRIES):
        target = SessionRef(source.tenant, f"{prefix}{uuid.uuid4().hex[:8]}")
        if await store.fork(source, turns, target):
            return target
    raise Conflict(f"No free session id for a fork of `{source.id}`.", code="session_exists")


def _unavailable(exc: Exception) -> StateUnavailable:
    return StateUnavailable(f"The session store is unreachable ({type(exc).__name__}).")


def _bytes(value: bytes | str) -> bytes:
    return value if isinstance(value, bytes) else value.encode()
