"""The report of `gateway tools-eval`: its targets and which of them were missed, the
printed table (per dataset, then the analyzers), and the JSON written beside it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from gateway.offline.tools_eval.data import REPOSITORY
from gateway.offline.tools_eval.faults import CAUGHT_AS, REPAIRED_BY

DEFAULT_OUT = REPOSITORY / ".run" / "bench" / "tools-eval.json"
P99_BUDGET_US = 200.0
DATASETS = ("tau_bench", "bfcl")


def targets() -> dict[str, Any]:
    """The figures every run should meet, as the report states them."""
    return {
        "fault_rate": 1.0,
        "false_positives": 0,
        "analyzer_rate": 1.0,
        "check_p99_us_under": P99_BUDGET_US,
    }


def write_report(report: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")


def missed_targets(report: dict[str, Any]) -> list[str]:
    missed: list[str] = []
    for name in DATASETS:
        figures = report[name]
        for kind, fault in figures["faults"].items():
            if fault["rate"] is not None and fault["rate"] < 1.0:
                missed.append(f"{name}: {kind} rate {fault['rate']:.4f} < 1.0")
        if figures["clean"]["false_positives"]:
            missed.append(f"{name}: {figures['clean']['false_positives']} false positives > 0")
        if figures["timing"]["p99_us"] >= P99_BUDGET_US:
            missed.append(
                f"{name}: check p99 {figures['timing']['p99_us']} us >= {P99_BUDGET_US:g} us"
            )
    analyzers = report["analyzers"]
    if analyzers["rate"] is not None and analyzers["rate"] < 1.0:
        missed.append(f"analyzers: classified-as-expected rate {analyzers['rate']:.4f} < 1.0")
    return missed


def table(report: dict[str, Any]) -> str:
    lines = [f"tools-eval: seed {report['seed']}; data {report['data']}"]
    for name in DATASETS:
        lines += ["", *_dataset_lines(name, report[name])]
    lines += ["", *_analyzer_lines(report["analyzers"]), ""]
    missed = report["missed"]
    lines.append("targets: all met" if not missed else "targets missed: " + "; ".join(missed))
    return "\n".join(lines)


def _dataset_lines(name: str, r: dict[str, Any]) -> list[str]:
    clean, timing = r["clean"], r["timing"]
    lines = [
        f"{name} ({r['role']})",
        f"  {clean['calls']} clean calls, {r['tools']} tools in {r['tool_sets']} tool set(s)",
        f"  {'fault':<18} {'seeded':>7} {'caught':>7} {'repaired':>9} {'rate':>7}  expected",
    ]
    for kind, f in r["faults"].items():
        expected = (
            f"caught as {CAUGHT_AS[kind]}"
            if kind in CAUGHT_AS
            else f"repaired by {REPAIRED_BY[kind]}"
        )
        rate = f"{f['rate']:.4f}" if f["rate"] is not None else "-"
        lines.append(
            f"  {kind:<18} {f['seeded']:>7} {f['caught']:>7} {f['repaired']:>9} {rate:>7}  "
            f"{expected}"
        )
    lines.append(
        f"  {'clean calls':<18} {clean['calls']:>7}  false positives {clean['false_positives']} "
        f"(rejected {clean['rejected']}, repaired {clean['repaired']})"
    )
    lines.append(
        f"  check per call: p50 {timing['p50_us']} us, p99 {timing['p99_us']} us, "
        f"max {timing['max_us']} us ({timing['calls']} calls x {timing['repetitions']}; "
        f"target p99 < {P99_BUDGET_US:g} us)"
    )
    for kind, f in r["faults"].items():
        for miss in f["misses"]:
            lines.append(f"  miss {kind}: {orjson.dumps(miss).decode()}")
    for example in clean["examples"]:
        lines.append(f"  false positive: {orjson.dumps(example).decode()}")
    return lines


def _analyzer_lines(a: dict[str, Any]) -> list[str]:
    per_language = ", ".join(
        f"{language} {c['as_expected']}/{c['snippets']}" for language, c in a["by_language"].items()
    )
    held = sorted(e for e, v in a["policy"].items() if v == "hold")
    denied = sorted(e for e, v in a["policy"].items() if v == "deny")
    lines = [
        f"analyzers: {a['snippets']} snippets, {a['as_expected']} classified as expected "
        f"(rate {a['rate']:.4f}; {per_language})",
        f"  example policy ({', '.join(held)} -> hold; {', '.join(denied)} -> deny; "
        f"others allow): hold rate {a['hold_rate']:.4f}, deny rate {a['deny_rate']:.4f}",
    ]
    for m in a["mismatches"]:
        lines.append(
            f"  mismatch {m['language']} {m['code']!r}: expected {m['expected']}, got {m['got']}"
        )
    return lines
