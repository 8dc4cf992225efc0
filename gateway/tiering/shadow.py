"""Shadow mode: a candidate router scored on live traffic, never acted on.

A route whose `learned.shadow` names a candidate artifact hands every request's choice a
`ShadowJob`: the text the router reads and both routers. Nothing is scored while the
client waits; telemetry runs the job once the answer is sent
(`Telemetry.finish`), and the request log gets both decisions side by side:

    "shadow": {"tier": "small", "score": 0.71, "live_tier": "large", "live_score": 0.42}

`gateway route-eval --shadow LOG` compares them on the requests whose small-tier answer
was checked (gateway/offline/shadow_eval.py), before anyone promotes the candidate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class Scorer(Protocol):
    def score(self, text: str) -> float: ...


@dataclass(frozen=True)
class ShadowJob:
    text: str
    candidate: Scorer
    threshold: float
    live: Scorer | None  # None: the route's learned router is off
    live_threshold: float
    lowest: str
    highest: str

    def run(self) -> dict[str, Any]:
        score = self.candidate.score(self.text)
        result: dict[str, Any] = {
            "tier": self._tier(score, self.threshold),
            "score": round(score, 4),
        }
        if self.live is not None:
            live = self.live.score(self.text)
            result["live_tier"] = self._tier(live, self.live_threshold)
            result["live_score"] = round(live, 4)
        return result

    def _tier(self, score: float, threshold: float) -> str:
        return self.lowest if score >= threshold else self.highest
