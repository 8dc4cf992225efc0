"""The gateway against a real Redis Cluster: three `redis-server --cluster-enabled yes`
nodes on loopback, joined by `redis-cli --cluster create`, and the real app (policy
`state.cluster: true`) in front of the engine's twin: what is proven here is the Redis
side. Sessions, delta mode, the Responses API, usage, tier memory, prefix fingerprints and
the response cache all work; every key of one session lives in one hash slot; keys are
spread over every node; the usage ledger keeps exactly the counts a dead node missed.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
from redis.exceptions import RedisError
from starlette.testclient import TestClient

from engine.supervisor import free_port
from gateway.app import create_app
from gateway.policy import parse_policy
from gateway.policy.sessions import StateSpec
from gateway.sessions.ids import SessionRef
from gateway.state.keys import USAGE_TENANTS_KEY, session_key, usage_day_key
from gateway.state.redis_client import GatedRedisCluster
from gateway.state.store import StateStore
from gateway.telemetry.usage import RedisUsageLedger, UsageBook, UsageNotWritten
from tests.fakes import Call, FakeUpstream, Scripted
from tests.lifetimes import suite_reaper

REDIS_SERVER = shutil.which("redis-server")
REDIS_CLI = shutil.which("redis-cli")


@dataclass
class LocalCluster:
    """Three primaries, no replicas, in a temporary directory; nothing persisted."""

    directory: Path
    ports: list[int]
    full_coverage: bool = True
    bus_ports: dict[int, int] = field(default_factory=dict)
    processes: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    # One client per node, closed with it: dropped clients leave sockets for the garbage
    # collector, whose ResourceWarnings then fail whichever test happens to be running.
    clients: dict[int, redis.Redis] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    def node(self, port: int) -> redis.Redis:
        client = self.clients.get(port)
        if client is None:
            client = self.clients[port] = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)
        return client

    def start_node(self, port: int) -> None:
        assert REDIS_SERVER is not None
        home = self.directory / str(port)
        home.mkdir(exist_ok=True)
        # The bus port is chosen too: the default (port + 10000) may not exist.
        bus = self.bus_ports.setdefault(port, free_port())
        args = [
            REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1",
            "--cluster-enabled", "yes", "--cluster-port", str(bus),
            "--cluster-config-file", str(home / "nodes.conf"),
            "--cluster-require-full-coverage", "yes" if self.full_coverage else "no",
            "--save", "", "--appendonly", "no", "--dir", str(home),
            "--logfile", str(home / "redis.log"),
        ]  # fmt: skip
        # Its own process group, held by the suite's reaper: gone with pytest, however it ends.
        self.processes[port] = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, start_new_session=True
        )
        suite_reaper().hold(self.processes[port].pid)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if self.node(port).ping():
                    return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server on {port} did not start: see {home / 'redis.log'}")

    def stop_node(self, port: int) -> None:
        client = self.clients.pop(port, None)
        if client is not None:
            client.close()
        process = self.processes.pop(port)
        process.terminate()
        process.wait(timeout=10)
        suite_reaper().release(process.pid)

    def create(self) -> None:
        for port in self.ports:
            self.start_node(port)
        assert REDIS_CLI is not None
        subprocess.run(
            [REDIS_CLI, "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
             "--cluster-replicas", "0", "--cluster-yes"],
            check=True, stdout=subprocess.DEVNULL, timeout=60,
        )  # fmt: skip
        self.wait_ok()

    def wait_ok(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            states = [self.node(p).cluster("INFO")["cluster_state"] for p in self.processes]
            if all(state == "ok" for state in states):
                return
            time.sleep(0.1)
        raise RuntimeError("the cluster did not reach cluster_state:ok")

    def stop(self) -> None:
        for port in list(self.processes):
            self.stop_node(port)

    def keys(self) -> dict[int, list[str]]:
        """Every gateway key, by the port of the node that holds it (tests only: KEYS)."""
        return {p: [_text(k) for k in self.node(p).keys("agw:*")] for p in self.ports}

    def slot(self, key: str) -> int:
        return int(self.node(self.ports[0]).cluster("KEYSLOT", key))

    def owner(self, key: str) -> int:
        """The port of the node serving the key's slot."""
        slot = self.slot(key)
        for start, end, primary, *_ in self.node(self.ports[0]).cluster("SLOTS"):
            if start <= slot <= end:
                return int(primary[1])
        raise AssertionError(f"slot {slot} has no node")


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _start_cluster(directory: Path, *, full_coverage: bool = True) -> LocalCluster:
    if REDIS_SERVER is None or REDIS_CLI is None:
        pytest.fail("redis-server and redis-cli (7.0 or later) must be on PATH")
    cluster = LocalCluster(directory, [free_port() for _ in range(3)], full_coverage)
    try:
        cluster.create()
    except BaseException:
        cluster.stop()
        raise
    return cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    started = _start_cluster(tmp_path_factory.mktemp("redis-cluster"))
    yield started
    started.stop()


POLICY = """\
version: 1
state: {{redis_url: "{url}", cluster: true, max_connections: 32}}
resilience:
  retries: {{attempts: 1, backoff_base_s: 0.001, backoff_max_s: 0.01}}
  response_cache: {{enabled: true, ttl_s: 60}}
pools:
  large:
    served_model: served-large
    tier: large
    replicas: [{{url: "http://large.test:1"}}]
    price: {{input: 3.0, cached_input: 0.3, output: 15.0}}
  small:
    served_model: served-small
    tier: small
    replicas: [{{url: "http://small.test:1"}}]
    price: {{input: 0.1, cached_input: 0.01, output: 0.4}}
  spare:
    served_model: served-spare
    replicas: [{{url: "http://spare.test:1"}}]
models:
  tiny: {{pool: large}}
  metered: {{pool: large}}
  cached: {{pool: spare}}
  auto: {{tiering: auto}}
tiering:
  auto:
    tiers: {{small: small, large: large}}
    learned: null
    default_tier: small
"""


class Engine:
    """The engine's twin: answers `seen N` (N: the messages it was sent); `spare` can be
    made unreachable."""

    def __init__(self) -> None:
        self.spare_down = False

    def __call__(self, call: Call) -> Scripted:
        if self.spare_down and "spare.test" in call.url:
            return Scripted(connect_refused=True)
        body = orjson.loads(call.body)
        count = len(body["messages"])
        usage = {
            "prompt_tokens": 10 * count,
            "completion_tokens": 2,
            "total_tokens": 10 * count + 2,
        }
        if body.get("stream"):
            chunks = [
                b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":"seen %d"},'
                b'"finish_reason":"stop"}]}\n\n' % count,
                b'data: {"choices":[],"usage":' + orjson.dumps(usage) + b"}\n\n",
                b"data: [DONE]\n\n",
            ]
            return Scripted(chunks=chunks, content_type="text/event-stream")
        completion = {
            "id": "c", "object": "chat.completion", "created": 1, "model": "served",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": f"seen {count}"}}],
            "usage": usage,
        }  # fmt: skip
        return Scripted(body=orjson.dumps(completion))


@dataclass
class App:
    client: TestClient
    fake: FakeUpstream
    engine: Engine

    def chat(self, messages: list[Any], session: str | None = None, **extra: Any) -> Any:
        headers = {"X-Session-Id": session} if session else {}
        headers.update(extra.pop("headers", {}))
        body = {"model": extra.pop("model", "tiny"), "messages": messages, **extra}
        response = self.client.post("/v1/chat/completions", json=body, headers=headers)
        assert response.status_code == 200, response.text
        return response

    def sent(self) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = orjson.loads(self.fake.calls[-1].body)["messages"]
        return messages


@pytest.fixture(scope="module")
def app(cluster: LocalCluster) -> Iterator[App]:
    policy = parse_policy(POLICY.format(url=cluster.url))
    engine = Engine()
    fake = FakeUpstream(engine)
    client = TestClient(
        create_app(policy, upstream=fake, store=StateStore(policy.state), health_checks=False)
    )
    with client:
        yield App(client, fake, engine)


SYSTEM = {"role": "system", "content": "You book flights."}
TOOLS = [{"type": "function", "function": {"name": "find_flight", "parameters": {}}}]


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def new_session() -> str:
    return f"s-{uuid.uuid4().hex}"


def test_the_gateway_is_ready_on_the_cluster(app: App) -> None:
    assert app.client.get("/readyz").status_code == 200


def test_turns_are_checkpointed_forked_and_deleted(app: App) -> None:
    session = new_session()
    conversation: list[Any] = [SYSTEM, user("a")]
    for turn in range(1, 4):
        reply = app.chat(conversation, session, tools=TOOLS)
        assert reply.headers["x-gateway-session-turn"] == str(turn)
        conversation += [reply.json()["choices"][0]["message"], user(f"next {turn}")]
    listing = app.client.get(f"/v1/sessions/{session}/checkpoints").json()
    assert [c["turn"] for c in listing["data"]] == [1, 2, 3]
    second = app.client.get(f"/v1/sessions/{session}/checkpoints/2").json()
    assert second["engine_request"]["tools"] == TOOLS  # the blob, read back from its hash
    # A fork copies into another session, whose keys hash to another slot.
    forked = app.client.post(
        f"/v1/sessions/{session}/fork", json={"turn": 2, "session_id": f"{session}-copy"}
    )
    assert forked.status_code == 201, forked.text
    copy = app.client.get(f"/v1/sessions/{session}-copy/checkpoints").json()
    assert [c["turn"] for c in copy["data"]] == [1, 2]
    assert app.client.delete(f"/v1/sessions/{session}-copy").status_code == 200
    assert app.client.get(f"/v1/sessions/{session}-copy/checkpoints").status_code == 404
    assert len(app.client.get(f"/v1/sessions/{session}/checkpoints").json()["data"]) == 3


def test_delta_mode_sends_the_stored_conversation(app: App) -> None:
    session = new_session()
    app.chat([SYSTEM, user("first")], session)
    app.chat([user("second")], session, headers={"X-Context-Mode": "delta"})
    assert app.sent() == [
        SYSTEM,
        user("first"),
        {"role": "assistant", "content": "seen 2"},
        user("second"),
    ]


def test_responses_continue_from_previous_response_id(app: App) -> None:
    first = app.client.post("/v1/responses", json={"model": "tiny", "input": "hello"})
    assert first.status_code == 200, first.text
    second = app.client.post(
        "/v1/responses",
        json={"model": "tiny", "input": "again", "previous_response_id": first.json()["id"]},
    )
    assert second.status_code == 200, second.text
    assert app.sent() == [
        user("hello"),
        {"role": "assistant", "content": "seen 1"},
        user("again"),
    ]
    fetched = app.client.get(f"/v1/responses/{second.json()['id']}")
    assert fetched.json()["id"] == second.json()["id"]
    assert app.client.delete(f"/v1/responses/{first.json()['id']}").status_code == 200
    assert app.client.get(f"/v1/responses/{first.json()['id']}").status_code == 404


def test_usage_is_kept_per_session_and_per_day(app: App) -> None:
    session = new_session()
    app.chat([user("one")], session, model="metered")
    app.chat([user("one"), {"role": "assistant", "content": "seen 1"}, user("two")], session,
             model="metered")  # fmt: skip
    app.chat([user("no session")], model="metered")
    per_session = app.client.get("/v1/usage", params={"session": session}).json()
    assert (per_session["requests"], per_session["input_tokens"]) == (2, 10 + 30)
    today = dt.datetime.now(dt.UTC).date()
    days = app.client.get(
        "/v1/usage",
        params={"start": (today - dt.timedelta(days=2)).isoformat(), "end": today.isoformat()},
    ).json()
    [row] = [r for r in days["data"] if r["model"] == "metered"]
    assert (row["day"], row["requests"], row["input_tokens"]) == (today.isoformat(), 3, 50)
    assert row["cost_usd"] == pytest.approx((50 * 3.0 + 6 * 15.0) / 1e6)


def test_a_session_sticks_to_its_tier(app: App, cluster: LocalCluster) -> None:
    session = new_session()
    reply = app.chat([user("hi")], session, model="auto")
    assert reply.headers["x-gateway-tier"] == "small"
    key = session_key("default", session, "tier:auto")
    assert cluster.node(cluster.owner(key)).get(key) == b"small"


def test_a_changed_prefix_is_reported(app: App) -> None:
    session = new_session()
    first = app.chat([SYSTEM, user("a")], session, tools=TOOLS)
    more = [*TOOLS, {"type": "function", "function": {"name": "book", "parameters": {}}}]
    second = app.chat([SYSTEM, user("a"), first.json()["choices"][0]["message"], user("b")],
                      session, tools=more)  # fmt: skip
    assert "x-gateway-prefix-change" not in first.headers
    assert second.headers["x-gateway-prefix-change"] == "tools"


def test_the_response_cache_answers_when_the_engine_cannot(app: App) -> None:
    ask = [user(f"deterministic {uuid.uuid4().hex}")]
    first = app.chat(ask, model="cached", temperature=0)
    app.engine.spare_down = True
    try:
        again = app.chat(ask, model="cached", temperature=0)
    finally:
        app.engine.spare_down = False
    assert again.headers["x-gateway-fallback"] == "cache"
    assert again.content == first.content


def test_each_session_lives_in_one_slot_and_sessions_spread_over_every_node(
    app: App, cluster: LocalCluster
) -> None:
    sessions = [new_session() for _ in range(30)]
    for session in sessions:
        first = app.chat([SYSTEM, user("a")], session, model="auto", tools=TOOLS)
        app.chat([user("b")], session, model="auto", tools=TOOLS,
                 headers={"X-Context-Mode": "delta"})  # fmt: skip
        assert first.headers["x-gateway-session-turn"] == "1"
    app.client.get("/v1/usage", params={"session": sessions[0]})  # flushes the usage counts
    where = {key: port for port, keys in cluster.keys().items() for key in keys}
    for session in sessions:
        tag = "{default/" + session + "}"
        mine = {key for key in where if tag in key}
        parts = {key.split(tag + ":", 1)[1] for key in mine}
        assert parts == {"turns", "blobs", "usage", "prefix", "tier:auto"}
        assert len({where[key] for key in mine}) == 1
        assert len({cluster.slot(key) for key in mine}) == 1
    assert len({where[session_key("default", s, "turns")] for s in sessions}) == 3
    assert set(where.values()) == set(cluster.ports)


async def test_the_cluster_client_waits_for_a_free_connection(cluster: LocalCluster) -> None:
    # 2,000 commands at once over 8 connections per node: redis-py's own pool would raise
    # MaxConnectionsError past 8; the gated client queues them.
    store = StateStore(StateSpec(redis_url=cluster.url, cluster=True, max_connections=8))
    await store.open()
    try:
        assert store.redis is not None
        keys = [f"agw:test:{{{i}}}" for i in range(2_000)]
        await asyncio.gather(*(store.redis.set(key, b"x", ex=60) for key in keys))
        values = await asyncio.gather(*(store.redis.get(key) for key in keys))
        assert values == [b"x"] * len(keys)
        assert await store.ping()
    finally:
        await store.close()


async def test_commands_racing_a_disconnect_of_idle_connections_are_retried(
    cluster: LocalCluster,
) -> None:
    # After a connection error, redis-py drops a node's idle connections while other
    # commands may already hold one: 8.1 disconnects them at once (unguarded, those
    # commands failed with AttributeError ('NoneType' object has no attribute
    # 'writelines'): 27 of 8,000 here), 8.2 marks them to reconnect when next taken. The
    # race is run the way the installed redis-py reacts to an error.
    store = StateStore(StateSpec(redis_url=cluster.url, cluster=True, max_connections=8))
    await store.open()
    try:
        client = store.redis
        assert isinstance(client, GatedRedisCluster)
        await client.ping()

        async def drop_idle_connections() -> None:
            for _ in range(5):
                await asyncio.sleep(0)
                for node in client.get_nodes():
                    mark = getattr(node, "_mark_free_connections_for_reconnect_on_error", None)
                    if mark is not None:  # redis-py 8.2 and later
                        mark(redis.exceptions.ConnectionError("reset by the test"))
                    else:
                        await node.disconnect_free_connections()

        keys = [f"agw:test:race:{{{i}}}" for i in range(400)]
        for _ in range(20):
            await asyncio.gather(
                drop_idle_connections(), *(client.set(key, b"x", ex=60) for key in keys)
            )
    finally:
        await store.close()


async def test_counts_a_dead_node_missed_are_written_once_it_is_back(
    tmp_path: Path,
) -> None:
    # A cluster of its own: a node is killed. Without full coverage required, the other
    # nodes keep serving their slots meanwhile, which is what makes a write partial.
    cluster = _start_cluster(tmp_path, full_coverage=False)
    store = StateStore(StateSpec(redis_url=cluster.url, cluster=True))
    try:
        await store.open()
        assert store.redis is not None
        book = UsageBook(RedisUsageLedger(store.redis, retention_days=1, session_ttl_s=600))
        ledger_node = cluster.owner(USAGE_TENANTS_KEY)
        day = dt.date.today().isoformat()
        tenant = next(  # a tenant whose day row shares the node of the tenants set
            t
            for t in (f"t{uuid.uuid4().hex[:8]}" for _ in range(1000))
            if cluster.owner(usage_day_key(t, day)) == ledger_node
        )
        victim = next(p for p in cluster.ports if p not in (ledger_node, cluster.ports[0]))
        sessions = [SessionRef("default", f"s-{uuid.uuid4().hex}") for _ in range(30)]
        lost = {s for s in sessions if cluster.owner(s.key("usage")) == victim}
        assert lost and len(lost) < len(sessions)
        row = (day, tenant, "m", "large")
        for session in sessions:
            book.add(row, session, {"requests": 1, "input_tokens": 10})

        cluster.stop_node(victim)
        with pytest.raises(UsageNotWritten) as failed:
            await book.flush()
        assert set(failed.value.sessions) == lost
        assert not failed.value.rows  # the day row's node answered

        for session in sessions:  # traffic goes on meanwhile
            book.add(row, session, {"requests": 1, "input_tokens": 10})
        cluster.start_node(victim)
        cluster.wait_ok()
        for _ in range(100):
            try:
                await book.flush()
                break
            except RedisError:
                await asyncio.sleep(0.2)  # the client is still finding the node again
        for session in sessions:
            assert await book.session(session) == {"requests": 2, "input_tokens": 20}
        rows = await book.read(tenant, dt.date.today(), dt.date.today())
        assert rows == {row: {"requests": 60, "input_tokens": 600}}
    finally:
        await store.close()
        cluster.stop()
