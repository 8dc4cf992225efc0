"""The printed table of `gateway replay --gateways ...`: one row per gateway count and
sharing mode, next to one gateway, round-robin and the pooled oracle."""

from __future__ import annotations

from typing import Any


def scale_out_table(r: dict[str, Any]) -> str:
    lines = [
        f"{r['requests']} requests, {r['replicas']} replicas x {r['cache_blocks']} blocks; "
        f"{r['balancer']} balancer (seed {r['seed']}); placements flushed every "
        f"{r['batch_ms']} ms, applied {r['lag_ms']} ms later; oracle hit rate "
        f"{r['oracle_hit_rate']:.3f}",
        f"{'gateways':>8} {'sharing':<11} {'hit_rate':>8} {'/oracle':>8} {'/K=1':>6} "
        f"{'imbalance_p95':>13} {'ttft_p50_s':>10} {'ttft_p95_s':>10} {'belief_err':>10}",
    ]
    for row in r["runs"]:
        lines.append(
            f"{row['gateways']:>8} {row['sharing']:<11} {row['hit_rate']:>8.3f} "
            f"{row['hit_rate_over_oracle']:>8.3f} {row['hit_rate_over_one_gateway']:>6.3f} "
            f"{row['imbalance_p95']:>13.3f} {row['ttft_p50_s']:>10.3f} "
            f"{row['ttft_p95_s']:>10.3f} {row['belief_error']:>10.3f}"
        )
    rr = r["round_robin"]
    lines.append(
        f"{'-':>8} {'round-robin':<11} {rr['hit_rate']:>8.3f} "
        f"{rr['hit_rate'] / r['oracle_hit_rate'] if r['oracle_hit_rate'] else 0.0:>8.3f} "
        f"{'':>6} {rr['imbalance_p95']:>13.3f} {rr['ttft_p50_s']:>10.3f} "
        f"{rr['ttft_p95_s']:>10.3f}"
    )
    for name, passed in r["checks"].items():
        if name != "gateways":
            lines.append(f"check at {r['checks']['gateways']} gateways: {name}: {passed}")
    return "\n".join(lines)
