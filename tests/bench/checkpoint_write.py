"""Benchmark: session checkpoint writes and loads against local Redis.

    .venv/bin/python -m tests.bench.checkpoint_write [--redis-url URL] [--out FILE]

Replays tau-bench conversations turn by turn through the gateway's real session code
(`SessionTurns.begin` then `commit`, what every session turn costs the request path) until
each conversation's history reaches 32 KB, against the Redis at --redis-url (default: the
local one, database 9). Prints p50/p99 of the checkpoint write and of the session load,
and the Redis memory a 32 KB session takes (MEMORY USAGE), then writes JSON. The same
replay again for a tenant with `limits.stored_bytes` (a cap it never reaches): what the
count costs each turn (gateway/state/stored_bytes.py), each conversation replayed as both
tenants in turn, so that the machine's drift falls on both.

Then one long session in delta mode (the client sends each turn's new message only;
`--long-turns`, default 3,000, tau-bench messages in turn): what `begin` (load the
session, build the engine's conversation) costs at 10, 100, 1,000 and 3,000 turns, what
its turns and its snapshot take in Redis, and what a commit costs: the median of the last
64, and the one that kept the snapshot (sessions/store.py). The process's own garbage
collections land on a few commits (about 30 ms each at 1,000 turns, when the benchmark
holds every turn's messages): the median leaves them out.
A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from typing import Any

import orjson
import redis.asyncio as aioredis

from engine.supervisor import ROOT
from gateway.chat.replies import normalise
from gateway.offline.replay.sim import percentile
from gateway.sessions.ids import SessionRef
from gateway.sessions.store import SNAPSHOT_EVERY, RedisCheckpoints
from gateway.sessions.turns import SessionTurns
from gateway.state.keys import stored_bytes_key
from gateway.state.stored_bytes import StoredBytes
from tests.bench.report import write_report
from tests.bench.tau_routing import DATA

HISTORY_BYTES = 32 * 1024


def conversations(limit: int) -> list[dict[str, Any]]:
    out = []
    with DATA.open() as lines:
        for line in lines:
            out.append(json.loads(line))
            if len(out) == limit:
                break
    return out


async def run(redis_url: str, limit: int) -> dict[str, Any]:
    redis = aioredis.Redis.from_url(redis_url)
    capped_tenant = f"bench-capped-{uuid.uuid4().hex[:8]}"
    stored = StoredBytes(redis, ttl_s=600, cap_of=lambda t: 10**12 if t == capped_tenant else None)
    turns = SessionTurns(RedisCheckpoints(redis, ttl_s=600, stored=stored), stored=stored)
    writes: list[float] = []
    loads: list[float] = []
    capped_writes: list[float] = []
    capped_loads: list[float] = []
    memory: list[int] = []
    try:
        for number, record in enumerate(conversations(limit)):
            # Each conversation twice: as a tenant without a cap and as one with; which
            # goes first alternates, so that neither pass gets a warmer Redis.
            for capped in (False, True) if number % 2 == 0 else (True, False):
                session = SessionRef(capped_tenant if capped else "bench", uuid.uuid4().hex)
                messages = record["messages"]
                for i, message in enumerate(messages):
                    if message["role"] != "assistant":
                        continue
                    history = messages[:i]
                    if len(orjson.dumps(history)) > HISTORY_BYTES:
                        break
                    body = {"model": "tiny", "messages": history, "tools": record["tools"]}
                    t0 = time.perf_counter()
                    turn, sent = await turns.begin(session, "full", body)
                    t1 = time.perf_counter()
                    await turns.commit(
                        turn, engine_body=sent, reply=normalise(message), usage=None,
                        route={"replica": "r", "reason": "prefix"}, request_id="b",
                        model="tiny",
                    )  # fmt: skip
                    t2 = time.perf_counter()
                    (capped_loads if capped else loads).append((t1 - t0) * 1e6)
                    (capped_writes if capped else writes).append((t2 - t1) * 1e6)
                if not capped:
                    used = 0
                    for part in ("turns", "blobs"):
                        used += int(await redis.memory_usage(session.key(part)) or 0)
                    memory.append(used)
                await redis.delete(session.key("turns"), session.key("blobs"))
    finally:
        await redis.delete(
            stored_bytes_key(capped_tenant, "expiry"), stored_bytes_key(capped_tenant, "bytes")
        )
        await redis.aclose()
    return {
        "turns": len(writes),
        "sessions": len(memory),
        "history_bytes_at_most": HISTORY_BYTES,
        "write_us": _p50_p99(writes),
        "load_us": _p50_p99(loads),
        "redis_bytes_per_session": {"mean": round(sum(memory) / max(1, len(memory)))},
        "capped_tenant": {
            "turns": len(capped_writes),
            "write_us": _p50_p99(capped_writes),
            "load_us": _p50_p99(capped_loads),
        },
    }


def _p50_p99(samples: list[float]) -> dict[str, int]:
    ordered = sorted(samples)
    return {"p50": round(percentile(ordered, 0.5)), "p99": round(percentile(ordered, 0.99))}


LONG_AT = (10, 100, 1_000, 3_000)
KEYS = ("turns", "snapshot")


async def long_session(redis_url: str, turns_total: int) -> list[dict[str, Any]]:
    """`begin`'s time (best of 5) at each of `LONG_AT` turns of one delta-mode session."""
    redis = aioredis.Redis.from_url(redis_url)
    turns = SessionTurns(RedisCheckpoints(redis, ttl_s=600))
    session = SessionRef("bench", uuid.uuid4().hex)
    messages = [m for record in conversations(100) for m in record["messages"]]
    users = [m for m in messages if m["role"] == "user"]
    replies = [normalise(m) for m in messages if m["role"] == "assistant"]
    rows: list[dict[str, Any]] = []
    commits: list[float] = []  # each turn's commit, seconds
    try:
        for n in range(1, turns_total + 1):
            body = {"model": "tiny", "messages": [users[n % len(users)]]}
            if n - 1 in LONG_AT:  # the session holds n - 1 turns
                best = min([await _timed(turns.begin(session, "delta", body)) for _ in range(5)])
                kept = [int(await redis.memory_usage(session.key(k)) or 0) for k in KEYS]
                recent = sorted(commits[-SNAPSHOT_EVERY:])
                median = recent[len(recent) // 2] * 1e3
                # The last commit that kept a snapshot (turn numbers start at 1).
                last = (n - 1) // SNAPSHOT_EVERY * SNAPSHOT_EVERY
                snapshot_ms = commits[last - 1] * 1e3 if last else 0.0
                rows.append({"turns": n - 1, "begin_ms": round(best * 1e3, 2),
                             "stored_bytes": dict(zip(KEYS, kept, strict=True)),
                             "commit_median_ms": round(median, 2),
                             "snapshot_commit_ms": round(snapshot_ms, 2)})  # fmt: skip
                print(
                    f"  {n - 1:>6,} turns: begin {best * 1e3:6.2f} ms, stored {kept[0]:>10,} B"
                    f" + snapshot {kept[1]:>10,} B; commit {median:5.2f} ms (median of the last"
                    f" {SNAPSHOT_EVERY}), {snapshot_ms:5.2f} ms keeping the snapshot",
                    flush=True,
                )
            turn, sent = await turns.begin(session, "delta", body)
            commits.append(
                await _timed(
                    turns.commit(
                        turn, engine_body=sent, reply=replies[n % len(replies)], usage=None,
                        route={"replica": "r", "reason": "prefix"}, request_id="b", model="tiny",
                    )
                )
            )  # fmt: skip
    finally:
        await redis.delete(*(session.key(k) for k in ("blobs", *KEYS)))
        await redis.aclose()
    return rows


async def _timed(work: Any) -> float:
    started = time.perf_counter()
    await work
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/9")
    parser.add_argument("--conversations", type=int, default=100)
    parser.add_argument("--long-turns", type=int, default=LONG_AT[-1] + 1)
    parser.add_argument("--out", default=str(ROOT / ".run" / "bench" / "checkpoint-write.json"))
    args = parser.parse_args()
    report = asyncio.run(run(args.redis_url, args.conversations))
    print(f"{report['turns']} turns over {report['sessions']} sessions (history <= 32 KB)")
    print(f"{'operation':<20} {'p50 us':>8} {'p99 us':>8}")
    for name in ("write", "load"):
        figures = report[f"{name}_us"]
        print(f"{'checkpoint ' + name:<20} {figures['p50']:>8} {figures['p99']:>8}")
    capped = report["capped_tenant"]
    print(f"a tenant with limits.stored_bytes: {capped['turns']} turns")
    for name in ("write", "load"):
        figures = capped[f"{name}_us"]
        print(f"{'checkpoint ' + name:<20} {figures['p50']:>8} {figures['p99']:>8}")
    print(f"redis memory per session: {report['redis_bytes_per_session']['mean']:,} bytes")
    print("one long session, delta mode:")
    report["long_session"] = asyncio.run(long_session(args.redis_url, args.long_turns))
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
