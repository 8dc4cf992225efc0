"""`gateway route-eval --shadow LOG`: would the shadow router have done better than the live
one, on the most recent traffic?

The request log carries both routers' decisions on every request of a route with a shadow
(`shadow`: tier and score of each; gateway/tiering/shadow.py) and, where the cascade
checked the small tier's answer, whether it passed (`cascade`, `cascade_tier`). On those
checked requests each router is judged by what it would have done:

- `auc`: how well its score ranks the answers that passed above those that failed (the
  chance a passing one scores higher than a failing one; 0.5 is a coin);
- `small_share`: the share its threshold would send to the small tier;
- `pass_rate_when_small`: of those, the share whose checks passed.

The verdict: better when the candidate ranks at least 0.02 higher and, at its own
threshold, keeps a pass rate no more than 0.01 below the live router's; with fewer than
`MIN_CHECKED` checked requests it says there are too few to tell.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

from gateway.offline.route_train.outcomes import CHECKED, PASSED
from gateway.offline.route_train.ranking import auc

MIN_CHECKED = 100
AUC_MARGIN = 0.02
PASS_RATE_SLACK = 0.01

Vector = npt.NDArray[np.float64]


def _side(tiers: list[str], scores: Vector, passed: Vector, small: str) -> dict[str, Any]:
    sent_small = np.array([t == small for t in tiers])
    found = auc(scores, passed)
    return {
        "auc": None if found is None else round(found, 4),
        "small_share": round(float(sent_small.mean()), 4) if len(tiers) else None,
        "pass_rate_when_small": (
            round(float(passed[sent_small].mean()), 4) if sent_small.any() else None
        ),
    }


def shadow_eval(
    entries: Iterable[dict[str, Any]], *, tier: str = "small", last: int = 0
) -> dict[str, Any]:
    """`last`: only the most recent N requests with a shadow decision (0: all)."""
    shadowed = [e for e in entries if isinstance(e.get("shadow"), dict)]
    if last:
        shadowed = shadowed[-last:]
    live_known = [e for e in shadowed if "live_tier" in e["shadow"]]
    agreeing = sum(e["shadow"]["tier"] == e["shadow"]["live_tier"] for e in live_known)
    agreement = round(agreeing / len(live_known), 4) if live_known else None
    checked = [
        e for e in live_known if e.get("cascade") in CHECKED and e.get("cascade_tier") == tier
    ]
    passed = np.array([e["cascade"] == PASSED for e in checked], dtype=np.float64)
    candidate = _side(
        [e["shadow"]["tier"] for e in checked],
        np.array([e["shadow"]["score"] for e in checked], dtype=np.float64),
        passed,
        tier,
    )
    live = _side(
        [e["shadow"]["live_tier"] for e in checked],
        np.array([e["shadow"]["live_score"] for e in checked], dtype=np.float64),
        passed,
        tier,
    )
    return {
        "requests_with_shadow": len(shadowed),
        "agreement": agreement,
        "checked": len(checked),
        "passed": int(passed.sum()),
        "candidate": candidate,
        "live": live,
        "verdict": _verdict(len(checked), candidate, live),
    }


def _verdict(checked: int, candidate: dict[str, Any], live: dict[str, Any]) -> str:
    if checked < MIN_CHECKED:
        return f"too few checked requests to tell ({checked}; at least {MIN_CHECKED})"
    if candidate["auc"] is None or live["auc"] is None:
        return "every checked answer had the same outcome: nothing to rank"
    ranks_better = candidate["auc"] >= live["auc"] + AUC_MARGIN
    keeps_quality = (candidate["pass_rate_when_small"] or 0.0) >= (
        live["pass_rate_when_small"] or 0.0
    ) - PASS_RATE_SLACK
    if ranks_better and keeps_quality:
        return (
            f"better: ranks checked answers at AUC {candidate['auc']} against "
            f"{live['auc']}, passing {candidate['pass_rate_when_small']} of what it "
            f"sends small against {live['pass_rate_when_small']}"
        )
    return (
        f"not better: AUC {candidate['auc']} against {live['auc']}, pass rate when small "
        f"{candidate['pass_rate_when_small']} against {live['pass_rate_when_small']}"
    )


def table(report: dict[str, Any]) -> str:
    rows = ("auc", "small_share", "pass_rate_when_small")
    lines = [
        f"{report['requests_with_shadow']} requests with a shadow decision (agreement "
        f"{report['agreement']}); {report['checked']} with the small tier's answer checked, "
        f"{report['passed']} passed",
        f"{'figure':<24}{'candidate':>12}{'live':>12}",
    ]
    for row in rows:
        lines.append(
            f"{row:<24}{_cell(report['candidate'][row]):>12}{_cell(report['live'][row]):>12}"
        )
    lines.append(f"verdict: {report['verdict']}")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    return "-" if value is None else f"{value:.4f}"
