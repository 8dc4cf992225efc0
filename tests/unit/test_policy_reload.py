"""Policy hot reload against the real app (real Redis, the engine's twin): a changed policy
file is validated, then applied to new requests or rejected with the running policy kept;
requests in flight finish; what the gateway knows about replicas survives a reload."""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from engine.supervisor import free_port
from gateway.app import create_app
from gateway.cli import main as gateway_cli
from gateway.fleet.discovery import LookupFailed
from gateway.policy import PolicyError, parse_policy
from gateway.policy.reloadable import load_policy_file, needs_restart
from gateway.reload import PolicyReloader
from gateway.runtime import Runtime, current
from gateway.state.store import StateStore
from tests.conftest import ROOT
from tests.fakes import Call, FakeUpstream, Scripted
from tests.policies import with_redis

COMPLETION = b'{"id":"c1","object":"chat.completion","choices":[]}'
POOLS = """\
pools:
  chat:
    served_model: served-chat
    replicas: [{url: "http://a.test:1"}, {url: "http://a2.test:1"}]
  other:
    served_model: served-other
    replicas: [{url: "http://b.test:1"}]
"""
ONE_ALIAS = "models:\n  tiny: {pool: chat}\n"


def policy_text(redis_url: str, body: str = POOLS + ONE_ALIAS, *, server: str = "") -> str:
    return with_redis(f"version: 1\nserver: {{reload_interval_s: 0{server}}}\n{body}", redis_url)


def chat(model: str, content: str = "hi") -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}]}


def ok(call: Call) -> Scripted:
    return Scripted(body=COMPLETION)


class Gateway:
    """A real app serving the policy file at `path`, its engine twin, its reloader."""

    def __init__(self, path: Path, script: Callable[[Call], Scripted] = ok, **kwargs: Any):
        policy, source = load_policy_file(path)
        self.path = path
        self.fake = FakeUpstream(script)
        app = create_app(
            policy,
            upstream=self.fake,
            store=StateStore(policy.state),
            policy_file=source,
            **kwargs,
        )
        self.client = TestClient(app)

    def __enter__(self) -> Gateway:
        self.client.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.__exit__(*exc)

    @property
    def reloader(self) -> PolicyReloader:
        reloader: PolicyReloader = self.client.app.state.reloader  # type: ignore[attr-defined]
        return reloader

    @property
    def runtime(self) -> Runtime:
        return current(self.client.app.state)  # type: ignore[attr-defined]

    def write(self, text: str) -> None:
        self.path.write_text(text, encoding="utf-8")

    def reload(self, *, force: bool = False) -> str | None:
        """One check of the file, on the app's event loop, as the watcher makes it."""
        outcome: str | None = self.client.portal.call(lambda: self.reloader.check(force=force))  # type: ignore[union-attr]
        return outcome

    def models(self) -> list[str]:
        return [m["id"] for m in self.client.get("/v1/models").json()["data"]]

    def metric(self, name: str, **labels: str) -> float | None:
        text = self.client.get("/metrics").text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    return float(sample.value)
        return None

    def reloads(self, outcome: str) -> float | None:
        return self.metric("gateway_policy_reloads_total", outcome=outcome)


@pytest.fixture
def policy_path(tmp_path: Path) -> Path:
    return tmp_path / "policy.yaml"


@pytest.fixture
def gateway(policy_path: Path, redis_url: str) -> Iterator[Gateway]:
    policy_path.write_text(policy_text(redis_url))
    with Gateway(policy_path) as opened:
        yield opened


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_new_alias_and_moved_pool_serve_new_requests(gateway: Gateway, redis_url: str) -> None:
    assert gateway.models() == ["tiny"]
    assert gateway.metric("gateway_policy_info", sha256=sha256_of(gateway.path)) == 1
    models = "models:\n  tiny: {pool: other}\n  big: {pool: chat, description: new}\n"
    gateway.write(policy_text(redis_url, POOLS + models))

    assert gateway.reload() == "applied"

    assert gateway.models() == ["big", "tiny"]
    assert gateway.client.post("/v1/chat/completions", json=chat("big")).status_code == 200
    assert gateway.client.post("/v1/chat/completions", json=chat("tiny")).status_code == 200
    first, second = gateway.fake.calls
    assert first.url.startswith("http://a") and orjson.loads(first.body)["model"] == "served-chat"
    assert second.url.startswith("http://b.test") and orjson.loads(second.body)["model"] == (
        "served-other"
    )
    assert gateway.reloads("applied") == 1
    assert gateway.metric("gateway_policy_info", sha256=sha256_of(gateway.path)) == 1
    assert gateway.client.get("/readyz").json()["models"]["tiny"]["pool"] == "other"
    assert gateway.reload() is None  # the same content again: nothing to do


def test_unchanged_parts_keep_their_state_and_a_routing_change_takes_effect(
    gateway: Gateway, redis_url: str
) -> None:
    # A system prompt of several prefix blocks, sent twice: cache-aware routing sends the
    # second to the replica that holds its prefix.
    long_chat = {
        "model": "tiny",
        "messages": [
            {"role": "system", "content": "rules " * 250},
            {"role": "user", "content": "x"},
        ],
    }

    def replicas_of_two_requests() -> list[str]:
        return [
            gateway.client.post("/v1/chat/completions", json=long_chat).headers["x-gateway-replica"]
            for _ in range(2)
        ]

    first, second = replicas_of_two_requests()
    assert first == second
    before = gateway.runtime
    down = before.fleet.pools["chat"].replicas[1]
    down.mark_down("test: refused")
    gateway.write(policy_text(redis_url, POOLS + ONE_ALIAS + "health: {retry_after_s: 3}\n"))

    assert gateway.reload() == "applied"

    after = gateway.runtime
    assert after is not before
    assert after.fleet.pools["chat"].replicas[1] is down  # same object: health kept
    assert not down.healthy
    assert after.breakers is before.breakers  # resilience.breaker unchanged
    assert after.router is before.router  # routing unchanged: the prefix index is kept
    assert replicas_of_two_requests() == [first, first]

    down.mark_ok()
    # Without the prefix and session costs, recent load alone decides: the second
    # identical request goes to the other replica.
    routing = "routing: {weights: {prefix: 0, session: 0}}\n"
    gateway.write(policy_text(redis_url, POOLS + ONE_ALIAS + routing))

    assert gateway.reload() == "applied"

    assert gateway.runtime.router is not after.router
    first, second = replicas_of_two_requests()
    assert first != second


def test_invalid_policies_are_rejected_and_the_running_one_keeps_serving(
    gateway: Gateway, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    serving = sha256_of(gateway.path)
    gateway.write("models: [\n")
    with caplog.at_level(logging.WARNING, logger="gateway.reload"):
        assert gateway.reload() == "invalid"
    assert "not valid YAML" in caplog.text
    assert gateway.reload() is None  # judged once, not again on every poll
    assert gateway.reloads("invalid") == 1

    bad = POOLS.replace('    replicas: [{url: "http://b.test:1"}]', "    replicaz: []")
    gateway.write(policy_text(redis_url, bad + ONE_ALIAS + "  big: {pool: chat}\n"))
    with pytest.raises(PolicyError) as rejected:
        load_policy_file(gateway.path)  # what `gateway policy check` prints
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gateway.reload"):
        assert gateway.reload() == "invalid"
    assert str(rejected.value) in caplog.text
    assert "pools.other.replicaz: unknown key" in caplog.text
    assert "running policy keeps serving" in caplog.text

    assert gateway.reloads("invalid") == 2
    assert gateway.reloads("applied") == 0
    assert gateway.models() == ["tiny"]
    assert gateway.client.post("/v1/chat/completions", json=chat("tiny")).status_code == 200
    assert gateway.metric("gateway_policy_info", sha256=serving) == 1
    # SIGHUP (force) judges rejected content again.
    assert gateway.reload(force=True) == "invalid"


def test_a_policy_that_cannot_be_built_is_rejected(gateway: Gateway, redis_url: str) -> None:
    trimming = "trimming: {enabled: true, tokenizer: /nonexistent/tokenizer.json}\n"
    gateway.write(policy_text(redis_url, POOLS + ONE_ALIAS + "  big: {pool: chat}\n" + trimming))

    assert gateway.reload() == "invalid"

    assert gateway.models() == ["tiny"]
    assert gateway.client.post("/v1/chat/completions", json=chat("tiny")).status_code == 200


def test_restart_only_change_is_not_applied(
    gateway: Gateway, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    text = policy_text(redis_url, POOLS + ONE_ALIAS + "  big: {pool: chat}\n", server=", port: 9")
    gateway.write(text.replace("state: {", "state: {max_connections: 7, "))
    with caplog.at_level(logging.WARNING, logger="gateway.reload"):
        assert gateway.reload() == "needs_restart"

    assert "needs a restart: server.port, state.max_connections" in caplog.text
    assert gateway.reloads("needs_restart") == 1
    assert gateway.models() == ["tiny"]  # nothing of it applied, the new alias neither


def test_restart_only_fields_are_named_down_to_the_leaf(redis_url: str) -> None:
    running = parse_policy(policy_text(redis_url))
    candidate = parse_policy(
        policy_text(redis_url, POOLS + ONE_ALIAS + "telemetry: {traces: {sample_ratio: 1}}\n")
        + "limits: {max_body_bytes: 10}\nauth: {keys_file: /k}\n"
    )
    assert needs_restart(running, candidate) == [
        "limits.max_body_bytes",
        "auth.keys_file",
        "telemetry.traces.sample_ratio",
    ]
    reloadable = parse_policy(
        policy_text(redis_url, POOLS + ONE_ALIAS, server=", reload_interval_s: 1")
        + "timeouts: {total_s: 5}\nhealth: {interval_s: 9}\nsessions: {ttl_s: 600}\n"
    )
    assert needs_restart(running, reloadable) == []


@pytest.mark.parametrize("stream", [True, False])
def test_requests_in_flight_during_a_reload_complete(
    policy_path: Path, redis_url: str, stream: bool
) -> None:
    events = [b'data: {"n":%d}\n\n' % n for n in range(5)] + [b"data: [DONE]\n\n"]

    def slow(call: Call) -> Scripted:
        if not call.url.startswith("http://a"):
            return Scripted(body=COMPLETION)
        if stream:
            return Scripted(chunks=events, chunk_delay_s=0.4, content_type="text/event-stream")
        # Longer than a reload takes: it stops the old runtime, whose sharing follower
        # notices a stop within its 500 ms XREAD block (gateway/sharing/service.py).
        return Scripted(body=COMPLETION, post_delay_s=2.0)

    policy_path.write_text(policy_text(redis_url))
    with Gateway(policy_path, slow) as gateway, ThreadPoolExecutor(1) as pool:
        old_replicas = list(gateway.runtime.fleet.pools["chat"].replicas)
        running = pool.submit(
            gateway.client.post, "/v1/chat/completions", json={**chat("tiny"), "stream": stream}
        )
        _wait_for(lambda: len(gateway.fake.calls) == 1)
        # The pool the request is on leaves the policy while the request runs.
        moved = POOLS.split("  other:")[0].replace("chat:", "gone:") + "  other:"
        moved += POOLS.split("  other:")[1]
        gateway.write(policy_text(redis_url, moved + "models:\n  tiny: {pool: other}\n"))
        assert gateway.reload() == "applied"
        assert not running.done()
        response = running.result(timeout=10)

        assert response.status_code == 200
        assert response.content == (b"".join(events) if stream else COMPLETION)
        assert response.headers["x-gateway-replica"].startswith("chat/")
        assert all(r.inflight == 0 for r in old_replicas)  # its slot went back
        after = gateway.client.post("/v1/chat/completions", json=chat("tiny"))
        assert after.headers["x-gateway-replica"].startswith("other/")


def test_no_request_fails_across_repeated_reloads(gateway: Gateway, redis_url: str) -> None:
    versions = [
        policy_text(redis_url, POOLS + "models:\n  tiny: {pool: other}\n"),
        policy_text(redis_url, POOLS + ONE_ALIAS + "routing: {strategy: round_robin}\n"),
        policy_text(redis_url, POOLS + ONE_ALIAS),
    ]
    statuses: list[int] = []
    done = threading.Event()

    def traffic() -> None:
        while not done.is_set():
            reply = gateway.client.post("/v1/chat/completions", json=chat("tiny"))
            statuses.append(reply.status_code)

    with ThreadPoolExecutor(2) as pool:
        senders = [pool.submit(traffic) for _ in range(2)]
        for round_ in range(6):
            gateway.write(versions[round_ % len(versions)])
            assert gateway.reload() == "applied"
        done.set()
        for sender in senders:
            sender.result(timeout=10)
    assert statuses
    assert set(statuses) == {200}


def test_discovered_replicas_survive_a_reload_when_dns_fails(
    policy_path: Path, redis_url: str
) -> None:
    class FailingLater:
        def __init__(self) -> None:
            self.failing = False

        async def resolve(self, host: str, port: int) -> list[str]:
            if self.failing:
                raise LookupFailed(f"{host}: timed out")
            return ["10.0.0.7"]

    discover = "  dns:\n    served_model: d\n    discover: {dns: engines.test, port: 8000}\n"
    policy_path.write_text(policy_text(redis_url, POOLS + discover + ONE_ALIAS))
    resolver = FailingLater()
    with Gateway(policy_path, resolver=resolver) as gateway:
        found = gateway.runtime.fleet.pools["dns"].replicas
        assert [r.url for r in found] == ["http://10.0.0.7:8000"]
        resolver.failing = True
        gateway.write(policy_text(redis_url, POOLS + discover + "models:\n  tiny: {pool: dns}\n"))

        assert gateway.reload() == "applied"

        assert gateway.runtime.fleet.pools["dns"].replicas == found  # the same objects
        reply = gateway.client.post("/v1/chat/completions", json=chat("tiny"))
        assert reply.status_code == 200
        assert gateway.fake.calls[-1].url.startswith("http://10.0.0.7:8000/")


def test_polling_applies_a_configmap_update(tmp_path: Path, redis_url: str) -> None:
    """The kubelet's layout: policy.yaml -> ..data/policy.yaml, ..data -> a timestamped
    directory; an update writes a new directory and swaps ..data. Relative paths in the
    policy (state.embedded_dir by default) stay the same across the swap."""
    mount = tmp_path / "etc-gateway"
    mount.mkdir()

    def publish(version: str, text: str) -> None:
        directory = mount / f"..2026_11_30_{version}"
        directory.mkdir()
        (directory / "policy.yaml").write_text(text)
        link = mount / "..data_tmp"
        link.symlink_to(directory.name)
        os.replace(link, mount / "..data")  # atomic, as the kubelet does

    fast = ", reload_interval_s: 0.05"
    publish("1", policy_text(redis_url, server=fast))
    (mount / "policy.yaml").symlink_to("..data/policy.yaml")
    with Gateway(mount / "policy.yaml") as gateway:
        publish(
            "2", policy_text(redis_url, POOLS + ONE_ALIAS + "  big: {pool: chat}\n", server=fast)
        )
        _wait_for(lambda: "big" in gateway.models())
        assert gateway.reloads("applied") == 1
        assert gateway.reloads("needs_restart") == 0


def test_sighup_handler_checks_at_once_without_polling(gateway: Gateway, redis_url: str) -> None:
    assert gateway.runtime.policy.server.reload_interval_s == 0
    gateway.write(policy_text(redis_url, POOLS + ONE_ALIAS + "  big: {pool: chat}\n"))
    time.sleep(0.2)
    assert gateway.models() == ["tiny"]  # no polling

    gateway.client.portal.call(gateway.reloader.on_sighup)  # type: ignore[union-attr]

    _wait_for(lambda: "big" in gateway.models())


def test_policy_check_against_the_running_policy_names_restart_fields(
    tmp_path: Path, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    running, fine, restart = (tmp_path / f"{n}.yaml" for n in ("running", "fine", "restart"))
    running.write_text(policy_text(redis_url))
    fine.write_text(policy_text(redis_url, POOLS + ONE_ALIAS + "  big: {pool: chat}\n"))
    restart.write_text(policy_text(redis_url, server=", port: 9"))

    assert gateway_cli(["policy", "check", str(fine), "--against", str(running)]) == 0
    assert gateway_cli(["policy", "check", str(restart), "--against", str(running)]) == 1
    out = capsys.readouterr().out
    assert f"{fine}: ok (2 models, 2 pools)" in out
    assert f"{restart}: valid (1 models, 2 pools), but needs a restart: server.port" in out


def test_gateway_serve_reloads_on_sighup(tmp_path: Path, redis_url: str) -> None:
    """The real command: `gateway serve` reads the file, and SIGHUP applies a change."""
    port = free_port()
    path = tmp_path / "policy.yaml"
    dead = POOLS.replace("a.test:1", "127.0.0.1:9").replace("a2.test:1", "127.0.0.1:9")
    dead = dead.replace("b.test:1", "127.0.0.1:9")
    server = f", host: 127.0.0.1, port: {port}"
    path.write_text(policy_text(redis_url, dead + ONE_ALIAS, server=server))
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve", "--policy", str(path), "--drain-s", "1"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_for(lambda: _get(f"{base}/healthz") is not None, timeout_s=30)
        path.write_text(
            policy_text(redis_url, dead + ONE_ALIAS + "  big: {pool: chat}\n", server=server)
        )
        process.send_signal(signal.SIGHUP)
        _wait_for(lambda: b'"big"' in (_get(f"{base}/v1/models") or b""), timeout_s=10)
        metrics = _get(f"{base}/metrics") or b""
        assert b'gateway_policy_reloads_total{outcome="applied"} 1.0' in metrics
    finally:
        process.terminate()
        process.wait(timeout=15)


def _get(url: str) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            body: bytes = response.read()
            return body
    except OSError:
        return None


def _wait_for(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)
