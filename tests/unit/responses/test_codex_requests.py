"""Codex CLI's Responses requests, in the shape captured from `codex exec` 0.171: function
and `namespace` tools and the hosted `web_search`; `reasoning`, `include`, `store: false`,
`prompt_cache_key` and `client_metadata`. Through the real app (engine twin, real Redis)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import openai
import orjson
import pytest

from gateway.policy import parse_policy
from tests.fakes import Call, FakeUpstream, Scripted
from tests.openapi_contract import violations
from tests.unit.clients import TINY_POLICY, OpenGateways

EXEC: Any = {"type": "function", "name": "exec_command", "description": "Run a command.",
        "strict": False, "parameters": {"type": "object", "properties": {
            "cmd": {"type": "string"}}, "required": ["cmd"]}}  # fmt: skip
AGENTS = {"type": "namespace", "name": "multi_agent_v1",
          "description": "Tools for spawning and managing sub-agents.",
          "tools": [{"type": "function", "name": "spawn_agent", "strict": False,
                     "parameters": {"type": "object", "properties": {}}},
                    {"type": "function", "name": "wait_agent", "strict": False,
                     "parameters": {"type": "object", "properties": {}}}]}  # fmt: skip
SEARCH: Any = {"type": "web_search", "external_web_access": False}
SPAWN_CALL = {"id": "call_7", "type": "function",
              "function": {"name": "multi_agent_v1__spawn_agent", "arguments": "{}"}}  # fmt: skip


def codex_request(**fields: Any) -> dict[str, Any]:
    session = str(uuid.uuid4())
    request = {
        "model": "tiny", "instructions": "You are Codex.", "stream": False,
        "input": [{"type": "message", "role": "developer", "content": [
                      {"type": "input_text", "text": "<permissions>read-only</permissions>"}]},
                  {"type": "message", "role": "user", "content": [
                      {"type": "input_text", "text": "spawn a helper"}]}],
        "tools": [EXEC, AGENTS, SEARCH], "tool_choice": "auto", "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"}, "store": False,
        "include": ["reasoning.encrypted_content"], "prompt_cache_key": session,
        "client_metadata": {"session_id": session, "thread_id": session,
                            "turn_id": str(uuid.uuid4())},
    }  # fmt: skip
    return {**request, **fields}


def engine(call: Call) -> Scripted:
    """Calls the namespaced `spawn_agent` when offered it, thinking first."""
    body = orjson.loads(call.body)
    if body.get("stream"):
        deltas = [
            b'{"choices":[{"index":0,"delta":{"role":"assistant","reasoning_content":"A helper"}}]}',
            b'{"choices":[{"index":0,"delta":{"reasoning_content":" fits."}}]}',
            b'{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,'
            b'"id":"call_7","type":"function","function":{"name":"multi_agent_v1__spawn_agent",'
            b'"arguments":""}}]}}]}',
            b'{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":'
            b'{"arguments":"{}"}}]}}]}',
            b'{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}',
            b'{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}',
        ]
        chunks = [b"data: " + d + b"\n\n" for d in deltas] + [b"data: [DONE]\n\n"]
        return Scripted(chunks=chunks, content_type="text/event-stream")
    message = {"role": "assistant", "content": None, "reasoning_content": "A helper fits.",
               "tool_calls": [SPAWN_CALL]}  # fmt: skip
    completion = {
        "id": "c", "object": "chat.completion", "created": 1, "model": "served-tiny",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11},
    }  # fmt: skip
    return Scripted(body=orjson.dumps(completion))


@pytest.fixture
def gateways() -> Iterator[OpenGateways]:
    opened = OpenGateways()
    yield opened
    opened.close_all()


def open_gateway(gateways: OpenGateways, redis_url: str, extra: str = "") -> Any:
    policy = TINY_POLICY + f"state: {{redis_url: '{redis_url}'}}\n" + extra
    return gateways.open(parse_policy(policy), engine)


def sent(fake: FakeUpstream) -> dict[str, Any]:
    body: dict[str, Any] = orjson.loads(fake.calls[-1].body)
    return body


def test_namespaced_tools_are_flattened_and_hosted_ones_left_out(
    redis_url: str, gateways: OpenGateways
) -> None:
    client, fake = open_gateway(gateways, redis_url)
    answer = client.post("/v1/responses", json=codex_request())
    assert answer.status_code == 200, answer.text
    names = [tool["function"]["name"] for tool in sent(fake)["tools"]]
    assert names == ["exec_command", "multi_agent_v1__spawn_agent", "multi_agent_v1__wait_agent"]
    assert answer.headers["x-gateway-tools-dropped"] == "web_search"
    body = answer.json()
    assert violations("Response", body) == []
    reasoning, call = body["output"]
    assert reasoning["type"] == "reasoning"  # the engine's own reasoning, as a summary
    assert reasoning["summary"] == [{"type": "summary_text", "text": "A helper fits."}]
    assert (call["type"], call["namespace"], call["name"]) == (
        "function_call", "multi_agent_v1", "spawn_agent")  # fmt: skip
    # store: false keeps nothing
    assert client.get(f"/v1/responses/{body['id']}").status_code == 404


def test_a_streamed_call_of_a_namespaced_tool_names_its_namespace(
    redis_url: str, gateways: OpenGateways
) -> None:
    client, _ = open_gateway(gateways, redis_url)
    answer = client.post("/v1/responses", json=codex_request(stream=True))
    events = [
        orjson.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: ")
    ]
    for event in events:
        assert violations("ResponseStreamEvent", event) == [], event["type"]
    done = events[-1]["response"]
    reasoning, call = done["output"]
    assert reasoning["summary"] == [{"type": "summary_text", "text": "A helper fits."}]
    assert (call["namespace"], call["name"]) == ("multi_agent_v1", "spawn_agent")
    kinds = [e["type"] for e in events]
    assert kinds.count("response.reasoning_summary_text.delta") == 2
    assert kinds.index("response.reasoning_summary_text.done") < kinds.index(
        "response.function_call_arguments.done"
    )
    added = [e["item"] for e in events if e["type"] == "response.output_item.added"]
    assert [item["type"] for item in added] == ["reasoning", "function_call"]
    assert added[1]["name"] == "spawn_agent"


def test_the_history_s_namespaced_calls_reach_the_engine_by_their_joined_name(
    redis_url: str, gateways: OpenGateways
) -> None:
    client, fake = open_gateway(gateways, redis_url)
    request = codex_request()
    request["input"] += [
        {"type": "reasoning", "summary": [], "encrypted_content": None},
        {"type": "function_call", "call_id": "call_7", "namespace": "multi_agent_v1",
         "name": "spawn_agent", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_7", "output": "agent a1 started"},
    ]  # fmt: skip
    assert client.post("/v1/responses", json=request).status_code == 200
    messages = sent(fake)["messages"]
    assert messages[-2]["tool_calls"][0]["function"]["name"] == "multi_agent_v1__spawn_agent"
    assert messages[-1] == {"role": "tool", "tool_call_id": "call_7", "content": "agent a1 started"}


def test_the_engine_s_own_reasoning_comes_back_to_it_through_the_tool_loop(
    redis_url: str, gateways: OpenGateways
) -> None:
    """Reasoning items sent back (Codex keeps them, `store: false`) become the `reasoning`
    of the assistant message after them, as vLLM's own Responses API gives a reasoning
    model its thought back; only since the last user message (templates drop older ones),
    and never another provider's encrypted thought."""
    client, fake = open_gateway(gateways, redis_url)
    request = codex_request()

    def step(n: int, reasoning: Any) -> list[Any]:
        return [
            reasoning,
            {"type": "function_call", "call_id": f"call_{n}", "name": "exec_command",
             "arguments": '{"cmd": "ls"}'},
            {"type": "function_call_output", "call_id": f"call_{n}", "output": "a.py"},
        ]  # fmt: skip

    ours = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Look first."}],
            "encrypted_content": None}  # fmt: skip
    vllm_s = {"type": "reasoning", "summary": [],
              "content": [{"type": "reasoning_text", "text": "Now read it."}]}  # fmt: skip
    openai_s = {"type": "reasoning", "summary": [], "encrypted_content": "gAAAAB..."}
    request["input"] += [
        *step(1, ours),
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "and the tests?"}]},
        *step(2, ours), *step(3, vllm_s), *step(4, openai_s),
    ]  # fmt: skip
    assert client.post("/v1/responses", json=request).status_code == 200
    thoughts = [m.get("reasoning") for m in sent(fake)["messages"] if m["role"] == "assistant"]
    assert thoughts == [None, "Look first.", "Now read it.", None]


def test_store_false_is_served_statelessly_yet_kept_as_the_client_s_session(
    redis_url: str, gateways: OpenGateways
) -> None:
    """`store: false`: no response is kept to continue from (Codex resends its whole
    input), the request is routed by its `prompt_cache_key`; a policy that keeps the
    sessions clients name (`client`) checkpoints the turn under that key."""
    request = codex_request()
    client, fake = open_gateway(gateways, redis_url)
    answer = client.post("/v1/responses", json=request)
    assert "x-gateway-session" not in answer.headers  # sessions from headers only: none
    assert sent(fake)["prompt_cache_key"] == request["prompt_cache_key"]  # routed by it
    assert client.get(f"/v1/responses/{answer.json()['id']}").status_code == 404
    client, fake = open_gateway(gateways, redis_url, "sessions: {key_from: [header, client]}\n")
    answer = client.post("/v1/responses", json=request)
    assert answer.headers["x-gateway-session"] == request["prompt_cache_key"]
    assert answer.headers["x-gateway-session-turn"] == "1"
    assert client.get(f"/v1/responses/{answer.json()['id']}").status_code == 404


def test_hosted_tools_can_be_refused_instead(redis_url: str, gateways: OpenGateways) -> None:
    client, fake = open_gateway(gateways, redis_url, "limits: {hosted_tools: refuse}\n")
    answer = client.post("/v1/responses", json=codex_request())
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "tools[2].type"
    assert fake.calls == []


def counting_engine(call: Call) -> Scripted:
    if call.url.endswith("/tokenize"):
        return Scripted(body=b'{"count": 321, "max_model_len": 16384, "tokens": []}')
    return engine(call)


def test_input_tokens_are_the_engine_s_count_of_the_whole_conversation(
    redis_url: str, gateways: OpenGateways
) -> None:
    """`POST /v1/responses/input_tokens` with the openai SDK: the engine's own tokenizer
    counts the conversation the request would send (a stored response's history too)."""
    policy = TINY_POLICY + f"state: {{redis_url: '{redis_url}'}}\n"
    client, fake = gateways.open(parse_policy(policy), counting_engine)
    first = client.post("/v1/responses", json=codex_request(store=True)).json()
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=client)
    counted = sdk.responses.input_tokens.count(
        model="tiny", input="and now?", previous_response_id=first["id"], tools=[EXEC, SEARCH]
    )
    assert (counted.object, counted.input_tokens) == ("response.input_tokens", 321)
    asked = orjson.loads(fake.calls[-1].body)
    assert fake.calls[-1].url.endswith("/tokenize")
    assert [m["role"] for m in asked["messages"]][-3:] == ["user", "assistant", "user"]
    assert [t["function"]["name"] for t in asked["tools"]] == ["exec_command"]
    assert client.get("/v1/responses/" + first["id"]).json()["id"] == first["id"]  # kept as is


LONG_TURNS: list[Any] = []
for turn in range(6):
    LONG_TURNS += [
        {"type": "message", "role": "user", "content": f"step {turn}: look up order {turn}"},
        {"type": "function_call", "call_id": f"c{turn}", "name": "exec_command",
         "arguments": f'{{"cmd": "show order {turn}"}}'},
        {"type": "function_call_output", "call_id": f"c{turn}",
         "output": f"order {turn}: " + "shipped, " * 60},
        {"type": "message", "role": "assistant", "content": f"Order {turn} has shipped."},
    ]  # fmt: skip
COMPACTING = "trimming: {low_water_tokens: 120, high_water_tokens: 400}\n"


def test_compaction_folds_the_history_and_its_item_is_hydrated_the_same_every_turn(
    redis_url: str, gateways: OpenGateways
) -> None:
    """`POST /v1/responses/compact` with the openai SDK: the gateway's trimming folds the
    early turns into one block; the compaction item, sent back, becomes that block again,
    the same bytes on every turn (the engine's prefix cache keeps it)."""
    client, fake = open_gateway(gateways, redis_url, COMPACTING)
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=client)
    developer: Any = {"type": "message", "role": "developer", "content": "Be careful."}
    raw = sdk.responses.with_raw_response.compact(
        model="tiny", instructions="You are Codex.", input=[developer, *LONG_TURNS]
    )
    compacted = raw.parse()
    assert compacted.object == "response.compaction"
    assert not fake.calls  # compaction asks no engine
    kept, item = raw.http_response.json()["output"]  # items given back as they are
    assert kept["role"] == "developer"  # the leading developer message, as it was
    assert item["type"] == "compaction" and item["encrypted_content"].startswith("agw-")
    assert compacted.usage.output_tokens < compacted.usage.input_tokens
    metrics = client.get("/metrics").text
    assert 'gateway_context_edits_total{api="responses",edit="compaction"} 1.0' in metrics
    sent_twice = []
    for _ in range(2):
        follow = {"type": "message", "role": "user", "content": "and order 9?"}
        answer = client.post("/v1/responses", json={
            "model": "tiny", "instructions": "You are Codex.", "store": False,
            "input": [kept, item, follow]})  # fmt: skip
        assert answer.status_code == 200, answer.text
        sent_twice.append(fake.calls[-1].body)
    assert sent_twice[0] == sent_twice[1]
    messages = orjson.loads(sent_twice[0])["messages"]
    assert messages[0] == {"role": "system", "content": "You are Codex."}
    assert messages[1]["role"] == "system" and messages[1]["content"] == "Be careful."
    block = messages[2]["content"]
    block_text = block if isinstance(block, str) else block[0]["text"]
    assert block_text.startswith("[Earlier turns, compacted")
    assert "<user>step 0: look up order 0</user>" in block_text  # user messages verbatim
    assert messages[-1] == {"role": "user", "content": "and order 9?"}
    assert len(orjson.dumps(messages)) < len(orjson.dumps(LONG_TURNS))


def compacted_block(engine_body: dict[str, Any]) -> str:
    """The text of the first message the engine was sent after the instructions: the
    compacted block, where compaction ran."""
    first = next(m for m in engine_body["messages"] if m["role"] != "system")
    block = first["content"]
    return block if isinstance(block, str) else str(block[0]["text"])


@pytest.mark.parametrize("stream", [False, True])
def test_context_management_compacts_past_its_threshold_and_the_chain_goes_on_compacted(
    redis_url: str, gateways: OpenGateways, stream: bool
) -> None:
    """OpenAI's server-side compaction (`context_management`, as the Agents SDK and
    LangChain send it): past the threshold the engine gets the compacted conversation,
    the output starts with the compaction item, and the next turn by
    `previous_response_id` continues from the compacted conversation."""
    client, fake = open_gateway(gateways, redis_url, COMPACTING)
    sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=client)
    asked: Any = {"model": "tiny", "instructions": "You are Codex.", "input": LONG_TURNS,
                  "tools": [EXEC, AGENTS], "context_management": [{"type": "compaction",
                                                           "compact_threshold": None}]}  # fmt: skip
    if stream:
        events = [
            e.model_dump(exclude_unset=True) for e in sdk.responses.create(**asked, stream=True)
        ]
        added = [e["item"]["type"] for e in events if e["type"] == "response.output_item.added"]
        assert added[0] == "compaction"
        first = events[-1]["response"]
    else:
        first = sdk.responses.create(**asked).model_dump(exclude_unset=True)
    assert violations("Response", first) == []
    item = first["output"][0]
    assert item["type"] == "compaction" and item["encrypted_content"].startswith("agw-")
    assert compacted_block(sent(fake)).startswith("[Earlier turns, compacted")
    assert len(fake.calls[-1].body) < len(orjson.dumps(LONG_TURNS))
    # by previous_response_id: the compacted conversation, the reply, then the new input
    follow = sdk.responses.create(
        model="tiny", input="and order 9?", previous_response_id=first["id"]
    )
    assert follow.status == "completed"
    assert compacted_block(sent(fake)).startswith("[Earlier turns, compacted")
    assert sent(fake)["messages"][-1] == {"role": "user", "content": "and order 9?"}


def test_context_management_under_its_threshold_changes_nothing_and_bad_entries_are_a_400(
    redis_url: str, gateways: OpenGateways
) -> None:
    client, fake = open_gateway(gateways, redis_url, COMPACTING)
    plenty = [{"type": "compaction", "compact_threshold": 1_000_000}]
    body = {"model": "tiny", "input": LONG_TURNS, "tools": [EXEC, AGENTS]}
    answer = client.post("/v1/responses", json={**body, "context_management": plenty})
    assert answer.status_code == 200, answer.text
    assert [i["type"] for i in answer.json()["output"]] == ["reasoning", "function_call"]
    assert len(sent(fake)["messages"]) == 6 * 4  # every turn as it came
    for entries, param in (
        ([{"type": "truncation"}], "context_management[0].type"),
        (
            [{"type": "compaction", "compact_threshold": 10}],
            "context_management[0].compact_threshold",
        ),
        ([], "context_management"),
    ):
        refused = client.post("/v1/responses", json={**body, "context_management": entries})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == param


@pytest.mark.parametrize(
    "content",
    ["agw-compaction-v1:" + "0" * 32, "agw-compaction-v1:../../x", "gAAAAB-openai-encrypted"],
)
def test_a_compaction_item_the_gateway_did_not_make_is_a_400(
    redis_url: str, gateways: OpenGateways, content: str
) -> None:
    client, fake = open_gateway(gateways, redis_url)
    item = {"type": "compaction", "id": "cmp_1", "encrypted_content": content}
    answer = client.post("/v1/responses", json={"model": "tiny", "input": [item]})
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "input[0].encrypted_content"
    assert fake.calls == []


def test_allowed_tools_reach_the_engine_as_vllm_takes_them_with_every_tool_declared(
    redis_url: str, gateways: OpenGateways
) -> None:
    """OpenAI's `allowed_tools` (Responses shape): every tool stays in the prompt, the
    engine is sent a choice it takes, and the answer's calls are held to the allowed."""
    client, fake = open_gateway(gateways, redis_url)
    choice = {"type": "allowed_tools", "mode": "auto",
              "tools": [{"type": "function", "name": "multi_agent_v1__spawn_agent"}]}  # fmt: skip
    answer = client.post("/v1/responses", json=codex_request(tool_choice=choice))
    assert answer.status_code == 200, answer.text
    engine_body = sent(fake)
    assert engine_body["tool_choice"] == "auto" and len(engine_body["tools"]) == 3
    # Only exec_command allowed, and a call owed: the twin calls spawn_agent, every time.
    choice = {"type": "allowed_tools", "mode": "required",
              "tools": [{"type": "function", "name": "exec_command"}]}  # fmt: skip
    refused = client.post("/v1/responses", json=codex_request(tool_choice=choice))
    assert refused.status_code == 502, refused.text
    assert "`multi_agent_v1__spawn_agent` is not allowed" in refused.json()["error"]["message"]
    assert sent(fake)["tool_choice"] == {"type": "function", "function": {"name": "exec_command"}}
    wrong = {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "rm"}]}
    bad = client.post("/v1/responses", json=codex_request(tool_choice=wrong))
    assert bad.status_code == 400 and "`rm` is not among" in bad.json()["error"]["message"]
