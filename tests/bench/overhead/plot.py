"""The overhead benchmark's figure: an SVG drawn here, turned into a PNG by headless Chromium.

No plotting library: the gateway's environment has none, and Debian's Chromium (which the
browser tests already use) renders the SVG offline. Two log-scale bar charts: the latency
each target adds over direct (bar: p50, tick: p99) per workload and concurrency, and
requests/s at concurrency 32.
"""

from __future__ import annotations

import math
import shutil
import subprocess
import tempfile
from html import escape
from pathlib import Path
from typing import Any

COLOURS = {
    "direct": "#9e9e9e",
    "passthrough": "#6baed6",
    "gateway": "#e6550d",
    "gateway-2w": "#fdae6b",  # --workers 2
    "litellm": "#756bb1",
    "vllm-router": "#31a354",
    "portkey": "#c2185b",
}
WIDTH = 1400
CHART_HEIGHT = 460
LEFT = 80
RIGHT = 30
FLOOR_MS = 0.01  # overheads at or below this (or negative) are drawn at it, hatched

LABELS = {
    "tau_whole": "tau whole",
    "tau_stream": "tau stream",
    "long50k_whole": "50k tokens",
    "tau_whole_20ms": "tau whole|20 ms engine",
    "tau_stream_20ms": "tau stream|20 ms engine",
}


def _short(value: float) -> str:
    """1990 rather than 1.99e+03: the labels are read, not parsed."""
    if value >= 100:
        return f"{value:.0f}"
    return f"{value:.1f}" if value >= 10 else f"{value:.3g}"


def _log_axis(low: float, high: float) -> tuple[int, int]:
    return math.floor(math.log10(low)), math.ceil(math.log10(high))


def _chart(
    title: str,
    unit: str,
    groups: list[tuple[str, dict[str, tuple[float, float | None]]]],
    targets: list[str],
    top: int,
    floor: float,
) -> list[str]:
    """Grouped log-scale bars; each value is (bar, optional tick) per target."""
    values = [v for _, row in groups for bar, tick in row.values() for v in (bar, tick) if v]
    high = max([floor * 10, *values])
    lo_exp, hi_exp = _log_axis(floor, high)
    # Headroom above the tallest bar for its rotated label.
    plot_top, plot_bottom = top + 80, top + CHART_HEIGHT - 60
    span = hi_exp - lo_exp

    def y(value: float) -> float:
        value = max(value, floor)
        return plot_bottom - (math.log10(value) - lo_exp) / span * (plot_bottom - plot_top)

    out = [f'<text x="{LEFT}" y="{top + 22}" class="title">{escape(title)}</text>']
    for exp in range(lo_exp, hi_exp + 1):
        yy = y(10.0**exp)
        label = f"{10.0**exp:g}"
        out.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{yy:.1f}" y2="{yy:.1f}" class="grid"/>'
        )
        out.append(
            f'<text x="{LEFT - 8}" y="{yy + 4:.1f}" class="axis" text-anchor="end">{label}</text>'
        )
    out.append(
        f'<text x="18" y="{(plot_top + plot_bottom) / 2:.0f}" class="axis" '
        f'transform="rotate(-90 18 {(plot_top + plot_bottom) / 2:.0f})" text-anchor="middle">'
        f"{escape(unit)}</text>"
    )
    group_width = (WIDTH - LEFT - RIGHT) / max(len(groups), 1)
    bar = min(22.0, (group_width - 16) / max(len(targets), 1))
    for g, (label, row) in enumerate(groups):
        x0 = LEFT + g * group_width + (group_width - bar * len(targets)) / 2
        for t, target in enumerate(targets):
            if target not in row:
                continue
            value, tick = row[target]
            x = x0 + t * bar
            yy = y(value)
            style = "hatch" if value <= floor else ""
            out.append(
                f'<rect x="{x:.1f}" y="{yy:.1f}" width="{bar - 2:.1f}" '
                f'height="{plot_bottom - yy:.1f}" fill="{COLOURS.get(target, "#555")}" '
                f'class="{style}"/>'
            )
            if tick is not None:
                ty = y(tick)
                out.append(
                    f'<line x1="{x - 1:.1f}" x2="{x + bar - 1:.1f}" y1="{ty:.1f}" y2="{ty:.1f}" '
                    f'class="tick"/><line x1="{x + bar / 2 - 1:.1f}" x2="{x + bar / 2 - 1:.1f}" '
                    f'y1="{ty:.1f}" y2="{yy:.1f}" class="whisker"/>'
                )
            text = "≤0" if value <= floor else _short(value)
            ty = min(yy, y(tick) if tick is not None else yy) - 4
            out.append(
                f'<text x="{x + bar / 2 - 1:.1f}" y="{ty:.1f}" class="value" '
                f'transform="rotate(-90 {x + bar / 2 - 1:.1f} {ty:.1f})">{text}</text>'
            )
        cx = LEFT + (g + 0.5) * group_width
        for i, part in enumerate(label.split("|")):
            out.append(
                f'<text x="{cx:.1f}" y="{plot_bottom + 18 + 14 * i}" class="axis" '
                f'text-anchor="middle">{escape(part)}</text>'
            )
    return out


def svg(report: dict[str, Any]) -> tuple[str, int]:
    results: dict[str, Any] = report["results"]
    targets = [t for t in COLOURS if t in results]
    peers = [t for t in targets if t != "direct"]
    overhead_groups: list[tuple[str, dict[str, tuple[float, float | None]]]] = []
    workloads = list(LABELS)
    for workload in workloads:
        levels = sorted({int(c) for t in peers for c in results[t].get(workload, {})})
        for c in levels:
            row = {
                t: (
                    results[t][workload][str(c)]["overhead_p50_ms"],
                    results[t][workload][str(c)]["overhead_p99_ms"],
                )
                for t in peers
                if str(c) in results[t].get(workload, {})
            }
            overhead_groups.append((f"{LABELS[workload]}|c={c}", row))
    rps_groups = []
    for workload in workloads:
        row = {
            t: (float(results[t][workload]["32"]["rps"]), None)
            for t in targets
            if "32" in results[t].get(workload, {})
        }
        if row:
            rps_groups.append((f"{LABELS[workload]}|c=32", row))
    parts = [
        *_chart(
            "Latency added over direct (ms, log scale): bar p50, tick p99",
            "added ms",
            overhead_groups,
            peers,
            0,
            FLOOR_MS,
        ),
        *_chart(
            "Requests/s at concurrency 32 (log scale)",
            "requests/s",
            rps_groups,
            targets,
            CHART_HEIGHT,
            1.0,
        ),
    ]
    legend_y = 2 * CHART_HEIGHT + 10
    for i, target in enumerate(targets):
        x = LEFT + i * 150
        parts.append(
            f'<rect x="{x}" y="{legend_y}" width="14" height="14" fill="{COLOURS[target]}"/>'
        )
        parts.append(f'<text x="{x + 20}" y="{legend_y + 12}" class="axis">{escape(target)}</text>')
    note = (
        f"{report['date']} · {report['machine']} · medians over {report['rounds']} round(s) · "
        "load generator, mock engine and target share the cores"
    )
    parts.append(f'<text x="{LEFT}" y="{legend_y + 40}" class="note">{escape(note)}</text>')
    height = legend_y + 60
    style = (
        "<style>text{font-family:DejaVu Sans,Arial,sans-serif}"
        ".title{font-size:17px;font-weight:bold}.axis{font-size:12px;fill:#333}"
        ".value{font-size:10px;fill:#222}.note{font-size:12px;fill:#555}"
        ".grid{stroke:#e0e0e0;stroke-width:1}.tick{stroke:#000;stroke-width:2}"
        ".whisker{stroke:#000;stroke-width:1;stroke-dasharray:2,2}"
        ".hatch{fill-opacity:0.35}</style>"
    )
    body = "\n".join(parts)
    document = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}"><rect width="100%" height="100%" fill="white"/>'
        f"{style}{body}</svg>"
    )
    return document, height


def render_png(report: dict[str, Any], out: Path) -> str | None:
    """Writes the PNG (and the SVG beside it in a temporary directory); returns None, or
    why no PNG was made."""
    document, height = svg(report)
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        return "no chromium to render the PNG (make browser installs Debian's)"
    with tempfile.TemporaryDirectory(prefix="overhead-plot-") as tmp:
        page = Path(tmp) / "overhead.html"
        page.write_text(
            f"<!doctype html><html><body style='margin:0;background:white'>{document}</body></html>"
        )
        command = [chromium, "--headless", "--no-sandbox", "--disable-gpu",
                   "--disable-background-networking", "--disable-component-update",
                   "--no-first-run", "--hide-scrollbars", f"--user-data-dir={tmp}/profile",
                   f"--window-size={WIDTH},{height}", f"--screenshot={out}",
                   page.as_uri()]  # fmt: skip
        try:
            subprocess.run(command, capture_output=True, timeout=120, check=True)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            return f"chromium failed: {exc}"
    return None if out.exists() else "chromium wrote no PNG"
