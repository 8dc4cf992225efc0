"""The overhead page's tables, from a results file of `tests.bench.overhead.run`.

    .venv/bin/python -m tests.bench.overhead.summary [tests/bench/results/overhead.json]

Prints the Markdown that docs/benchmarks/overhead.md shows under "Latest run": latency
added over direct, requests/s, CPU per request, and the hot-path targets as ratios to the
bare proxy and to `vllm-router` in the same run. The page holds exactly this text for the
committed results file (tests/unit/test_benchmark_pages.py checks it), so the figures on
the page and in the file cannot drift apart.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
RESULTS = ROOT / "tests/bench/results/overhead.json"

# Columns in the order the page shows them; a target the run lacks is left out.
_COLUMNS = (
    ("passthrough", "bare proxy"),
    ("gateway", "**gateway**"),
    ("gateway-2w", "gateway, 2 workers"),
    ("vllm-router", "`vllm-router`"),
    ("portkey", "Portkey"),
    ("litellm", "LiteLLM"),
)
_ROWS = (
    ("tau_whole", "tau-bench, whole"),
    ("tau_stream", "tau-bench, streamed"),
    ("long50k_whole", "50,000-token prompt"),
    ("tau_whole_20ms", "tau-bench, whole, 20 ms engine"),
    ("tau_stream_20ms", "tau-bench, streamed, 20 ms engine"),
)


def _cell(report: dict[str, Any], target: str, workload: str, c: int) -> dict[str, Any] | None:
    entry: dict[str, Any] | None = report["results"].get(target, {}).get(workload, {}).get(str(c))
    return entry


def _table(
    report: dict[str, Any],
    concurrencies: tuple[int, ...],
    value: Callable[[dict[str, Any]], str],
    direct_value: Callable[[dict[str, Any]], str] | None = None,
) -> list[str]:
    """One row per workload and concurrency: direct's figure, then each target's."""
    direct_value = direct_value or value
    columns = [(t, name) for t, name in _COLUMNS if t in report["results"]]
    lines = [
        "| workload | c | direct | " + " | ".join(name for _, name in columns) + " |",
        "|---|---|---|" + "---|" * len(columns),
    ]
    for workload, label in _ROWS:
        for c in concurrencies:
            direct = _cell(report, "direct", workload, c)
            if direct is None:
                continue
            cells = []
            for target, _ in columns:
                entry = _cell(report, target, workload, c)
                cells.append(value(entry) if entry is not None else "-")
            lines.append(f"| {label} | {c} | {direct_value(direct)} | " + " | ".join(cells) + " |")
    return lines


def _ratio(
    report: dict[str, Any], workload: str, c: int, over: str, under: str, key: str
) -> float | None:
    a, b = _cell(report, over, workload, c), _cell(report, under, workload, c)
    if a is None or b is None or not b[key]:
        return None
    return float(a[key]) / float(b[key])


def _marked(value: float | None, bound: float, at_most: bool) -> str:
    """A ratio to two places, bold when it meets its bound; "-" when the run lacks it."""
    if value is None:
        return "-"
    met = value <= bound if at_most else value >= bound
    return f"**{value:.2f}**" if met else f"{value:.2f}"


def _targets(report: dict[str, Any]) -> list[str]:
    """The hot-path targets, each as the ratio the target states, whole / streamed."""

    def pair(check: Callable[[str], float | None], bound: float, at_most: bool) -> str:
        return " / ".join(
            _marked(check(workload), bound, at_most) for workload in ("tau_whole", "tau_stream")
        )

    def added(workload: str) -> float | None:
        return _ratio(report, workload, 1, "gateway", "passthrough", "overhead_p50_ms")

    def rps(over: str, under: str) -> Callable[[str], float | None]:
        return lambda workload: _ratio(report, workload, 32, over, under, "rps")

    long = _ratio(report, "long50k_whole", 1, "gateway", "passthrough", "overhead_p50_ms")
    long_text = _marked(long, 3.0, at_most=True)
    return [
        "| target | whole / streamed (bold: met) |",
        "|---|---|",
        f"| c=1 added latency at most 1.6x the bare proxy's | {pair(added, 1.6, True)} |",
        "| req/s at c=32 at least 0.5x the bare proxy's | "
        f"{pair(rps('gateway', 'passthrough'), 0.5, False)} |",
        f"| 50,000-token prompt, c=1 added latency at most 3x the bare proxy's | {long_text} |",
        "| 2 workers: req/s at c=32 at least 1.3x one worker's | "
        f"{pair(rps('gateway-2w', 'gateway'), 1.3, False)} |",
        "| 2 workers: req/s at c=32 at least `vllm-router`'s | "
        f"{pair(rps('gateway-2w', 'vllm-router'), 1.0, False)} |",
    ]


def summary(report: dict[str, Any]) -> str:
    """The Markdown of the page's latest-run tables."""
    lines = ["Latency added over direct at the median, ms (direct: its own latency):", ""]
    lines += _table(
        report,
        (1, 32, 128),
        lambda e: f"+{e['overhead_p50_ms']:.3f}",
        lambda e: f"{e['latency_p50_ms']:.3f}",
    )
    lines += ["", "Requests/s at concurrency 32:", ""]
    lines += _table(report, (32,), lambda e: f"{e['rps']:,.0f}")
    lines += ["", "CPU ms per request at concurrency 32 (the target's process tree):", ""]
    lines += _table(report, (32,), lambda e: f"{e['cpu_ms_per_request']:.3f}")
    lines += ["", "The hot-path targets, as ratios within this run:", ""]
    lines += _targets(report)
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="?", default=str(RESULTS))
    args = parser.parse_args()
    print(summary(json.loads(Path(args.results).read_text())), end="")


if __name__ == "__main__":
    main()
