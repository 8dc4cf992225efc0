"""Benchmark: tau-bench agent conversations replayed turn by turn through routers in
front of the same 2 real `cpu-tiny` vLLM replicas, in one run.

    .venv/bin/python -m tests.bench.tau_routing [--conversations 24] [--out FILE]   (make bench-routing)
    .venv/bin/python -m tests.bench.tau_routing --small-cache --with-scale-out --only ...  (issue 24)

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

Scale-out (`--with-scale-out`, issue 24): two `gateway serve` processes sharing the
machine's Redis (db 12, the bench's own, emptied of `agw:*` keys before each target; the
pool has a name of its own per target, so no placement stream of another run mixes in),
with routing sharing on or off. The balancer is the bench client itself: each request goes
to one of the gateways drawn at random (seeded), as an L4 balancer that knew nothing of
prompts would send new connections. And one gateway with the engines' KV events followed
or not (pool `kv_events`), both engines' prefix caches cleared once half the turns are done
(what an engine restart does to its cache): the events tell routing the cache is gone.
`--small-cache` gives each engine 1,024 KV blocks of 32 tokens (`--num-gpu-blocks-override`:
vLLM's CPU backend sizes its cache in whole GiB, 2M tokens of this model, which no run
fills) and each gateway an index of that size, so that engines evict during the run; the
gateways following KV events count the engines' BlockRemoved events as the proof.
`--cache-blocks N` sets another size (513, the least vLLM accepts for this profile's
16,384-token context: 512 blocks of 32 tokens plus the null block it holds back, evicts
conversations between their turns); the pair "gateway, KV
events" / "gateway, no KV events" is the prediction error with and without events on
evictions alone. `--think-s` waits between an answer and the conversation's next turn
(the tool runs, the user answers; 0 by default: the next turn goes at once), and
`--skip-conversations N` takes the conversations after the first N (a part of the file
kept out of design choices).
Prediction error per gateway target, from its request logs: sum |expected_cached_tokens -
cached_tokens| / sum prompt_tokens over the requests that have both.

Prints a table and writes JSON. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from engine.cli import resolve_model
from engine.lifeline import Lifeline
from engine.profiles import load_profile
from engine.supervisor import ROOT, Launch, Paths, down, free_port, up

DATA = ROOT.parent / "shared" / "data" / "agent-trajectories" / "tau_bench_airline_dev.jsonl"
ROUTER_VERSION = "0.1.17"
CONCURRENCY = 4
# Scale-out targets: the machine's Redis, a db index no test or other tool uses.
BENCH_REDIS = "redis://127.0.0.1:6379/12"
BALANCER_SEED = 24
# --small-cache: KV blocks per engine (32-token blocks: 32,768 tokens, 16 MiB of this model;
# at least max_model_len / block size, or vLLM refuses to start). The gateway's index is
# sized like it (routing.index_blocks_per_replica: "size it like the engine's cache"), in
# its own blocks of 512 prompt bytes, about 128 tokens.
SMALL_CACHE_BLOCKS = 1024


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
    # Gateway processes behind the client's random balancer, sharing BENCH_REDIS when > 1.
    gateways: int = 1
    sharing: bool = True  # routing.sharing.enabled, for gateways > 1
    kv_events: bool = False  # the pool follows the engines' KV events
    clear_midway: bool = False  # both engines' prefix caches reset after half the turns


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
# Issue 24's acceptance targets, beside "gateway cache-aware" and "vllm-router cache_aware";
# run them with --small-cache. Only on request.
SCALE_OUT = [
    Target("2 gateways, shared state", "gateway", gateways=2, kv_events=True),
    Target("2 gateways, no sharing", "gateway", gateways=2, sharing=False, kv_events=True),
    Target("gateway, KV events, cleared midway", "gateway", kv_events=True, clear_midway=True),
    Target("gateway, no KV events, cleared midway", "gateway", clear_midway=True),
    # Evictions alone, no reset: with --cache-blocks small enough that the engines evict
    # conversations between their turns, what the KV events save the prediction.
    Target("gateway, KV events", "gateway", kv_events=True),
    Target("gateway, no KV events", "gateway"),
]
UNCANONICALISED = Target(
    "gateway, tools shuffled, no canonicalization",
    "gateway",
    canonicalize=False,
    shuffle_tools=True,
)


def conversations(limit: int, max_chars: int, skip: int = 0) -> list[list[dict[str, Any]]]:
    """Per conversation, the request bodies of its assistant turns, in order: `limit`
    conversations after the first `skip`."""
    out: list[list[dict[str, Any]]] = []
    with DATA.open() as lines:
        for number, line in enumerate(lines):
            if len(out) == limit:
                break
            if number < skip:
                continue
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


REQUEST_LOGS = ROOT / ".run" / "bench" / "tau-request-logs"  # what each gateway decided


def target_slug(target: Target) -> str:
    return target.name.replace(" ", "_").replace(",", "")


def request_logs(target: Target) -> list[Path]:
    """Where each of the target's gateways writes its request log."""
    slug = target_slug(target)
    if target.gateways == 1:
        return [REQUEST_LOGS / f"{slug}.jsonl"]
    return [REQUEST_LOGS / f"{slug}-{i}.jsonl" for i in range(target.gateways)]


def start_target(
    target: Target, workers: list[str], work: Path, cache_blocks: int | None = None
) -> tuple[list[subprocess.Popen[bytes]], list[str]]:
    """The target's processes (one but for K gateways) and the base URL of each."""
    slug = target_slug(target)
    REQUEST_LOGS.mkdir(parents=True, exist_ok=True)
    if target.kind == "vllm-router":
        port = free_port()
        log = (work / f"{slug}.log").open("wb")
        cmd = [str(router_binary()), "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *workers,
               "--policy", "cache_aware", "--log-level", "warning"]  # fmt: skip
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        wait_http(f"http://127.0.0.1:{port}/health", proc)
        return [proc], [f"http://127.0.0.1:{port}/v1"]
    redis_url, pool = "", "tiny"
    if target.gateways > 1:
        empty_bench_redis()
        redis_url, pool = BENCH_REDIS, f"tiny-{os.urandom(4).hex()}"
    # The index sized like the engine's cache, in its own blocks of about 128 tokens.
    index_blocks = cache_blocks * 32 // 128 if cache_blocks else None
    procs: list[subprocess.Popen[bytes]] = []
    bases: list[str] = []
    try:
        for request_log in request_logs(target):
            request_log.unlink(missing_ok=True)
            port = free_port()
            policy = work / f"policy-{port}.yaml"
            policy.write_text(
                gateway_policy(target, workers, work / f"state-{port}", request_log,
                               redis_url=redis_url, pool=pool, index_blocks=index_blocks)
            )  # fmt: skip
            procs.append(start_gateway(policy, port, (work / f"{request_log.stem}.log")))
            bases.append(f"http://127.0.0.1:{port}/v1")
        for proc, base in zip(procs, bases, strict=True):
            wait_http(f"{base.removesuffix('/v1')}/readyz", proc)
    except BaseException:
        stop_all(procs)
        raise
    return procs, bases


def start_gateway(policy: Path, port: int, log_path: Path) -> subprocess.Popen[bytes]:
    log = log_path.open("wb")
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
    return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait(timeout=30)


def empty_bench_redis() -> None:
    """The gateway keys of the bench's own Redis db, from an earlier target or run."""
    import redis  # the gateway's own dependency; only the scale-out targets need it

    client = redis.Redis.from_url(BENCH_REDIS)
    try:
        keys = list(client.scan_iter(match="agw:*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def gateway_policy(
    target: Target,
    workers: list[str],
    state_dir: Path,
    request_log: Path,
    *,
    redis_url: str = "",
    pool: str = "tiny",
    index_blocks: int | None = None,
) -> str:
    """The gateway's policy for `target` in front of `workers` (checked by a unit test:
    tests/unit/test_bench_policies.py). `redis_url`: the shared state store of several
    gateways (else each has its own embedded one); `index_blocks`: the routing index's
    size per replica (else the default)."""
    replicas = ", ".join(f'{{url: "{w}"}}' for w in workers)
    routing = f", weights: {target.weights}" if target.weights else ""
    if index_blocks is not None:
        routing += f", index_blocks_per_replica: {index_blocks}"
    if redis_url and not target.sharing:
        routing += ", sharing: {enabled: false}"
    state = f'redis_url: "{redis_url}"' if redis_url else f'embedded_dir: "{state_dir}"'
    kv_events = ", kv_events: true" if target.kv_events else ""
    canonical = str(target.canonicalize).lower()
    tenants = ""
    if target.tenants:
        tenants = "tenants:\n" + "".join(
            f"  bench-{i}: {{prefix_cache: {target.tenants}, "
            f"keys: [{{sha256: {hashlib.sha256(key.encode()).hexdigest()}}}]}}\n"
            for i, key in enumerate(TENANT_KEYS)
        )
    return f"""version: 1
state: {{{state}}}
routing: {{strategy: {target.strategy}{routing}}}
telemetry: {{request_log: "{request_log}"}}
canonicalize: {{sort_tools: {canonical}, sort_schema_keys: {canonical}}}
pools: {{{pool}: {{served_model: tiny, replicas: [{replicas}]{kv_events}}}}}
models: {{tiny: {{pool: {pool}}}}}
{tenants}"""


async def run_workload(
    bases: list[str],
    convs: list[list[dict[str, Any]]],
    shuffle: bool,
    keys: tuple[str, ...] = (),
    midway: Callable[[], Coroutine[Any, Any, None]] | None = None,
    think_s: float = 0.0,
    label: str = "",
) -> dict[str, Any]:
    """Every conversation turn by turn, 4 at a time; with `keys`, conversation i is sent
    with key i mod len(keys) (a tenant each). Each request goes to one of `bases` drawn at
    random (seeded: the balancer); `midway` runs once half the turns are answered. A line
    of progress at every tenth of the turns, `label` naming the target."""
    totals: dict[str, Any] = {"requests": 0, "prompt_tokens": 0, "cached_tokens": 0, "errors": 0}
    rng = random.Random(1234)
    balancer = random.Random(BALANCER_SEED)
    turns = sum(map(len, convs))
    halfway = turns // 2
    began = time.monotonic()
    tenth = max(1, turns // 10)
    midway_task: list[asyncio.Task[None]] = []
    queue: asyncio.Queue[tuple[int, list[dict[str, Any]]]] = asyncio.Queue()
    for index, conv in enumerate(convs):
        queue.put_nowait((index, conv))

    async def agent(client: httpx.AsyncClient, session: int) -> None:
        while not queue.empty():
            index, conv = queue.get_nowait()
            headers = {"Authorization": f"Bearer {keys[index % len(keys)]}"} if keys else {}
            for number, turn in enumerate(conv):
                if number and think_s:
                    await asyncio.sleep(think_s)  # the tool runs, the user answers
                tools = list(turn["tools"])
                if shuffle:
                    rng.shuffle(tools)
                body = {"model": "tiny", "messages": turn["messages"], "tools": tools,
                        "tool_choice": "none", "max_tokens": 1, "temperature": 0}  # fmt: skip
                base = bases[balancer.randrange(len(bases))] if len(bases) > 1 else bases[0]
                response = await client.post(f"{base}/chat/completions", json=body, headers=headers)
                done = totals["requests"] + totals["errors"] + 1
                if done % tenth == 0:
                    print(f"bench: {label:<46} {done:>5}/{turns} turns "
                          f"({time.monotonic() - began:.0f}s)", flush=True)  # fmt: skip
                if midway is not None and not midway_task and totals["requests"] >= halfway:
                    midway_task.append(asyncio.create_task(midway()))
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
        for task in midway_task:
            await task
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


async def clear_while_serving(workers: list[str], cleared: list[float]) -> None:
    """Each engine's prefix cache reset while the agents keep sending. vLLM refuses while a
    request holds blocks (`success: false`), so each is asked again until it is idle for a
    moment; `cleared` gets the time of each reset."""
    async with httpx.AsyncClient(timeout=30) as client:
        for url in workers:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                answer = await client.post(f"{url}/reset_prefix_cache")
                if answer.json().get("success"):
                    cleared.append(time.monotonic())
                    break
                await asyncio.sleep(0.02)
            else:
                raise RuntimeError(f"{url}: the prefix cache could not be reset while serving")


def prediction_error(logs: list[Path]) -> dict[str, Any]:
    """sum |expected - reported cached tokens| / sum prompt tokens over the requests of
    these request logs that have both (issue 24's prediction error)."""
    error = prompt = counted = 0
    for log in logs:
        if not log.exists():
            continue
        for line in log.read_text().splitlines():
            entry = json.loads(line)
            expected, reported = entry.get("expected_cached_tokens"), entry.get("cached_tokens")
            if expected is None or reported is None or not entry.get("prompt_tokens"):
                continue
            error += abs(expected - reported)
            prompt += entry["prompt_tokens"]
            counted += 1
    return {
        "prediction_error": round(error / prompt, 4) if prompt else None,
        "prediction_abs_error_tokens": error,
        "prediction_requests": counted,
    }


def kv_event_counts(base: str) -> dict[str, dict[str, float]]:
    """From a gateway's /metrics: KV events received per type and caches forgotten per
    reason, summed over replicas (the gateway follows every replica's events)."""
    with urllib.request.urlopen(f"{base.removesuffix('/v1')}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    counts: dict[str, dict[str, float]] = {"events": {}, "forgotten": {}}
    for line in text.splitlines():
        for metric, kind, label in (
            ("gateway_engine_kv_events_total{", "events", "type"),
            ("gateway_engine_kv_forgotten_total{", "forgotten", "reason"),
        ):
            if line.startswith(metric):
                labels, value = line.rsplit(" ", 1)
                name = labels.split(f'{label}="', 1)[1].split('"', 1)[0]
                counts[kind][name] = counts[kind].get(name, 0) + float(value)
    return counts


@dataclass
class Engines:
    paths: Paths
    urls: list[str]


def start_engines(work: Path, cache_blocks: int | None = None) -> Iterator[Engines]:
    """Two cpu-tiny replicas; with `cache_blocks`, of that many KV blocks each."""
    paths = Paths.under(work / "engines")
    profile = load_profile("cpu-tiny")
    if cache_blocks:
        override = ("--num-gpu-blocks-override", str(cache_blocks))
        profile = profile.model_copy(update={"extra_args": (*profile.extra_args, *override)})
    os.environ["VLLM_SERVER_DEV_MODE"] = "1"  # enables POST /reset_prefix_cache
    lifeline = Lifeline.start()  # the replicas die with the bench, however it ends
    try:
        records = up(
            [Launch(profile, 2, resolve_model(profile, None, paths))],
            paths=paths, timeout_s=900, lifeline=lifeline,
        )  # fmt: skip
        try:
            yield Engines(paths, [r.url for r in records])
        finally:
            down(paths, lifeline=lifeline)
    finally:
        lifeline.close()


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
    for key, other in (
        ("two_gateways_shared_over_one", "2 gateways, shared state"),
        ("two_gateways_no_sharing_over_one", "2 gateways, no sharing"),
    ):
        theirs = uncached(other)
        if ours and theirs is not None:
            summary[key] = round(theirs / ours, 3)
    shared_state, router = uncached("2 gateways, shared state"), uncached("vllm-router cache_aware")
    if shared_state is not None and router:
        summary["two_gateways_shared_over_vllm_router"] = round(shared_state / router, 3)
    for key, pair in (
        ("prediction_error_with_events_over_without_cleared", SCALE_OUT[2:4]),
        ("prediction_error_with_events_over_without", SCALE_OUT[4:6]),
    ):
        followed, ignored = (results.get(t.name) for t in pair)
        if followed and ignored and ignored.get("prediction_error"):
            summary[key] = round(followed["prediction_error"] / ignored["prediction_error"], 3)
    shuffled = results.get("gateway, tools shuffled")
    if ours is not None and shuffled:
        drop = results["gateway cache-aware"]["cached_share"] - shuffled["cached_share"]
        summary["shuffled_cached_share_drop_points"] = round(100 * drop, 2)
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--conversations", type=int, default=24)
    parser.add_argument(
        "--skip-conversations",
        type=int,
        default=0,
        help="start after this many conversations of the file (a part kept out of design)",
    )
    parser.add_argument(
        "--think-s",
        type=float,
        default=0.0,
        help="seconds between an answer and the conversation's next turn (tools, the user)",
    )
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
    parser.add_argument(
        "--with-scale-out",
        action="store_true",
        help="also 2 gateways sharing routing state or not, and KV events followed or not",
    )
    parser.add_argument(
        "--small-cache",
        action="store_true",
        help=f"engines of {SMALL_CACHE_BLOCKS} KV blocks, so that they evict during the run",
    )
    parser.add_argument(
        "--cache-blocks",
        type=int,
        help="engines of this many KV blocks of 32 tokens (implies --small-cache; at least "
        "513: the profile's max_model_len over the block size, plus vLLM's null block)",
    )
    args = parser.parse_args()
    cache_blocks = args.cache_blocks or (SMALL_CACHE_BLOCKS if args.small_cache else None)
    targets = [*TARGETS, UNCANONICALISED] if args.with_uncanonicalized else TARGETS
    if args.with_tenants:
        targets = [*targets, *TENANTS]
    if args.with_scale_out:
        targets = [*targets, *SCALE_OUT]
    if args.only:
        unknown = set(args.only) - {t.name for t in targets}
        if unknown:
            parser.error(f"unknown targets {sorted(unknown)}; known: {[t.name for t in targets]}")
        targets = [t for t in targets if t.name in args.only]
    convs = conversations(args.conversations, args.max_context_chars, args.skip_conversations)
    print(
        f"bench: {len(convs)} tau-bench conversations, {sum(map(len, convs))} turns, {CONCURRENCY} at a time",
        flush=True,
    )
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="agw-bench-") as tmp:
        work = Path(tmp)
        for engines in start_engines(work, cache_blocks):
            for target in targets:
                reset_caches(engines.urls)
                before = served(engines.urls)
                workers = engines.urls[: target.replicas]
                procs, bases = start_target(target, workers, work, cache_blocks)
                cleared: list[float] = []
                try:
                    began = time.monotonic()
                    keys = TENANT_KEYS if target.tenants else ()
                    midway = (
                        functools.partial(clear_while_serving, workers, cleared)
                        if target.clear_midway
                        else None
                    )
                    figures = asyncio.run(
                        run_workload(
                            bases,
                            convs,
                            target.shuffle_tools,
                            keys,
                            midway,
                            args.think_s,
                            label=target.name,
                        )
                    )
                    figures["seconds"] = round(time.monotonic() - began, 1)
                    if cleared:
                        figures["caches_cleared_at_s"] = [round(t - began, 1) for t in cleared]
                    if target.kv_events:
                        figures["kv_events"] = kv_event_counts(bases[0])
                finally:
                    stop_all(procs)
                if target.kind == "gateway":
                    figures.update(prediction_error(request_logs(target)))
                per_replica = [a - b for a, b in zip(served(engines.urls), before, strict=True)]
                figures["requests_per_replica"] = per_replica
                figures["busiest_replica_share"] = round(
                    max(per_replica) / max(1, sum(per_replica)), 3
                )
                results[target.name] = figures
                error = figures.get("prediction_error")
                print(f"bench: {target.name:<46} uncached {figures['uncached_tokens']:>9,}  "
                      f"cached share {figures['cached_share']:.3f}  per replica {per_replica}  "
                      f"prediction error {'-' if error is None else f'{error:.4f}'}  "
                      f"({figures['seconds']}s)", flush=True)  # fmt: skip
    summary = summarise(results)
    report = {"conversations": len(convs), "turns": sum(map(len, convs)), "concurrency": CONCURRENCY,
              "skipped_conversations": args.skip_conversations, "think_s": args.think_s,
              "replicas": 2, "profile": "cpu-tiny", "targets": results, "summary": summary,
              "engine_kv_blocks": cache_blocks}  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    print(f"bench: wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
