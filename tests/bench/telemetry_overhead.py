"""Benchmark: what telemetry costs a request, end to end through a real gateway process.

    .venv/bin/python -m tests.bench.telemetry_overhead [--requests N] [--rounds R] [--out F]
    (make bench-telemetry)

A fake engine (`tests.fault.fault_upstream`, 0 ms service time, 5 tokens) in its own
process; the gateway as a real server in front of it, once per setting: tracing off (no
exporter), tracing at the default sampling ratio (0.1), and every request traced (1.0),
each exporting over OTLP/HTTP to a local sink process that accepts and drops the spans.
Metrics, the usage ledger and the request log are on in every setting. One client at a
time (concurrency 1) sends non-streamed and streamed chat requests; the settings take
turns within each round so machine noise spreads over all of them. Prints p50/p99 client
latency per setting (medians over rounds) and the difference from tracing off, and the
direct (no gateway) latency for scale; writes JSON. The load generator shares the 2 cores.
A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from engine.supervisor import free_port
from gateway.offline.replay.sim import percentile
from tests.bench.report import write_report
from tests.fault.harness import ROOT, running_upstreams
from tests.lifetimes import suite_reaper

SETTINGS = {"traces off": None, "sampled 0.1 (default)": 0.1, "every request traced": 1.0}

_SINK = """
import http.server, sys
class Sink(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *args): pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()
"""


@contextmanager
def otlp_sink() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", _SINK, str(port)], start_new_session=True)
    suite_reaper().hold(proc.pid)  # gone with the benchmark, however it ends
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                httpx.post(f"http://127.0.0.1:{port}/v1/traces", content=b"", timeout=0.5)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/v1/traces"
    finally:
        proc.terminate()
        proc.wait(timeout=5)
        suite_reaper().release(proc.pid)


def policy_text(upstream: str, redis_url: str, sink: str, ratio: float | None, log: Path) -> str:
    traces = f'{{endpoint: "{sink}", sample_ratio: {ratio}}}' if ratio is not None else "{}"
    return f"""\
version: 1
state: {{redis_url: "{redis_url}"}}
telemetry:
  traces: {traces}
  request_log: "{log}"
pools:
  main:
    served_model: fault-main
    replicas: [{{url: "{upstream}"}}]
    price: {{input: 3.0, cached_input: 0.3, output: 15.0}}
models:
  main: {{pool: main}}
"""


@contextmanager
def gateway(policy: Path, log: Path) -> Iterator[str]:
    port = free_port()
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--policy", str(policy),
             "--port", str(port)],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/readyz", timeout=0.5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"gateway did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def run_requests(client: httpx.Client, url: str, count: int, stream: bool) -> list[float]:
    body: dict[str, Any] = {
        "model": "main",
        "messages": [
            {"role": "system", "content": "You are a careful travel agent. " * 40},
            {"role": "user", "content": "change my booking"},
        ],
        "max_tokens": 5,
        "stream": stream,
    }
    times: list[float] = []
    for _ in range(count):
        start = time.perf_counter()
        if stream:
            with client.stream("POST", url, json=body) as response:
                for _chunk in response.iter_raw():
                    pass
        else:
            client.post(url, json=body).raise_for_status()
        times.append((time.perf_counter() - start) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000, help="per setting, kind and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--out", default=str(ROOT / "tests/bench/results/telemetry-overhead.json"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="telemetry-bench-"))
    results: dict[str, dict[str, list[dict[str, float]]]] = {}
    with running_upstreams(["engine"], work) as (upstream,), otlp_sink() as sink:
        targets = {"direct (no gateway)": None, **SETTINGS}
        for round_ in range(1, args.rounds + 1):
            for name, ratio in targets.items():
                with (
                    _target(name, ratio, upstream.url, args.redis_url, sink, work) as base,
                    httpx.Client(timeout=30) as client,
                ):
                    url = f"{base}/v1/chat/completions"
                    run_requests(client, url, 100, False)  # warm-up
                    for stream in (False, True):
                        times = sorted(run_requests(client, url, args.requests, stream))
                        kind = "stream" if stream else "whole"
                        results.setdefault(name, {}).setdefault(kind, []).append(
                            {"p50": percentile(times, 0.5), "p99": percentile(times, 0.99)}
                        )
                print(f"round {round_}/{args.rounds}: {name} done", file=sys.stderr, flush=True)
    report = summarise(results, args)
    print_table(report)
    write_report(report, args.out)


@contextmanager
def _target(
    name: str, ratio: float | None, upstream: str, redis_url: str, sink: str, work: Path
) -> Iterator[str]:
    if name.startswith("direct"):
        yield upstream
        return
    slug = name.split()[0]
    policy = work / f"policy-{slug}.yaml"
    policy.write_text(
        policy_text(upstream, redis_url, sink, ratio, work / f"requests-{slug}.jsonl")
    )
    with gateway(policy, work / f"gateway-{slug}.log") as base:
        yield base


def summarise(
    results: dict[str, dict[str, list[dict[str, float]]]], args: argparse.Namespace
) -> dict[str, Any]:
    rows: dict[str, dict[str, dict[str, float]]] = {}
    for name, kinds in results.items():
        rows[name] = {
            kind: {q: round(statistics.median(r[q] for r in rounds), 3) for q in ("p50", "p99")}
            for kind, rounds in kinds.items()
        }
    off = rows["traces off"]
    for row in rows.values():
        for kind, figures in row.items():
            figures["p50_vs_traces_off"] = round(figures["p50"] - off[kind]["p50"], 3)
            figures["p99_vs_traces_off"] = round(figures["p99"] - off[kind]["p99"], 3)
    return {
        "benchmark": "telemetry_overhead",
        "date": time.strftime("%Y-%m-%d"),
        "requests_per_setting_kind_round": args.requests,
        "rounds": args.rounds,
        "concurrency": 1,
        "unit": "ms, client-side latency; medians over rounds",
        "results": rows,
    }


def print_table(report: dict[str, Any]) -> None:
    print(f"\n{'setting':<24}{'kind':<8}{'p50 ms':>9}{'p99 ms':>9}{'Δp50 vs off':>13}{'Δp99':>9}")
    for name, kinds in report["results"].items():
        for kind, f in kinds.items():
            print(
                f"{name:<24}{kind:<8}{f['p50']:>9.3f}{f['p99']:>9.3f}"
                f"{f['p50_vs_traces_off']:>+13.3f}{f['p99_vs_traces_off']:>+9.3f}"
            )


if __name__ == "__main__":
    main()
