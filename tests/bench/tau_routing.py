"""Benchmark: tau-bench agent conversations replayed turn by turn through routers in
front of the same 2 real `cpu-tiny` vLLM replicas, in one run.

    .venv/bin/python -m tests.bench.tau_routing [--conversations 24] [--out FILE]   (make bench-routing)

For every assistant turn of every conversation the request is the conversation so far
plus the domain's tools (max_tokens=1); conversations run 4 at a time, each turn after the
previous one, as agents do. Each target starts with empty prefix caches
(`POST /reset_prefix_cache`, vLLM's dev mode). The figure that matters is what the engines
report: uncached prompt tokens, sum(prompt_tokens - cached_tokens).

Targets: the gateway (cache-aware), the gateway set to round-robin, the Rust
`vllm-router --policy cache_aware` (its own cached virtual environment), and the gateway
with the client shuffling tool order on every request (add `--with-uncanonicalized` for the
same without canonicalization: slow, every request misses), and one replica alone: the
bound no routing can beat, since it sees every turn (two replicas must each compute the
shared system+tools prefix once more). Requests per replica come from each engine's own
/metrics; each gateway's request log is kept in .run/bench/tau-request-logs/.
Prints a table and writes JSON. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from engine.cli import resolve_model
from engine.profiles import load_profile
from engine.supervisor import ROOT, Launch, Paths, down, free_port, up

DATA = ROOT.parent / "shared" / "data" / "agent-trajectories" / "tau_bench_airline_dev.jsonl"
ROUTER_VERSION = "0.1.17"
CONCURRENCY = 4


@dataclass(frozen=True)
class Target:
    name: str
    kind: str  # gateway | vllm-router
    strategy: str = "cache_aware"
    canonicalize: bool = True
    shuffle_tools: bool = False
    weights: str = ""  # YAML flow mapping of routing weights, e.g. "{queue: 0}"
    replicas: int = 2
    # Two tenants taking turns by conversation, with this `prefix_cache` ("" = one tenant):
    # what keeping tenants' caches apart costs when they share a system prompt.
    tenants: str = ""


TARGETS = [
    Target("gateway cache-aware", "gateway"),
    Target("gateway round-robin", "gateway", strategy="round_robin"),
    Target("vllm-router cache_aware", "vllm-router"),
    Target("gateway, tools shuffled", "gateway", shuffle_tools=True),
    # The bound no router can beat: one replica sees every turn of every conversation.
    # (Two replicas must also each compute the shared system+tools prefix once.)
    Target("one replica (lower bound)", "gateway", replicas=1),
]
# Tenant cache isolation's cost: the same conversations, every other one sent by a second
# tenant (same system prompt and tools). Only on request.
TENANTS = [
    Target("two tenants, shared cache", "gateway", tenants="shared"),
    Target("two tenants, isolated caches", "gateway", tenants="isolated"),
]
TENANT_KEYS = ("sk-agw-bench-tenant-a-51c0", "sk-agw-bench-tenant-b-9e7d")
# Every request misses after the system prompt: slow on CPU, so only on request.
UNCANONICALISED = Target(
    "gateway, tools shuffled, no canonicalization",
    "gateway",
    canonicalize=False,
    shuffle_tools=True,
)


def conversations(limit: int, max_chars: int) -> list[list[dict[str, Any]]]:
    """Per conversation, the request bodies of its assistant turns, in order."""
    out: list[list[dict[str, Any]]] = []
    with DATA.open() as lines:
        for line in lines:
            if len(out) == limit:
                break
            record = json.loads(line)
            turns: list[dict[str, Any]] = []
            for i, message in enumerate(record["messages"]):
                if message["role"] != "assistant":
                    continue
                history = record["messages"][:i]
                if len(json.dumps(history)) > max_chars:
                    break
                turns.append({"messages": history, "tools": record["tools"]})
            out.append(turns)
    return out


def router_binary() -> Path:
    """vllm-router in its own environment, cached outside the checkout."""
    cache = Path(os.environ.get("AGW_CACHE", Path.home() / ".cache" / "agent-gateway"))
    venv = cache / f"bench-vllm-router-{ROUTER_VERSION}"
    binary = venv / "bin" / "vllm-router"
    if not binary.exists():
        print(f"bench: installing vllm-router {ROUTER_VERSION} into {venv}", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(venv / "bin" / "pip"), "install", "-q", f"vllm-router=={ROUTER_VERSION}"],
            check=True,
        )
    return binary


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url}: process exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"{url} did not come up")


def start_target(
    target: Target, workers: list[str], work: Path
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    slug = target.name.replace(" ", "_").replace(",", "")
    log = (work / f"{slug}.log").open("wb")
    log_dir = ROOT / ".run" / "bench" / "tau-request-logs"  # what each gateway decided
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / f"{slug}.jsonl").unlink(missing_ok=True)
    if target.kind == "vllm-router":
        cmd = [str(router_binary()), "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *workers,
               "--policy", "cache_aware", "--log-level", "warning"]  # fmt: skip
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        wait_http(f"http://127.0.0.1:{port}/health", proc)
        return proc, f"http://127.0.0.1:{port}/v1"
    policy = work / f"policy-{port}.yaml"
    policy.write_text(
        gateway_policy(target, workers, work / f"state-{port}", log_dir / f"{slug}.jsonl")
    )
    cmd = [
        sys.executable,
        "-m",
        "gateway",
        "serve",
        "--policy",
        str(policy),
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    wait_http(f"http://127.0.0.1:{port}/readyz", proc)
    return proc, f"http://127.0.0.1:{port}/v1"


def gateway_policy(target: Target, workers: list[str], state_dir: Path, request_log: Path) -> str:
    """The gateway's policy for `target` in front of `workers` (checked by a unit test:
    tests/unit/test_bench_policies.py)."""
    replicas = ", ".join(f'{{url: "{w}"}}' for w in workers)
    weights = f", weights: {target.weights}" if target.weights else ""
    canonical = str(target.canonicalize).lower()
    tenants = ""
    if target.tenants:
        tenants = "tenants:\n" + "".join(
            f"  bench-{i}: {{prefix_cache: {target.tenants}, "
            f"keys: [{{sha256: {hashlib.sha256(key.encode()).hexdigest()}}}]}}\n"
            for i, key in enumerate(TENANT_KEYS)
        )
    return f"""version: 1
state: {{embedded_dir: "{state_dir}"}}
routing: {{strategy: {target.strategy}{weights}}}
telemetry: {{request_log: "{request_log}"}}
canonicalize: {{sort_tools: {canonical}, sort_schema_keys: {canonical}}}
pools: {{tiny: {{served_model: tiny, replicas: [{replicas}]}}}}
models: {{tiny: {{pool: tiny}}}}
{tenants}"""


async def run_workload(
    base: str, convs: list[list[dict[str, Any]]], shuffle: bool, keys: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Every conversation turn by turn, 4 at a time; with `keys`, conversation i is sent
    with key i mod len(keys) (a tenant each)."""
    totals: dict[str, Any] = {"requests": 0, "prompt_tokens": 0, "cached_tokens": 0, "errors": 0}
    rng = random.Random(1234)
    queue: asyncio.Queue[tuple[int, list[dict[str, Any]]]] = asyncio.Queue()
    for index, conv in enumerate(convs):
        queue.put_nowait((index, conv))

    async def agent(client: httpx.AsyncClient, session: int) -> None:
        while not queue.empty():
            index, conv = queue.get_nowait()
            headers = {"Authorization": f"Bearer {keys[index % len(keys)]}"} if keys else {}
            for turn in conv:
                tools = list(turn["tools"])
                if shuffle:
                    rng.shuffle(tools)
                body = {"model": "tiny", "messages": turn["messages"], "tools": tools,
                        "tool_choice": "none", "max_tokens": 1, "temperature": 0}  # fmt: skip
                response = await client.post(f"{base}/chat/completions", json=body, headers=headers)
                if response.status_code != 200:
                    totals["errors"] += 1
                    continue
                usage = response.json()["usage"]
                totals["requests"] += 1
                totals["prompt_tokens"] += usage["prompt_tokens"]
                totals["cached_tokens"] += (usage.get("prompt_tokens_details") or {}).get(
                    "cached_tokens"
                ) or 0

    async with httpx.AsyncClient(timeout=600) as client:
        await asyncio.gather(*(agent(client, i) for i in range(CONCURRENCY)))
    totals["uncached_tokens"] = totals["prompt_tokens"] - totals["cached_tokens"]
    totals["cached_share"] = round(totals["cached_tokens"] / max(1, totals["prompt_tokens"]), 4)
    return totals


def served(workers: list[str]) -> list[int]:
    """Requests each engine has finished, from its own /metrics."""
    counts = []
    for url in workers:
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        total = sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("vllm:request_success_total")
        )
        counts.append(int(total))
    return counts


def reset_caches(workers: list[str]) -> None:
    for url in workers:
        urllib.request.urlopen(
            urllib.request.Request(f"{url}/reset_prefix_cache", method="POST"), timeout=30
        ).read()


@dataclass
class Engines:
    paths: Paths
    urls: list[str]


def start_engines(work: Path) -> Iterator[Engines]:
    paths = Paths.under(work / "engines")
    profile = load_profile("cpu-tiny")
    os.environ["VLLM_SERVER_DEV_MODE"] = "1"  # enables POST /reset_prefix_cache
    records = up(
        [Launch(profile, 2, resolve_model(profile, None, paths))], paths=paths, timeout_s=900
    )
    try:
        yield Engines(paths, [r.url for r in records])
    finally:
        down(paths)


def summarise(results: dict[str, Any]) -> dict[str, float]:
    """The target ratios, for whichever targets ran."""

    def uncached(name: str) -> int | None:
        return results[name]["uncached_tokens"] if name in results else None

    ours = uncached("gateway cache-aware")
    summary: dict[str, float] = {}
    for key, other in (
        ("uncached_vs_round_robin", "gateway round-robin"),
        ("uncached_vs_vllm_router", "vllm-router cache_aware"),
        ("uncached_vs_one_replica_bound", "one replica (lower bound)"),
    ):
        theirs = uncached(other)
        if ours is not None and theirs:
            summary[key] = round(ours / theirs, 3)
    shared, isolated = (results.get(t.name) for t in TENANTS)
    if shared and isolated:
        summary["isolated_over_shared_uncached"] = round(
            isolated["uncached_tokens"] / max(1, shared["uncached_tokens"]), 3
        )
        drop = shared["cached_share"] - isolated["cached_share"]
        summary["isolation_cached_share_drop_points"] = round(100 * drop, 2)
    shuffled = results.get("gateway, tools shuffled")
    if ours is not None and shuffled:
        drop = results["gateway cache-aware"]["cached_share"] - shuffled["cached_share"]
        summary["shuffled_cached_share_drop_points"] = round(100 * drop, 2)
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--conversations", type=int, default=24)
    parser.add_argument("--max-context-chars", type=int, default=30_000)
    parser.add_argument("--out", default=str(ROOT / ".run" / "bench" / "tau-routing.json"))
    parser.add_argument(
        "--with-uncanonicalized", action="store_true", help="also shuffle without canonicalization"
    )
    parser.add_argument(
        "--with-tenants",
        action="store_true",
        help="also two tenants sharing a system prompt, their caches shared or isolated",
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        help="a target's name to run, repeatable (default: all; names may hold commas)",
    )
    args = parser.parse_args()
    targets = [*TARGETS, UNCANONICALISED] if args.with_uncanonicalized else TARGETS
    if args.with_tenants:
        targets = [*targets, *TENANTS]
    if args.only:
        unknown = set(args.only) - {t.name for t in targets}
        if unknown:
            parser.error(f"unknown targets {sorted(unknown)}; known: {[t.name for t in targets]}")
        targets = [t for t in targets if t.name in args.only]
    convs = conversations(args.conversations, args.max_context_chars)
    print(
        f"bench: {len(convs)} tau-bench conversations, {sum(map(len, convs))} turns, {CONCURRENCY} at a time",
        flush=True,
    )
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="agw-bench-") as tmp:
        work = Path(tmp)
        for engines in start_engines(work):
            for target in targets:
                reset_caches(engines.urls)
                before = served(engines.urls)
                proc, base = start_target(target, engines.urls[: target.replicas], work)
                try:
                    began = time.monotonic()
                    keys = TENANT_KEYS if target.tenants else ()
                    figures = asyncio.run(run_workload(base, convs, target.shuffle_tools, keys))
                    figures["seconds"] = round(time.monotonic() - began, 1)
                finally:
                    proc.terminate()
                    proc.wait(timeout=30)
                per_replica = [a - b for a, b in zip(served(engines.urls), before, strict=True)]
                figures["requests_per_replica"] = per_replica
                figures["busiest_replica_share"] = round(
                    max(per_replica) / max(1, sum(per_replica)), 3
                )
                results[target.name] = figures
                print(f"bench: {target.name:<46} uncached {figures['uncached_tokens']:>9,}  "
                      f"cached share {figures['cached_share']:.3f}  per replica {per_replica}  "
                      f"({figures['seconds']}s)", flush=True)  # fmt: skip
    summary = summarise(results)
    report = {"conversations": len(convs), "turns": sum(map(len, convs)), "concurrency": CONCURRENCY,
              "replicas": 2, "profile": "cpu-tiny", "targets": results, "summary": summary}  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    print(f"bench: wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
