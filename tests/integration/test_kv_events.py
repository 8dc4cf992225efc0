"""The engines' KV-cache events from a real vLLM replica (cpu-tiny, which publishes them):
the subscriber sees what a request stored, a prefix-cache reset makes the router's index
forget the replica, and an eviction reaches the conversation whose blocks it took. The
replica's cache is 513 blocks of 32 tokens (the least vLLM accepts for the profile's
context), so that a few long prompts evict.

vLLM publishes the events of a scheduler step after the step, so an idle engine sends the
`AllBlocksCleared` of a reset with its next step: the test sends one request after the
reset and holds the index to forgetting within a second of that step.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from engine.cli import resolve_model
from engine.lifeline import Lifeline
from engine.profiles import kv_events_endpoints, load_profile
from engine.state import ReplicaRecord
from engine.supervisor import Launch, down, up
from gateway.fleet.engine_chains import EngineChains
from gateway.fleet.kv_events import KvEventSubscriber
from gateway.fleet.replicas import Replica
from gateway.routing.index import PrefixIndex
from gateway.telemetry.metrics import GatewayMetrics
from tests.integration.conftest import engine_paths
from tests.unit.fleet.test_kv_events import until

pytestmark = pytest.mark.engine

PROMPT = "Tell me about the prefix cache of a language model engine. " * 8  # several blocks
ENGINE_BLOCKS = 513


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@pytest.fixture(scope="module")
def dev_engine(
    tmp_path_factory: pytest.TempPathFactory, engine_lifeline: Lifeline
) -> Iterator[ReplicaRecord]:
    """One cpu-tiny replica in vLLM's dev mode, the only one serving POST /reset_prefix_cache."""
    paths = engine_paths(tmp_path_factory.mktemp("kv-events-engine"))
    if not paths.python.exists():
        pytest.fail(f"no engine environment at {paths.python}: run `make engine-env`")
    chat = load_profile("cpu-tiny")
    small_cache = (*chat.extra_args, "--num-gpu-blocks-override", str(ENGINE_BLOCKS))
    dev = chat.model_copy(
        update={"env": {**chat.env, "VLLM_SERVER_DEV_MODE": "1"}, "extra_args": small_cache}
    )
    (record,) = up([Launch(dev, 1, resolve_model(chat, None, paths))], paths=paths, say=_say,
                   timeout_s=900, lifeline=engine_lifeline)  # fmt: skip
    try:
        yield record
    finally:
        down(paths, say=_say, lifeline=engine_lifeline)


async def _complete(client: httpx.AsyncClient, url: str, text: str) -> None:
    await _chat(client, url, [{"role": "user", "content": text}], max_tokens=4)


async def test_a_real_engines_events_reach_the_router(dev_engine: ReplicaRecord) -> None:
    events, replay = kv_events_endpoints("127.0.0.1", dev_engine.port)
    replica = Replica("tiny-chat", dev_engine.url, "tiny", kv_events=events, kv_replay=replay)
    index = PrefixIndex(100)
    metrics = GatewayMetrics()
    subscriber = KvEventSubscriber(lambda: [replica], lambda r, _: index.forget(r), metrics)

    def sample(name: str, **labels: str) -> float:
        found = metrics.registry.get_sample_value(name, {"replica": replica.id, **labels})
        return found or 0.0

    await subscriber.start()
    try:
        await until(lambda: sample("gateway_engine_kv_subscriber_up") == 1, within_s=10)
        async with httpx.AsyncClient(timeout=120) as client:
            await _complete(client, dev_engine.url, PROMPT)
            await until(lambda: sample("gateway_engine_kv_events_total", type="BlockStored") > 0)
            view = subscriber.views[replica.id]
            assert view.blocks_held > 0
            assert sample("gateway_engine_kv_malformed_frames_total") == 0

            index.record(replica.id, [1, 2, 3])
            (await client.post(f"{dev_engine.url}/reset_prefix_cache")).raise_for_status()
            await _complete(client, dev_engine.url, "Another question entirely.")
            stepped = time.monotonic()
            await until(lambda: index.match(replica.id, [1, 2, 3]) == 0, within_s=1.0)
            _say(f"kv events: reset forgotten {time.monotonic() - stepped:.3f}s after the step")
            assert sample("gateway_engine_kv_forgotten_total", reason="cleared") == 1
            assert sample("gateway_engine_kv_events_total", type="AllBlocksCleared") == 1
    finally:
        await subscriber.stop()


async def _chat(
    client: httpx.AsyncClient, url: str, messages: list[dict[str, str]], max_tokens: int = 1
) -> int:
    """The prompt tokens of one answer."""
    body = {"model": "tiny", "messages": messages, "max_tokens": max_tokens}
    response = await client.post(f"{url}/v1/chat/completions", json=body)
    response.raise_for_status()
    return int(response.json()["usage"]["prompt_tokens"])


async def _stored_past(subscriber: KvEventSubscriber, replica_id: str, blocks: int) -> None:
    """Until the replica's events say it holds more than `blocks` blocks."""
    await until(lambda: subscriber.views[replica_id].blocks_held > blocks)


def _text(seed: int, words: int) -> str:
    return " ".join(f"w{seed}x{i % 997}" for i in range(words))


async def test_an_eviction_reaches_the_conversation_it_cut(dev_engine: ReplicaRecord) -> None:
    events, replay = kv_events_endpoints("127.0.0.1", dev_engine.port)
    replica = Replica("tiny-chat", dev_engine.url, "tiny", kv_events=events, kv_replay=replay)
    chains, metrics = EngineChains(), GatewayMetrics()
    subscriber = KvEventSubscriber(lambda: [replica], lambda r, _: None, metrics, chains)
    conversation = ("default", "conv-a", replica.id)
    up = {"replica": replica.id}
    await subscriber.start()
    try:
        await until(
            lambda: metrics.registry.get_sample_value("gateway_engine_kv_subscriber_up", up) == 1,
            within_s=10,
        )
        async with httpx.AsyncClient(timeout=300) as client:
            history = [{"role": "user", "content": _text(1, 600)}]
            for answer in ("first answer", "second answer"):  # two turns, the second extends
                sent, stored = chains.now(), subscriber.views[replica.id].blocks_held
                prompt = await _chat(client, dev_engine.url, history)
                # This turn's own stores (the second turn's too, not the first's again) ...
                await _stored_past(subscriber, replica.id, stored)
                await asyncio.sleep(0.5)  # ... and those of its last step, published after it
                chains.answered(conversation, sent, prompt, 1)
                history += [{"role": "assistant", "content": answer},
                            {"role": "user", "content": _text(2, 50)}]  # fmt: skip
            await until(lambda: (held := chains.held(conversation)) is not None and held.whole)
            before = chains.held(conversation)
            assert before is not None and before.tokens == prompt // 32 * 32
            for seed in range(10, 14):  # other traffic, more than the cache holds
                await _chat(
                    client, dev_engine.url, [{"role": "user", "content": _text(seed, 1800)}]
                )
            await until(lambda: (held := chains.held(conversation)) is not None and not held.whole)
            after = chains.held(conversation)
            assert after is not None and after.tokens < before.tokens
            _say(f"kv events: conversation held {before.tokens} tokens, {after.tokens} after")
    finally:
        await subscriber.stop()
