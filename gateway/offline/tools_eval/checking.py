"""One dataset through the gateway's tool-call checker: its clean calls (false positives),
each seeded fault against what its kind expects (tallied per kind, the misses kept), and
`contract.check` timed per clean call."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.offline.replay.sim import percentile
from gateway.offline.tools_eval.data import Dataset, arguments_text
from gateway.offline.tools_eval.faults import CAUGHT_AS, REPAIRED_BY, SEEDERS, FaultKind
from gateway.toolcalls.contract import ToolContract, ToolContracts

TIMING_REPETITIONS = 5
MISSES_SHOWN = 3  # per fault kind, in the report
EXAMPLE_CHARS = 160

Progress = Callable[[str], None]


@dataclass
class FaultTally:
    seeded: int = 0
    caught: int = 0
    repaired: int = 0
    expected: int = 0
    misses: list[dict[str, Any]] = field(default_factory=list)

    def report(self) -> dict[str, Any]:
        return {
            "seeded": self.seeded,
            "caught": self.caught,
            "repaired": self.repaired,
            "as_expected": self.expected,
            "rate": round(self.expected / self.seeded, 4) if self.seeded else None,
            "misses": self.misses[:MISSES_SHOWN],
        }


def expected_outcome(
    kind: FaultKind, contract: ToolContract, seeded: dict[str, Any], original: dict[str, Any]
) -> tuple[bool, dict[str, Any]]:
    """(whether the checker did what `kind` expects, what it did)."""
    _, made, issue, parsed = contract.check(0, seeded)
    did: dict[str, Any] = {"problem": issue.problem if issue else None, "repairs": made}
    if issue is not None:
        did["detail"] = issue.detail[:EXAMPLE_CHARS]
    if kind in CAUGHT_AS:
        return issue is not None and issue.problem == CAUGHT_AS[kind], did
    return issue is None and REPAIRED_BY[kind] in made and parsed == original, did


def evaluate_dataset(dataset: Dataset, seed: int, progress: Progress) -> dict[str, Any]:
    contracts = ToolContracts()  # one contract per tool list, as the gateway caches them
    clean = _clean(dataset, contracts)
    progress(
        f"tools-eval: {dataset.name}: {len(dataset.calls)} clean calls checked, "
        f"{clean['false_positives']} false positives"
    )
    faults = {kind: FaultTally() for kind in SEEDERS}
    for index, real in enumerate(dataset.calls):
        for kind, seeder in SEEDERS.items():
            made = seeder(real, random.Random(f"{seed}/{dataset.name}/{index}/{kind}"))
            if made is None:
                continue
            tally = faults[kind]
            tally.seeded += 1
            as_expected, did = expected_outcome(
                kind, contracts.of(made.tools), made.call, real.arguments
            )
            tally.caught += did["problem"] is not None
            tally.repaired += did["problem"] is None and bool(did["repairs"])
            tally.expected += as_expected
            if not as_expected:
                seeded_text = str(made.call["function"].get("arguments"))[:EXAMPLE_CHARS]
                tally.misses.append(
                    {"tool": made.call["function"]["name"], "arguments": seeded_text, **did}
                )
    seeded = sum(t.seeded for t in faults.values())
    progress(f"tools-eval: {dataset.name}: {seeded} seeded faults checked")
    timing = time_checks(dataset, contracts)
    progress(f"tools-eval: {dataset.name}: check timed, p99 {timing['p99_us']} us")
    return {
        "source": dataset.source,
        "role": dataset.role,
        "tool_sets": dataset.tool_sets,
        "tools": dataset.tools,
        "clean": clean,
        "faults": {kind: tally.report() for kind, tally in faults.items()},
        "timing": timing,
    }


def _clean(dataset: Dataset, contracts: ToolContracts) -> dict[str, Any]:
    rejected = repaired = 0
    examples: list[dict[str, Any]] = []
    for real in dataset.calls:
        _, made, issue, _ = contracts.of(real.tools).check(0, real.call)
        rejected += issue is not None
        repaired += issue is None and bool(made)
        if (issue is not None or made) and len(examples) < MISSES_SHOWN:
            examples.append(
                {
                    "tool": real.name,
                    "arguments": arguments_text(real)[:EXAMPLE_CHARS],
                    "problem": issue.problem if issue else None,
                    "detail": issue.detail[:EXAMPLE_CHARS] if issue else None,
                    "repairs": made,
                }
            )
    return {
        "calls": len(dataset.calls),
        "rejected": rejected,
        "repaired": repaired,
        "false_positives": rejected + repaired,
        "examples": examples,
    }


def time_checks(dataset: Dataset, contracts: ToolContracts) -> dict[str, Any]:
    """`contract.check` alone, per clean call; contracts looked up before the clock starts."""
    pairs = [(contracts.of(real.tools), real.call) for real in dataset.calls]
    samples: list[int] = []
    for _ in range(TIMING_REPETITIONS):
        for contract, call in pairs:
            started = time.perf_counter_ns()
            contract.check(0, call)
            samples.append(time.perf_counter_ns() - started)
    samples.sort()
    return {
        "calls": len(pairs),
        "repetitions": TIMING_REPETITIONS,
        "p50_us": round(percentile(samples, 0.5) / 1000, 1),
        "p99_us": round(percentile(samples, 0.99) / 1000, 1),
        "max_us": round(samples[-1] / 1000, 1) if samples else 0.0,
    }
