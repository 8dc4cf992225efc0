"""`gateway tools-eval`: real tool calls replayed through the gateway's own tool-call
checker (gateway/toolcalls/contract.py), clean and with seeded faults, and code snippets
through its code analyzers (gateway/toolcalls/analyzers/).

Data, read where it lies (never copied into the repository):

- tau-bench airline conversations (`agent-trajectories/tau_bench_airline_dev.jsonl`):
  every tool call gpt-4o made, checked against the tools its conversation declared.
- BFCL's function docs (`bfcl/multi_turn_func_doc/*.json`), one tool set per file. BFCL
  writes Python's type names, mapped when loading: `dict` -> `object`, `float` ->
  `number`, `tuple` -> `array`, and `any` drops the `type` key (anything goes). BFCL has
  no real calls, so one valid call is built per function: each required property gets a
  value of its type (an enum its first member, a string "x", an integer 1, a number 1.5,
  a boolean true, an array [], an object {}, an untyped one "x").

The checker was designed looking at the tau-bench conversations; BFCL took no part in
it. Every figure is therefore reported per dataset, and BFCL's are the held-out ones.

Per dataset:

- clean: every call as it is. A false positive is a clean call rejected or repaired
  (target 0).
- seeded faults: one per clean call per kind where the kind applies, the choices made by
  a generator seeded with (`seed`, dataset, call, kind):

  unknown_tool      the name changed to one not declared          caught as unknown_tool
  missing_required  a required property removed                   caught as schema
  wrong_type        a property's value replaced by one of another
                    JSON type than its schema's single `type`     caught as schema
  extra_field       an undeclared property added                  caught as schema
  truncated_json    the trailing `}`/`]` removed (the model
                    stopped before closing)                       repaired (closed_json)
  code_fence        the arguments wrapped in ```json fences       repaired (code_fence)
  string_number     an integer/number value sent as its JSON text repaired (coerced)

  Neither dataset's schemas say `additionalProperties: false`, and without it an extra
  property is allowed; so extra_field is checked against a copy of the tools in which
  the called tool's schema gets `additionalProperties: false` added. A repair counts
  only when the call is then valid, the expected repair was made, and the arguments are
  the original ones. rate: the share of seeds with the expected outcome (target 1.0).
- timing: `contract.check` per clean call, the contracts built beforehand as the gateway
  caches them, timed with `time.perf_counter_ns` over `TIMING_REPETITIONS` passes over
  all calls; p50 and p99 in microseconds (target p99 under 200 us).

Analyzers: `SNIPPETS`, Python, shell and SQL code each with the effects it has, through
`analyze`; the rate is the share classified exactly as expected (target 1.0). Their
effects are then judged by a small example policy (`EXAMPLE_POLICY`, the strictest
verdict wins, as `tool_calls.tools.<name>.arguments` rules do) for the hold and deny
rates.

The package, one concern a module (none imports this one):

- `data`: reading tau-bench and BFCL, BFCL's type mapping, building BFCL's calls;
- `faults`: the seeders, and what each kind must become (`CAUGHT_AS`, `REPAIRED_BY`);
- `checking`: a dataset's clean calls, seeded faults and timing through the checker;
- `snippets`: the code snippets, their expected effects and the example policy;
- `report`: the targets, which were missed, the printed table and the JSON;
- here: `tools_eval`, the whole evaluation, and the names the CLI and tests import.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gateway.offline.tools_eval.checking import (
    EXAMPLE_CHARS,
    MISSES_SHOWN,
    TIMING_REPETITIONS,
    FaultTally,
    Progress,
    evaluate_dataset,
    expected_outcome,
    time_checks,
)
from gateway.offline.tools_eval.data import (
    BFCL_DOCS,
    DEFAULT_DATA,
    REPOSITORY,
    TAU_BENCH,
    DataError,
    Dataset,
    RealCall,
    bfcl_tool,
    example_call,
    load_bfcl,
    load_tau_bench,
)
from gateway.offline.tools_eval.faults import (
    CAUGHT_AS,
    REPAIRED_BY,
    SEEDERS,
    FaultKind,
    Seeded,
    Seeder,
)
from gateway.offline.tools_eval.report import (
    DATASETS,
    DEFAULT_OUT,
    P99_BUDGET_US,
    missed_targets,
    table,
    targets,
    write_report,
)
from gateway.offline.tools_eval.snippets import (
    EXAMPLE_POLICY,
    SNIPPETS,
    Snippet,
    evaluate_analyzers,
    verdict_of,
)

__all__ = [
    "BFCL_DOCS",
    "CAUGHT_AS",
    "DATASETS",
    "DEFAULT_DATA",
    "DEFAULT_OUT",
    "EXAMPLE_CHARS",
    "EXAMPLE_POLICY",
    "MISSES_SHOWN",
    "P99_BUDGET_US",
    "REPAIRED_BY",
    "REPOSITORY",
    "SEEDERS",
    "SNIPPETS",
    "TAU_BENCH",
    "TIMING_REPETITIONS",
    "DataError",
    "Dataset",
    "FaultKind",
    "FaultTally",
    "Progress",
    "RealCall",
    "Seeded",
    "Seeder",
    "Snippet",
    "bfcl_tool",
    "evaluate_analyzers",
    "evaluate_dataset",
    "example_call",
    "expected_outcome",
    "load_bfcl",
    "load_tau_bench",
    "missed_targets",
    "table",
    "time_checks",
    "tools_eval",
    "verdict_of",
    "write_report",
]


def tools_eval(
    data: Path, seed: int = 0, limit: int = 0, progress: Progress = lambda line: None
) -> dict[str, Any]:
    """The report; `limit`: only the first N calls of each dataset (0: all)."""
    report: dict[str, Any] = {"data": str(data), "seed": seed, "limit": limit}
    for load in (load_tau_bench, load_bfcl):
        dataset = load(data, limit)
        progress(f"tools-eval: {dataset.name}: {len(dataset.calls)} calls from {dataset.source}")
        report[dataset.name] = evaluate_dataset(dataset, seed, progress)
    report["analyzers"] = evaluate_analyzers()
    progress(f"tools-eval: analyzers: {report['analyzers']['snippets']} snippets classified")
    report["targets"] = targets()
    report["missed"] = missed_targets(report)
    return report
