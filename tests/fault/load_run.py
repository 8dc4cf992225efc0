"""Benchmark: streaming load through a real gateway while one engine is killed and restarted.

    PYTHONPATH=. .venv/bin/python -m tests.fault.load_run [--clients 200] [--seconds 60]
        [--redis-url URL] [--out FILE]

Starts two fault upstreams (`tests/fault/fault_upstream.py`, 20 tokens at 10 ms each, like
a real engine's pace), a spare one (the fallback pool) and `gateway serve` in front of them
(the fault suite's policy; admission sized so one replica may hold every client, because
shedding is not what is measured here). N clients each loop streamed chat requests for S
seconds; half of them hold multi-turn sessions (`X-Session-Id`, full history resent, a new
session every 8 turns). Replica a is SIGKILLed at S/3 and restarted on its port at 2S/3.

Every request is judged as the client sees it:
- succeeded: 200, every event JSON, ending `data: [DONE]`;
- failed_clean: an OpenAI-shaped error with a sensible status (429, 502, 503, 504), in the
  body or as an in-stream error event that ends the stream (no `[DONE]`);
- failed_unclean: anything else (a 500, another status, a body that is not an OpenAI error,
  a stream cut without an error event, malformed SSE, no answer within the client timeout).

At the end each session's checkpoints are listed (`GET /v1/sessions/{id}/checkpoints`, then
the session is deleted): a turn that ended with `[DONE]` but has no checkpoint is lost.
Progress is printed to stderr every 10 s; one JSON object is printed at the end (stdout)
and written to --out.
Targets: failed_unclean == 0, lost_checkpoints == 0, succeeded / attempted >= 0.99 with
only requests that had begun streaming from the killed replica counted as failures
(`success_ratio_excluding_those`). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import aiohttp
import orjson

from gateway.offline.replay.sim import percentile
from tests.fault.harness import ROOT, FaultUpstream, gateway_policy, running_upstreams
from tests.integration.conftest import running_gateway

TOKENS = 20
TOKEN_DELAY_S = 0.01
CLIENT_TIMEOUT_S = 30.0  # past this a request counts as hung
TURNS_PER_SESSION = 8
CLEAN_STATUSES = frozenset({429, 502, 503, 504})

Kind = Literal["ok", "clean", "unclean"]


@dataclass
class Result:
    kind: Kind
    status: int
    elapsed_s: float
    replica: str | None = None
    chunks: int = 0  # completion chunks that reached the client before the end
    reason: str = ""  # what made a failure clean or unclean
    reply: str = ""


@dataclass
class SessionLog:
    id: str
    completed_turns: int = 0


@dataclass
class Tally:
    results: list[Result] = field(default_factory=list)
    sessions: list[SessionLog] = field(default_factory=list)

    def line(self, t: float) -> str:
        kinds = Counter(r.kind for r in self.results)
        return (
            f"t={t:5.1f}s attempted={len(self.results)} ok={kinds['ok']} "
            f"clean={kinds['clean']} unclean={kinds['unclean']}"
        )


def _is_openai_error(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("message"), str)
        and isinstance(value.get("type"), str)
        and "code" in value
    )


async def one_request(
    http: aiohttp.ClientSession, url: str, messages: list[dict[str, str]], session: str | None
) -> Result:
    body = {"model": "main", "messages": messages, "stream": True, "max_tokens": TOKENS}
    headers = {"X-Session-Id": session} if session else {}
    start = time.monotonic()
    status, replica, chunks = 0, None, 0

    def result(kind: Kind, reason: str, reply: str = "") -> Result:
        elapsed = time.monotonic() - start
        return Result(kind, status, elapsed, replica, chunks, reason, reply)

    try:
        async with asyncio.timeout(CLIENT_TIMEOUT_S):
            async with http.post(url, json=body, headers=headers) as resp:
                status, replica = resp.status, resp.headers.get("X-Gateway-Replica")
                if status != 200:
                    raw = await resp.read()
                    try:
                        error = orjson.loads(raw).get("error")
                    except (orjson.JSONDecodeError, AttributeError):
                        error = None
                    if status in CLEAN_STATUSES and _is_openai_error(error):
                        return result("clean", f"http {status}")
                    return result("unclean", f"http {status}: {raw[:120]!r}")
                buffer, reply, done = b"", [], False
                async for raw in resp.content.iter_any():
                    buffer += raw
                    while b"\n\n" in buffer:
                        event, buffer = buffer.split(b"\n\n", 1)
                        if done or not event.startswith(b"data: "):
                            return result("unclean", f"malformed SSE: {event[:120]!r}")
                        data = event[6:]
                        if data == b"[DONE]":
                            done = True
                            continue
                        try:
                            chunk = orjson.loads(data)
                        except orjson.JSONDecodeError:
                            return result("unclean", f"event not JSON: {data[:120]!r}")
                        if "error" in chunk:
                            if not _is_openai_error(chunk["error"]):
                                return result("unclean", f"odd error event: {data[:120]!r}")
                            rest = await resp.content.read()
                            if buffer or rest:
                                return result("unclean", "events after the error event")
                            return result("clean", f"in-stream {chunk['error'].get('code')}")
                        chunks += 1
                        for choice in chunk.get("choices") or ():
                            reply.append(choice.get("delta", {}).get("content") or "")
                if buffer:
                    return result("unclean", f"stream ended inside an event: {buffer[:120]!r}")
                if not done:
                    return result("unclean", "stream ended without [DONE] or an error event")
                return result("ok", "", "".join(reply))
    except TimeoutError:
        return result("unclean", f"no complete answer within {CLIENT_TIMEOUT_S:g}s")
    except aiohttp.ClientError as exc:
        return result("unclean", f"connection to the gateway failed: {type(exc).__name__}")


async def client_loop(
    http: aiohttp.ClientSession, url: str, n: int, with_session: bool, until: float, tally: Tally
) -> None:
    session: SessionLog | None = None
    history: list[dict[str, str]] = []
    turn = 0
    while time.monotonic() < until:
        if with_session and (session is None or session.completed_turns >= TURNS_PER_SESSION):
            session = SessionLog(f"load-{uuid.uuid4().hex[:12]}-{n}")
            tally.sessions.append(session)
            history = []
        turn += 1
        ask = {"role": "user", "content": f"client {n} turn {turn}: what next?"}
        messages = [*history, ask] if with_session else [ask]
        outcome = await one_request(http, url, messages, session.id if session else None)
        tally.results.append(outcome)
        if session is not None and outcome.kind == "ok":
            session.completed_turns += 1
            history = [*messages, {"role": "assistant", "content": outcome.reply}]
        if outcome.kind != "ok":
            await asyncio.sleep(0.05)  # a failing client does not spin


async def checkpoint_count(http: aiohttp.ClientSession, base: str, session: str) -> int:
    """How many checkpoints the session has; then it is deleted (the run leaves no state)."""
    async with http.get(f"{base}/sessions/{session}/checkpoints") as resp:
        if resp.status == 404:
            return 0
        resp.raise_for_status()
        count = len((await resp.json())["data"])
    async with http.delete(f"{base}/sessions/{session}") as resp:
        resp.raise_for_status()
    return count


async def fault_schedule(victim: FaultUpstream, seconds: float, start: float) -> None:
    await asyncio.sleep(max(0.0, start + seconds / 3 - time.monotonic()))
    await asyncio.to_thread(victim.kill)
    say(f"t={time.monotonic() - start:5.1f}s SIGKILLed upstream {victim.name} ({victim.url})")
    await asyncio.sleep(max(0.0, start + 2 * seconds / 3 - time.monotonic()))
    await asyncio.to_thread(victim.start)
    say(f"t={time.monotonic() - start:5.1f}s restarted upstream {victim.name} on {victim.url}")


async def progress(tally: Tally, start: float) -> None:
    while True:
        await asyncio.sleep(10)
        say(tally.line(time.monotonic() - start))


async def drive(v1: str, victim: FaultUpstream, clients: int, seconds: float) -> dict[str, Any]:
    tally = Tally()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        start = time.monotonic()
        until = start + seconds
        schedule = asyncio.create_task(fault_schedule(victim, seconds, start))
        ticker = asyncio.create_task(progress(tally, start))
        try:
            url = f"{v1}/chat/completions"
            await asyncio.gather(
                *(client_loop(http, url, n, n % 2 == 0, until, tally) for n in range(clients))
            )
            await schedule
        finally:
            ticker.cancel()
            schedule.cancel()
        say(tally.line(time.monotonic() - start) + " (done)")
        limit = asyncio.Semaphore(32)

        async def count(session: SessionLog) -> tuple[SessionLog, int]:
            async with limit:
                return session, await checkpoint_count(http, v1, session.id)

        stored = await asyncio.gather(*(count(s) for s in tally.sessions))
    return report(tally, stored, victim.replica_id(), clients, seconds)


def report(
    tally: Tally, stored: list[tuple[SessionLog, int]], killed: str, clients: int, seconds: float
) -> dict[str, Any]:
    results = tally.results
    ok = sorted(r.elapsed_s for r in results if r.kind == "ok")
    failed = [r for r in results if r.kind != "ok"]
    # Begun streaming: the killed replica's answer had reached the client, chunks and all.
    from_killed = [r for r in failed if r.chunks and r.replica == killed]
    # Committed to it (200 sent) but cut before its first chunk.
    headers_only = [r for r in failed if r.status == 200 and not r.chunks and r.replica == killed]
    lost = sum(max(0, s.completed_turns - n) for s, n in stored)
    counted = len(results) - len(from_killed)
    return {
        "attempted": len(results),
        "succeeded": len(ok),
        "failed_clean": sum(1 for r in failed if r.kind == "clean"),
        "failed_unclean": sum(1 for r in failed if r.kind == "unclean"),
        "lost_checkpoints": lost,
        "p99_ms": round(percentile(ok, 0.99) * 1000, 1),
        "failed_after_first_byte_from_killed": len(from_killed),
        "success_ratio_excluding_those": round(len(ok) / counted, 5) if counted else 0.0,
        # Context for the figures above.
        "failed_before_first_chunk_from_killed": len(headers_only),
        "p50_ms": round(percentile(ok, 0.5) * 1000, 1),
        "success_ratio": round(len(ok) / len(results), 5) if results else 0.0,
        "clients": clients,
        "seconds": seconds,
        "sessions": len(stored),
        "session_turns_completed": sum(s.completed_turns for s, _ in stored),
        "checkpoints_found": sum(min(n, s.completed_turns) for s, n in stored),
        "extra_checkpoints": sum(max(0, n - s.completed_turns) for s, n in stored),
        "failure_reasons": dict(Counter(f"{r.kind}: {r.reason}" for r in failed).most_common(12)),
        "served_by": dict(Counter(r.replica or "-" for r in results if r.kind == "ok")),
        "killed_replica": killed,
    }


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/9")
    parser.add_argument("--out", default=str(ROOT / ".run" / "bench" / "fault-load.json"))
    args = parser.parse_args()
    work = ROOT / ".run" / "bench" / "fault-load"
    work.mkdir(parents=True, exist_ok=True)
    with running_upstreams(
        ["a", "b", "spare"], work, tokens=TOKENS, token_delay_s=TOKEN_DELAY_S
    ) as (a, b, spare):
        policy = work / "policy.yaml"
        policy.write_text(
            gateway_policy([a, b], spare, args.redis_url, max_inflight_per_replica=args.clients)
        )
        log = work / "gateway.log"
        log.unlink(missing_ok=True)
        with running_gateway(policy, log) as gateway:
            say(f"gateway {gateway.base_url}, upstreams a={a.url} b={b.url}; logs in {work}")
            result = asyncio.run(drive(gateway.v1, a, args.clients, args.seconds))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    say(f"wrote {out}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
