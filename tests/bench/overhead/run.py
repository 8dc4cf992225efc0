"""Benchmark: what each gateway adds to a request, side by side, against one mock engine.

    .venv/bin/python -m tests.bench.overhead.run [--quick] [--rounds R] [--requests N]
        [--targets T,...] [--workers 1,2] [--workloads W,...] [--leak-requests 0]
        [--sharing '{enabled: false}']
    (make bench: builds the peers' environments first, then about 11 minutes, and prints
     the overhead page's tables: tests/bench/overhead/summary.py;
     --quick: 1 round of 200 requests a run, about 3 minutes)

Targets, each started fresh every round in front of the same mock engine (`mock_upstream`,
its own process), then stopped:
  direct        the mock itself: the floor every overhead is measured from
  passthrough   a bare aiohttp reverse proxy (`passthrough`): the practical floor for Python
  gateway       this repository's gateway with its defaults (see `targets.gateway_policy`)
  gateway-Nw    the same, `gateway serve --workers N` (one per N>1 in `--workers 1,2`)
  litellm       the LiteLLM proxy (.venv-litellm), its own logging off (`targets.LITELLM_ENV`)
  vllm-router   vllm-router (.venv-vllm-router), cache_aware
  portkey       Portkey's gateway under node (.node-portkey), headless
A peer that is not built or does not start is reported under `targets_missing`.

Workloads (bodies from real tau-bench trajectories, see `bodies`): `tau_whole` and
`tau_stream` (one agent turn, 26 KB with 14 tool schemas) at concurrency 1, 32 and 128,
`long50k_whole` (a 50,000-token prompt, 235 KB) at 1 and 32, all against a 0 ms engine;
`tau_whole_20ms` and `tau_stream_20ms` at 32 against a 20 ms engine (spread over the
stream's 20 chunks) for direct, passthrough, gateway and LiteLLM: behaviour with a
realistic service time. Each run is a `loadgen` process with its own connection pool.

Overhead = the target's latency quantile minus direct's, for the same workload and
concurrency in the same round; every figure is the median over rounds (3 rounds of 600
timed requests a run by default). Inter-chunk added latency = the target's gap between
stream events minus direct's, at the median (0 wherever events arrive together, as they
mostly do from a 0 ms engine) and on average (how much longer the rest of the stream takes
after its first event, per event). Peak RSS is VmHWM of the target's
process tree (the mock's for direct); CPU ms per request is the tree's user + system CPU
over a run divided by the requests it served (warm-up included): the figure for sizing
(cores per 1,000 req/s) and steadier than latency on a shared machine. Then a leak check: a fresh gateway takes 100,000
whole tau requests at concurrency 32, its VmRSS read after every tenth.

The load generator, the mock and the target share the machine's cores (2 here): at
concurrency 32 and 128 the figures are what one small machine does with all three busy,
and a slow target also slows the client. Writes tests/bench/results/overhead.json and
overhead.png; prints a table. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.bench.overhead.bodies import write_bodies
from tests.bench.overhead.plot import render_png
from tests.bench.overhead.targets import (
    ALL_TARGETS,
    LITELLM_VENV,
    PORTKEY_DIR,
    VLLM_ROUTER_VENV,
    Mock,
    Running,
    TargetUnavailable,
    gateway_target,
    gateway_workers,
    running,
    start_mock,
)
from tests.bench.report import write_report
from tests.bench.telemetry_overhead import otlp_sink
from tests.fault.harness import ROOT


@dataclass(frozen=True)
class Workload:
    name: str
    body: str  # tau | long50k
    stream: bool
    concurrencies: tuple[int, ...]
    service_ms: float


WORKLOADS = (
    Workload("tau_whole", "tau", False, (1, 32, 128), 0),
    Workload("tau_stream", "tau", True, (1, 32, 128), 0),
    Workload("long50k_whole", "long50k", False, (1, 32), 0),
    Workload("tau_whole_20ms", "tau", False, (32,), 20),
    Workload("tau_stream_20ms", "tau", True, (32,), 20),
)
SLOW_TARGETS = ("direct", "passthrough", "litellm")  # and every gateway target
SERVICE_TIMES = (0.0, 20.0)
LEAK_SAMPLES = 10

# results[target][workload][concurrency] = one loadgen result per round (None: failed)
Raw = dict[str, dict[str, dict[int, list[dict[str, Any] | None]]]]


class Progress:
    def __init__(self) -> None:
        self.start = time.monotonic()

    def __call__(self, message: str) -> None:
        elapsed = int(time.monotonic() - self.start)
        print(f"[{elapsed // 60:3d}:{elapsed % 60:02d}] {message}", file=sys.stderr, flush=True)


def loadgen(
    target: Running,
    body: Path,
    *,
    concurrency: int,
    requests: int,
    stream: bool,
    warmup: int | None = None,
) -> dict[str, Any]:
    command = [sys.executable, "-m", "tests.bench.overhead.loadgen", "--url", target.chat_url,
               "--body", str(body), "--model", target.model, "--concurrency", str(concurrency),
               "--requests", str(requests),
               "--warmup", str(max(concurrency, 20) if warmup is None else warmup)]  # fmt: skip
    if stream:
        command.append("--stream")
    for name, value in target.headers.items():
        command += ["--header", f"{name}: {value}"]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=1800,
    )
    if done.returncode != 0:
        raise RuntimeError(f"loadgen failed: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def warm_up(target: Running, bodies: dict[str, Path], requests: int) -> None:
    """Every code path once before timing: lazy imports, connection pools, caches, JITs."""
    for body, stream in (("tau", False), ("tau", True), ("long50k", False)):
        loadgen(target, bodies[body], concurrency=8, requests=requests, stream=stream, warmup=0)


def measure_round(
    round_: int,
    args: argparse.Namespace,
    mocks: dict[float, Mock],
    bodies: dict[str, Path],
    work: Path,
    sink: str,
    raw: Raw,
    peak_rss: dict[str, float],
    missing: dict[str, str],
    progress: Progress,
) -> None:
    names = [t for t in args.targets if t not in missing]
    # Rotated each round so that slow drift on the machine does not always hit one target.
    shift = (round_ - 1) % len(names)
    for name in names[shift:] + names[:shift]:
        for service_ms in SERVICE_TIMES:
            workloads = [w for w in args.workloads if w.service_ms == service_ms]
            if not workloads:
                continue
            slow = name in SLOW_TARGETS or gateway_workers(name) is not None
            if service_ms and not slow:
                continue
            try:
                with running(
                    name, mocks[service_ms], work, sink, args.redis_url, args.sharing
                ) as target:
                    warm_up(target, bodies, args.warmup)
                    for workload in workloads:
                        for c in workload.concurrencies:
                            cpu_before = target.process.cpu_s()
                            result = loadgen(
                                target,
                                bodies[workload.body],
                                concurrency=c,
                                requests=args.requests,
                                stream=workload.stream,
                            )
                            # The target's CPU per request (warm-up included): what sizing
                            # needs, and steadier than latency on a shared machine.
                            sent = args.requests + max(c, 20)
                            used_s = target.process.cpu_s() - cpu_before
                            result["cpu_ms_per_request"] = round(used_s * 1e3 / sent, 4)
                            runs = raw.setdefault(name, {}).setdefault(workload.name, {})
                            runs.setdefault(c, []).append(result)
                            where = f"round {round_}/{args.rounds}"
                            progress(f"{where} {line(name, workload.name, c, result)}")
                    peak_rss[name] = max(peak_rss.get(name, 0.0), target.process.peak_rss_mb())
            except TargetUnavailable as exc:
                missing[name] = str(exc).splitlines()[0]
                progress(f"round {round_}: {name} left out: {exc}")
                break


def line(name: str, workload: str, c: int, result: dict[str, Any]) -> str:
    lat = result["latency_ms"] or {"p50": float("nan"), "p99": float("nan")}
    errors = f"  {result['errors']} errors: {result['error_sample']}" if result["errors"] else ""
    return (
        f"{name:<12}{workload:<16}c={c:<4}p50 {lat['p50']:9.3f} ms  p99 {lat['p99']:9.3f} ms"
        f"  {result['rps']:8.1f} rps{errors}"
    )


def leak_check(
    args: argparse.Namespace,
    mock: Mock,
    body: Path,
    work: Path,
    sink: str,
    progress: Progress,
) -> dict[str, Any]:
    """A fresh gateway, `leak_requests` whole tau requests at concurrency 32, VmRSS sampled
    after every tenth of them."""
    chunk = args.leak_requests // LEAK_SAMPLES
    samples: list[float] = []
    errors = 0
    start = time.monotonic()
    with running("gateway", mock, work, sink, args.redis_url, args.sharing) as target:
        for i in range(LEAK_SAMPLES):
            result = loadgen(
                target, body, concurrency=32, requests=chunk, stream=False, warmup=0 if i else None
            )
            errors += result["errors"]
            samples.append(target.process.rss_mb())
            progress(
                f"leak check: {(i + 1) * chunk:>7} requests, gateway RSS {samples[-1]:.1f} MB, "
                f"{result['rps']:.0f} rps"
            )
    return {
        "requests": chunk * LEAK_SAMPLES,
        "concurrency": 32,
        "workload": "tau_whole",
        "rss_samples_mb": samples,
        "rss_growth_mb": round(samples[-1] - samples[0], 1),
        "errors": errors,
        "seconds": round(time.monotonic() - start, 1),
    }


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 4) if values else None


def summarise(raw: Raw) -> dict[str, Any]:
    """Per target, workload and concurrency: medians over rounds, overheads paired with
    direct's run of the same round."""
    direct = raw.get("direct", {})
    out: dict[str, Any] = {}
    for name, workloads in raw.items():
        for workload, levels in workloads.items():
            for c, rounds in levels.items():
                base_rounds = direct.get(workload, {}).get(c, [])
                oh50: list[float] = []
                oh99: list[float] = []
                lat50: list[float] = []
                lat99: list[float] = []
                rps: list[float] = []
                ttfc: list[float] = []
                ttfc_oh: list[float] = []
                gap: list[float] = []
                gap_mean: list[float] = []
                errors: list[int] = []
                cpu: list[float] = []
                for i, result in enumerate(rounds):
                    if result is None or result["latency_ms"] is None:
                        continue
                    errors.append(result["errors"])
                    if "cpu_ms_per_request" in result:
                        cpu.append(result["cpu_ms_per_request"])
                    lat = result["latency_ms"]
                    lat50.append(lat["p50"])
                    lat99.append(lat["p99"])
                    rps.append(result["rps"])
                    if result["ttfc_ms"]:
                        ttfc.append(result["ttfc_ms"]["p50"])
                    base = base_rounds[i] if i < len(base_rounds) else None
                    if base is None or base["latency_ms"] is None:
                        continue
                    oh50.append(lat["p50"] - base["latency_ms"]["p50"])
                    oh99.append(lat["p99"] - base["latency_ms"]["p99"])
                    if result["ttfc_ms"] and base["ttfc_ms"]:
                        ttfc_oh.append(result["ttfc_ms"]["p50"] - base["ttfc_ms"]["p50"])
                    if result["gap_us"] and base["gap_us"]:
                        gap.append(result["gap_us"]["p50"] - base["gap_us"]["p50"])
                        gap_mean.append(result["gap_us"]["mean"] - base["gap_us"]["mean"])
                entry: dict[str, Any] = {
                    "overhead_p50_ms": _median(oh50),
                    "overhead_p99_ms": _median(oh99),
                    "latency_p50_ms": _median(lat50),
                    "latency_p99_ms": _median(lat99),
                    "rps": _median(rps),
                    "ttfc_p50_ms": _median(ttfc),
                    "cpu_ms_per_request": _median(cpu),
                    "errors": sum(errors),
                }
                if ttfc:
                    entry["ttfc_overhead_p50_ms"] = _median(ttfc_oh)
                    entry["interchunk_added_p50_us"] = _median(gap)
                    entry["interchunk_added_mean_us"] = _median(gap_mean)
                out.setdefault(name, {}).setdefault(workload, {})[str(c)] = entry
    return out


def ratios(results: dict[str, Any]) -> dict[str, float | None]:
    """Peer versus gateway on the tau body: overhead at concurrency 1 (how many times the
    gateway's a peer adds) and requests/s at 32 (how many times a peer's the gateway
    serves); `_stream` for the streamed body."""

    def get(target: str, workload: str, c: str, key: str) -> float | None:
        value = results.get(target, {}).get(workload, {}).get(c, {}).get(key)
        return float(value) if value is not None else None

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 2) if a is not None and b is not None and b > 0 else None

    out: dict[str, float | None] = {}
    for workload, suffix in (("tau_whole", ""), ("tau_stream", "_stream")):
        gw_oh = get("gateway", workload, "1", "overhead_p50_ms")
        gw_rps = get("gateway", workload, "32", "rps")
        for peer in ("litellm", "passthrough", "vllm-router", "portkey"):
            if peer not in results:
                continue
            key = peer.replace("-", "_")
            out[f"{key}_over_gateway_overhead_p50_c1{suffix}"] = ratio(
                get(peer, workload, "1", "overhead_p50_ms"), gw_oh
            )
            out[f"gateway_over_{key}_rps_c32{suffix}"] = ratio(
                gw_rps, get(peer, workload, "32", "rps")
            )
        # `--workers`: N workers against one, and against the floor and the peers.
        for name in results:
            workers = gateway_workers(name)
            if workers is None or workers == 1:
                continue
            rps = get(name, workload, "32", "rps")
            key = name.replace("-", "_")
            out[f"{key}_over_gateway_rps_c32{suffix}"] = ratio(rps, gw_rps)
            for peer in ("passthrough", "vllm-router"):
                if peer in results:
                    peer_key = peer.replace("-", "_")
                    peer_rps = get(peer, workload, "32", "rps")
                    out[f"{key}_over_{peer_key}_rps_c32{suffix}"] = ratio(rps, peer_rps)
    return out


def machine() -> str:
    cpu = "unknown CPU"
    for text in Path("/proc/cpuinfo").read_text().splitlines():
        if text.startswith("model name"):
            cpu = text.split(":", 1)[1].strip()
            break
    memory_kb = int(Path("/proc/meminfo").read_text().split()[1])
    return (
        f"{os.cpu_count()} cores ({cpu}), {memory_kb / 1024**2:.0f} GiB, no GPU, "
        f"Python {platform.python_version()}, {platform.system()} {platform.release()}"
    )


def peer_versions() -> dict[str, str]:
    versions: dict[str, str] = {}
    envs = (("litellm", LITELLM_VENV, "litellm"), ("vllm-router", VLLM_ROUTER_VENV, "vllm_router"))
    for name, venv, dist in envs:
        found = sorted(venv.glob(f"lib/python*/site-packages/{dist}-*.dist-info"))
        if found:
            versions[name] = found[0].name.removeprefix(f"{dist}-").removesuffix(".dist-info")
    package = PORTKEY_DIR / "node_modules/@portkey-ai/gateway/package.json"
    if package.exists():
        versions["portkey"] = json.loads(package.read_text())["version"]
        try:
            node = subprocess.run(["node", "--version"], capture_output=True, text=True, check=True)
            versions["node"] = node.stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            pass
    return versions


def _cell(value: float | None, spec: str, width: int) -> str:
    return f"{value:{spec}}".rjust(width) if value is not None else "-".rjust(width)


def print_table(report: dict[str, Any]) -> None:
    results = report["results"]
    print(f"\nOverhead benchmark, {report['date']}: {report['machine']}")
    print("ms unless named; +: added over direct; gap: microseconds between stream events")
    print(
        f"medians over {report['rounds']} round(s) of {report['requests_per_run']} requests; "
        "overhead = target - direct, same round; the load generator shares the cores"
    )
    header = (
        f"{'workload':<16}{'c':>4}  {'target':<12}{'p50 ms':>10}{'p99 ms':>10}{'+p50 ms':>10}"
        f"{'+p99 ms':>10}{'req/s':>8}{'TTFC p50':>10}{'+gap p50':>10}{'+gap mean':>10}"
        f"{'CPU ms':>8}"
    )
    print(header)
    print("-" * len(header))
    for workload in WORKLOADS:
        for c in workload.concurrencies:
            for target in report["targets"]:
                entry = results.get(target, {}).get(workload.name, {}).get(str(c))
                if not entry:
                    continue

                flag = f"  ({entry['errors']} errors)" if entry["errors"] else ""
                cells = (
                    _cell(entry["latency_p50_ms"], ".3f", 10),
                    _cell(entry["latency_p99_ms"], ".3f", 10),
                    _cell(entry["overhead_p50_ms"], "+.3f", 10),
                    _cell(entry["overhead_p99_ms"], "+.3f", 10),
                    _cell(entry["rps"], ".0f", 8),
                    _cell(entry["ttfc_p50_ms"], ".3f", 10),
                    _cell(entry.get("interchunk_added_p50_us"), "+.1f", 10),
                    _cell(entry.get("interchunk_added_mean_us"), "+.1f", 10),
                    _cell(entry.get("cpu_ms_per_request"), ".3f", 8),
                )
                print(f"{workload.name:<16}{c:>4}  {target:<12}{''.join(cells)}{flag}")
        print()
    print(
        "peak RSS (MB, VmHWM of the process tree): "
        + ", ".join(f"{t} {v:.0f}" for t, v in report["peak_rss_mb"].items())
    )
    leak = report.get("gateway")
    if leak:
        print(
            f"gateway leak check: {leak['requests']} requests at c=32, RSS "
            f"{leak['rss_samples_mb'][0]:.1f} -> {leak['rss_samples_mb'][-1]:.1f} MB "
            f"(growth {leak['rss_growth_mb']:+.1f} MB after the first tenth), "
            f"{leak['errors']} errors"
        )
    print("ratios: " + ", ".join(f"{k} {v}" for k, v in report["ratios"].items()))
    for name, reason in report["targets_missing"].items():
        print(f"missing: {name}: {reason}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="1 round of 200 requests per run, a 10,000-request leak check",
    )
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--requests", type=int, help="timed requests per run (default 600)")
    parser.add_argument("--leak-requests", type=int, help="default 100,000 (quick: 10,000)")
    parser.add_argument(
        "--targets",
        default=",".join(ALL_TARGETS),
        help="comma-separated subset (direct is always run)",
    )
    parser.add_argument(
        "--workers",
        default="1",
        help="comma-separated `gateway serve --workers` counts, each its own target "
        "(e.g. 1,2: gateway and gateway-2w)",
    )
    parser.add_argument(
        "--workloads",
        default=",".join(w.name for w in WORKLOADS),
        help="comma-separated subset of the workloads",
    )
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument(
        "--sharing",
        help="the gateways' routing.sharing, a YAML flow mapping (e.g. '{enabled: false}', "
        "'{flush_ms: 30}'); default: the policy's",
    )
    parser.add_argument("--out", default=str(ROOT / "tests/bench/results/overhead.json"))
    args = parser.parse_args()
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.requests = args.requests or (200 if args.quick else 600)
    if args.leak_requests is None:  # 0: no leak check
        args.leak_requests = 10_000 if args.quick else 100_000
    args.warmup = 50 if args.quick else 100
    chosen = [t.strip() for t in args.targets.split(",") if t.strip()]
    gateways = [gateway_target(int(n)) for n in args.workers.split(",") if n.strip()]
    args.targets = []
    for t in ALL_TARGETS:
        if t == "gateway" and "gateway" in chosen:
            args.targets += gateways
        elif t in chosen or t == "direct":
            args.targets.append(t)
    workloads = {w.strip() for w in args.workloads.split(",")}
    args.workloads = [w for w in WORKLOADS if w.name in workloads]

    progress = Progress()
    work = Path(tempfile.mkdtemp(prefix="overhead-bench-"))
    progress(f"logs and bodies in {work}")
    bodies = write_bodies(work)
    raw: Raw = {}
    peak_rss: dict[str, float] = {}
    missing: dict[str, str] = {}
    leak: dict[str, Any] | None = None
    with ExitStack() as stack:
        sink = stack.enter_context(otlp_sink())
        mocks: dict[float, Mock] = {}
        for service_ms in SERVICE_TIMES:
            mocks[service_ms] = start_mock(service_ms, work)
            stack.callback(mocks[service_ms].process.stop)
        for round_ in range(1, args.rounds + 1):
            measure_round(round_, args, mocks, bodies, work, sink, raw, peak_rss, missing, progress)
        if args.leak_requests and "gateway" in args.targets and "gateway" not in missing:
            leak = leak_check(args, mocks[0.0], bodies["tau"], work, sink, progress)
    (work / "raw.json").write_text(json.dumps(raw))  # every run, for a second look
    results = summarise(raw)
    report: dict[str, Any] = {
        "benchmark": "overhead",
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine(),
        "note": "load generator, mock engine and target share the machine's cores",
        "rounds": args.rounds,
        "targets": args.targets,
        "gateway_sharing": args.sharing,
        "requests_per_run": args.requests,
        "unit": "ms unless named otherwise; client-side; medians over rounds",
        "peer_versions": peer_versions(),
        "results": results,
        "peak_rss_mb": peak_rss,
        "gateway": leak,
        "ratios": ratios(results),
        "targets_missing": missing,
        "seconds": round(time.monotonic() - progress.start, 1),
    }
    out = Path(args.out)
    png = out.with_suffix(".png")
    report["plot"] = render_png(report, png) or str(
        png.relative_to(ROOT) if png.is_relative_to(ROOT) else png
    )
    print_table(report)
    write_report(report, out)
    print(f"plot: {report['plot']}")


if __name__ == "__main__":
    main()
