"""One tenant floods a real `gateway serve`; the other is still served (issue 22, finding 4).

Before fair admission, tenant B's requests arriving while tenant A held every slot were all
shed with 429 `overloaded`: admission was first come, first served across tenants. Now a
request whose tenant holds less than its share waits in line for the next free slot, and
A's excess is refused with Retry-After (gateway/resilience/fair_share.py). The figures
for the docs come from the same code at full size: `python -m tests.bench.tenant_flood`.
"""

from __future__ import annotations

from tests.bench.tenant_flood import run


def test_a_flooding_tenant_does_not_starve_another(redis_url: str) -> None:
    report = run(redis_url, flooders=120, seconds=3.0, victims=10, hammer=True)
    b, a = report["flood_b"], report["flood_a"]
    assert b["statuses"] == {"200": 10}, report["flood_b"]  # every one of B's requests served
    assert a["statuses"].get("429", 0) > 0  # A's excess refused ...
    assert a["retry_after"] == ["1"]  # ... telling it when to come back
    assert a["served"] > 0  # and A keeps what the pool can spare
