"""deploy/observability: the Prometheus scrape config has the shape Prometheus expects, and
every query of the Grafana dashboard names only metrics the gateway exports, so a renamed
metric breaks this test instead of leaving an empty panel."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.telemetry.exported import exported_families

ROOT = Path(__file__).resolve().parents[3]
OBSERVABILITY = ROOT / "deploy" / "observability"
PROMETHEUS = OBSERVABILITY / "prometheus.yml"
DASHBOARD = OBSERVABILITY / "grafana-dashboard.json"

# The gateway's metric families as Prometheus names them: counters without `_total`,
# histograms without `_bucket`/`_sum`/`_count` (queries are normalised the same way).

# Panels the dashboard must keep, by a word of their title (the brief's list).
REQUIRED_PANELS = [
    "requests/s",
    "time to first token",
    "total latency",
    "gateway overhead",
    "tokens/s",
    "cache hit ratio",
    "cost usd/h",
    "saved usd/h",
    "tier split",
    "route decisions",
    "cascades",
    "fallbacks",
    "retries",
    "load shed",
    "breaker state",
    "replica inflight",
    "queue depth",
    "kv-cache",
    "prefix-cache hit ratio",
    "acceptance rate",
    "mean accepted length",
    "trimmed tokens",
    "checkpoints",
]

# A metric name where one starts: not inside a longer identifier or a label name.
METRIC = re.compile(r"(?<![A-Za-z0-9_:])((?:gateway_|vllm:)[a-z0-9_:]+)")
SUFFIX = re.compile(r"(_total|_bucket|_sum|_count|_created)$")


def known_metric_names() -> set[str]:
    """Metric families the gateway exports (so a renamed metric breaks this test), without
    `_total`/histogram suffixes."""
    return set(exported_families())


def family(name: str) -> str:
    return SUFFIX.sub("", name)


def load_dashboard() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return dashboard


def query_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """Every panel that queries, rows' nested panels included (a collapsed row keeps them)."""
    for panel in panels:
        if panel["type"] == "row":
            yield from query_panels(panel.get("panels", []))
        else:
            yield panel


def labelled_exprs(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable."""
    exprs = [
        (f"{p['title']} {t['refId']}", t["expr"])
        for p in query_panels(dashboard["panels"])
        for t in p["targets"]
    ]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            exprs.append((f"${var['name']}", query))
    return exprs


def all_exprs(dashboard: dict[str, Any]) -> list[str]:
    return [expr for _, expr in labelled_exprs(dashboard)]


def balanced(expr: str) -> bool:
    pairs = {")": "(", "]": "[", "}": "{"}
    stack: list[str] = []
    quote: str | None = None
    escaped = False
    for ch in expr:
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = None
        elif ch in "\"'`":
            quote = ch
        elif ch in "([{":
            stack.append(ch)
        elif ch in pairs and (not stack or stack.pop() != pairs[ch]):
            return False
    return not stack and quote is None


def histogram_quantile_args(expr: str) -> list[str]:
    """The second argument of every histogram_quantile(φ, ...) call in expr."""
    args = []
    for match in re.finditer(r"histogram_quantile\s*\(", expr):
        depth, start = 1, match.end()
        for i in range(start, len(expr)):
            depth += {"(": 1, ")": -1}.get(expr[i], 0)
            if depth == 0:
                args.append(expr[start:i].split(",", 1)[1])
                break
    return args


# ---- prometheus.yml


def test_prometheus_scrapes_gateway_every_5s_and_the_engines() -> None:
    config = yaml.safe_load(PROMETHEUS.read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"agent-gateway", "vllm"}

    gateway = jobs["agent-gateway"]
    assert gateway["metrics_path"] == "/metrics"
    assert gateway["scrape_interval"] == "5s"
    assert _seconds(gateway["scrape_timeout"]) <= _seconds(gateway["scrape_interval"])
    assert [t for sc in gateway["static_configs"] for t in sc["targets"]] == ["127.0.0.1:8080"]

    engines = jobs["vllm"]
    assert engines["metrics_path"] == "/metrics"
    targets = [t for sc in engines["static_configs"] for t in sc["targets"]]
    assert targets == ["127.0.0.1:8001", "127.0.0.1:8002"]


def test_prometheus_kubernetes_variant_parses_and_keeps_annotated_pods() -> None:
    lines = PROMETHEUS.read_text().splitlines()
    block = lines[lines.index("# BEGIN kubernetes") + 1 : lines.index("# END kubernetes")]
    assert all(line.startswith("# ") for line in block), "keep the block uncommentable"
    config = yaml.safe_load("\n".join(line[2:] for line in block))
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"agent-gateway", "vllm"}
    assert jobs["agent-gateway"]["scrape_interval"] == "5s"
    for job in jobs.values():
        assert job["kubernetes_sd_configs"] == [{"role": "pod"}]
        keep = [r for r in job["relabel_configs"] if r.get("action") == "keep"]
        scrape = "__meta_kubernetes_pod_annotation_prometheus_io_scrape"
        assert {"source_labels": [scrape], "regex": "true", "action": "keep"} in keep
        targets = {r.get("target_label") for r in job["relabel_configs"]}
        assert {"__metrics_path__", "__address__"} <= targets


def _seconds(duration: str) -> float:
    match = re.fullmatch(r"(\d+)(ms|s|m)", duration)
    assert match, duration
    return int(match[1]) * {"ms": 0.001, "s": 1.0, "m": 60.0}[match[2]]


# ---- grafana-dashboard.json


def test_dashboard_is_importable_with_templated_datasource() -> None:
    dashboard = load_dashboard()
    assert 36 <= dashboard["schemaVersion"] <= 41
    assert dashboard["uid"] and dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    for name in ("model", "replica"):
        query = variables[name]["query"]
        text = query["query"] if isinstance(query, dict) else query
        assert re.fullmatch(rf"label_values\(gateway_[a-z_]+, {name}\)", text), text
        assert variables[name]["datasource"]["uid"] == "${DS_PROMETHEUS}"


def test_every_panel_has_a_datasource_and_a_query() -> None:
    dashboard = load_dashboard()
    panels = list(query_panels(dashboard["panels"]))
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels:
        where = panel["title"]
        assert panel["type"] in {"timeseries", "stat", "bargauge", "table"}, where
        assert panel["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, where
        assert panel["targets"], where
        for target in panel["targets"]:
            assert target["expr"].strip(), where
            assert target.get("datasource", panel["datasource"]) == panel["datasource"], where
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), where
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, where


def test_dashboard_has_the_panels_operators_need() -> None:
    titles = [p["title"].lower() for p in query_panels(load_dashboard()["panels"])]
    missing = [word for word in REQUIRED_PANELS if not any(word in t for t in titles)]
    assert not missing


def test_queries_name_only_metrics_the_gateway_exports() -> None:
    exprs = all_exprs(load_dashboard())
    used = {family(name) for expr in exprs for name in METRIC.findall(expr)}
    assert used, "no metric found in the dashboard's queries"
    unknown = used - known_metric_names()
    assert not unknown, f"dashboard queries metrics the gateway does not export: {unknown}"


@pytest.mark.parametrize(
    "expr", [pytest.param(expr, id=where) for where, expr in labelled_exprs(load_dashboard())]
)
def test_query_is_balanced_and_quantiles_read_buckets(expr: str) -> None:
    assert balanced(expr), expr
    for arg in histogram_quantile_args(expr):
        names = METRIC.findall(arg)
        assert names, expr
        assert all(name.endswith("_bucket") for name in names), expr
        assert re.search(r"\b(sum|max|min|avg)\s+by\s*\([^)]*\ble\b", arg), (
            f"aggregate histogram buckets by le: {expr}"
        )
        assert "rate(" in arg or "increase(" in arg, f"quantiles of raw counters: {expr}"


@pytest.mark.parametrize(
    ("expr", "ok"),
    [
        ('sum(rate(x{a="("}[5m]))', True),
        ("sum(rate(x[5m])", False),
        ("sum(rate(x[5m)))", False),
        ("sum{(})", False),
    ],
)
def test_balance_check_itself(expr: str, ok: bool) -> None:
    assert balanced(expr) is ok


def test_metric_extraction_itself() -> None:
    expr = 'sum by (le) (rate(gateway_overhead_seconds_bucket{job="agent-gateway"}[1m]))'
    assert METRIC.findall(expr) == ["gateway_overhead_seconds_bucket"]
    assert family("gateway_requests_total") == "gateway_requests"
    assert METRIC.findall("vllm:num_requests_waiting > 0") == ["vllm:num_requests_waiting"]
    assert histogram_quantile_args("histogram_quantile(0.5, sum by (le) (rate(a_bucket[1m])))") == [
        " sum by (le) (rate(a_bucket[1m]))"
    ]
