"""The hot-path benchmark's probes name steps that exist.

`make bench-hot-path` runs outside `make test` and patches the request path's steps by
name; a step renamed or moved would otherwise make it fail (or, worse, time nothing)
long after the change."""

from __future__ import annotations

from tests.bench import hot_path


def test_every_probe_resolves_to_a_callable_step() -> None:
    for probe in hot_path.PROBES:
        owner, name, step = hot_path.resolve(probe)
        assert getattr(owner, name) is step


def test_each_probe_sits_under_a_probe_listed_before_it() -> None:
    seen = {hot_path.WHOLE}
    for probe in hot_path.PROBES:
        assert probe.parent in seen, probe
        seen.add(probe.label)
    assert len(seen) == len(hot_path.PROBES) + 1  # labels are unique


def test_own_times_add_up_to_the_whole_and_the_engine_is_not_the_gateways() -> None:
    timings = hot_path.Timings()
    inclusive = {hot_path.WHOLE: 1000, "edge (request id, record)": 990,
                 "API call (body read, context)": 900, "pipeline (its glue)": 800,
                 "dispatch": 500, hot_path.ENGINE: 400}  # fmt: skip
    for label, us in inclusive.items():
        timings.add(label, us * 1000 * 2)  # two requests
    rows = hot_path.steps(timings, requests=2)
    assert sum(row["own_us"] for row in rows) == 1000
    own = {row["step"]: row["own_us"] for row in rows}
    assert own["dispatch"] == 100 and own[hot_path.ENGINE] == 400
    assert hot_path.gateway_own_us(rows) == 600


def test_probes_are_put_back() -> None:
    before = [hot_path.resolve(p)[2] for p in hot_path.PROBES]
    with hot_path.probed(hot_path.Timings()):
        assert [hot_path.resolve(p)[2] for p in hot_path.PROBES] != before
    assert [hot_path.resolve(p)[2] for p in hot_path.PROBES] == before
