"""The Responses API through the real app (engine twin, real Redis), checked against
OpenAI's published schemas and driven by the real `openai` SDK."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import orjson
import pytest
from starlette.testclient import TestClient

from gateway.policy import Policy, parse_policy
from tests.fakes import Call, FakeUpstream, Scripted
from tests.openapi_contract import violations
from tests.unit.clients import TINY_POLICY, OpenGateways


def engine(call: Call) -> Scripted:
    """Says how many messages it saw; calls `lookup` when the last message asks for it."""
    body = orjson.loads(call.body)
    messages = body["messages"]
    last = messages[-1].get("content") or ""
    message: dict[str, Any] = {"role": "assistant", "content": f"saw {len(messages)}"}
    if "lookup" in str(last):
        message = {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "lookup", "arguments": '{"id": "R1"}'}}]}  # fmt: skip
    if body.get("stream"):
        chunks = [
            b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":"saw "}}]}\n\n',
            b'data: {"choices":[{"index":0,"delta":{"content":"%d"},"finish_reason":"stop"}]}\n\n'
            % len(messages),
            b'data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":2,'
            b'"total_tokens":11}}\n\n',
            b"data: [DONE]\n\n",
        ]
        return Scripted(chunks=chunks, content_type="text/event-stream")
    completion = {
        "id": "c", "object": "chat.completion", "created": 1, "model": "served-tiny",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11},
    }  # fmt: skip
    return Scripted(body=orjson.dumps(completion))


@pytest.fixture
def policy(redis_url: str) -> Policy:
    return parse_policy(TINY_POLICY + f"state: {{redis_url: '{redis_url}'}}\n")


@pytest.fixture
def app(policy: Policy) -> Iterator[tuple[TestClient, FakeUpstream]]:
    gateways = OpenGateways()
    yield gateways.open(policy, engine)
    gateways.close_all()


def sdk(client: TestClient) -> openai.OpenAI:
    return openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=client)


def sent(fake: FakeUpstream, n: int = -1) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = orjson.loads(fake.calls[n].body)["messages"]
    return messages


def test_a_response_matches_the_spec_and_can_be_fetched_and_deleted(
    app: tuple[TestClient, FakeUpstream],
) -> None:
    client, _ = app
    created = client.post("/v1/responses", json={"model": "tiny", "input": "hi"})
    assert created.status_code == 200
    body = created.json()
    assert violations("Response", body) == []
    assert body["output"][0]["content"][0]["text"] == "saw 1"
    assert body["usage"]["input_tokens"] == 9
    assert client.get(f"/v1/responses/{body['id']}").json() == body
    assert client.delete(f"/v1/responses/{body['id']}").json()["deleted"] is True
    gone = client.get(f"/v1/responses/{body['id']}")
    assert gone.status_code == 404
    assert gone.json()["error"]["code"] == "response_not_found"


def test_previous_response_id_hydrates_the_conversation_without_old_instructions(
    app: tuple[TestClient, FakeUpstream],
) -> None:
    client, fake = app
    api = sdk(client)
    first = api.responses.create(model="tiny", input="hello", instructions="Be brief.")
    second = api.responses.create(
        model="tiny", input="and again", instructions="Be kind.", previous_response_id=first.id
    )
    assert sent(fake) == [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "saw 2"},
        {"role": "user", "content": "and again"},
    ]
    assert second.output_text == "saw 4"


def test_continuing_from_an_earlier_response_branches_and_lists_its_own_line_s_items(
    app: tuple[TestClient, FakeUpstream],
) -> None:
    client, fake = app
    api = sdk(client)
    root = api.responses.create(model="tiny", input="root")
    api.responses.create(model="tiny", input="branch A", previous_response_id=root.id)
    b = api.responses.create(
        model="tiny",
        input=[{"role": "user", "content": [{"type": "input_text", "text": "branch B"}]}],
        previous_response_id=root.id,
    )
    assert [m["content"] for m in sent(fake)] == ["root", "saw 1", "branch B"]
    pages = api.responses.input_items.list(b.id, limit=1)  # the SDK pages one at a time
    newest_first = [item.model_dump() for item in pages]
    assert [(i["type"], i["role"]) for i in newest_first] == [
        ("message", "user"), ("message", "assistant"), ("message", "user")
    ]  # fmt: skip
    texts = [i["content"][0]["text"] for i in newest_first]
    assert texts == ["branch B", "saw 1", "root"]  # branch A is not in B's chain
    assert newest_first[1]["id"] == root.output[0].id
    page = client.get(f"/v1/responses/{b.id}/input_items", params={"order": "asc", "limit": 2})
    assert violations("ResponseItemList", page.json()) == []
    assert page.json()["has_more"] is True
    assert [i["id"] for i in page.json()["data"]] == [i["id"] for i in newest_first[:0:-1]]
    bad = client.get(f"/v1/responses/{b.id}/input_items", params={"limit": 500})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "limit"


def test_a_stored_response_is_complete_so_not_cancellable(
    app: tuple[TestClient, FakeUpstream],
) -> None:
    client, _ = app
    api = sdk(client)
    done = api.responses.create(model="tiny", input="hi")
    with pytest.raises(openai.BadRequestError) as refused:
        api.responses.cancel(done.id)
    assert refused.value.code == "not_cancellable"
    assert api.responses.retrieve(done.id).status == "completed"
    for method, path in (("GET", "input_items"), ("POST", "cancel")):
        gone = client.request(method, f"/v1/responses/resp_nope/{path}")
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "response_not_found"


def test_function_calls_round_trip(app: tuple[TestClient, FakeUpstream]) -> None:
    client, fake = app
    api = sdk(client)
    tools: Any = [{"type": "function", "name": "lookup", "description": "Find a booking.",
                   "parameters": {"type": "object", "properties": {"id": {"type": "string"}}}}]  # fmt: skip
    first = api.responses.create(model="tiny", input="please lookup R1", tools=tools)
    call = first.output[0]
    assert call.type == "function_call" and call.name == "lookup"
    assert orjson.loads(fake.calls[0].body)["tools"][0]["function"]["name"] == "lookup"
    api.responses.create(
        model="tiny",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "confirmed"}],
        tools=tools,
    )
    assert sent(fake)[-2:] == [
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"id": "R1"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "confirmed"},
    ]


def test_a_streamed_response_tells_the_events_in_order(
    app: tuple[TestClient, FakeUpstream],
) -> None:
    client, _ = app
    events = []
    with client.stream(
        "POST", "/v1/responses", json={"model": "tiny", "input": "hi", "stream": True}
    ) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append(orjson.loads(line[6:]))
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds
    for event in events:
        assert violations("ResponseStreamEvent", event) == [], event["type"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    done = events[-1]["response"]
    assert done["output"][0]["content"][0]["text"] == "saw 1"
    assert done["usage"]["output_tokens"] == 2
    # stored before `response.completed` went out: the next request can continue from it
    assert client.get(f"/v1/responses/{done['id']}").json() == done


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": "tiny", "input": "x", "previous_response_id": "resp_nope"}, 404,
         "previous_response_id"),
        ({"model": "tiny"}, 400, "input"),
        ({"model": "tiny", "input": 0}, 400, "input"),  # once no input at all
        ({"model": "tiny", "input": {}}, 400, "input"),
        ({"model": "tiny", "input": "x", "tools": [{"type": "namespace", "tools": []}]}, 400,
         "tools[0].name"),
        ({"model": "tiny", "input": [{"type": "item_reference", "id": "x"}]}, 400,
         "input[0].type"),
        ({"model": "tiny", "input": "x", "conversation": "conv_1"}, 400, "conversation"),
        ({"model": "tiny", "input": "x", "tools": [{"type": "custom", "name": "t", "format": {
            "type": "grammar", "syntax": "lark", "definition": "start: nope"}}]}, 400,
         "tools[0].format.definition"),
        ({"model": "tiny", "input": "x", "prompt": {"id": "pmpt_1"}}, 400, "prompt"),
        ({"model": "tiny", "input": "x", "tool_choice": "required"}, 400, "tool_choice"),
        ({"model": "tiny", "input": "x", "tool_choice": "required",
          "tools": [{"type": "web_search"}]}, 400, "tool_choice"),
        ({"model": "tiny", "input": [{"role": "user", "content": [
            {"type": "input_image", "file_id": "file-1"}]}]}, 400, "input[0].content[0]"),
        ({"model": "tiny", "input": [{"role": "user", "content": [
            {"type": "input_text", "text": "x"}, {"type": "input_file", "file_id": "f"}]}]},
         400, "input[0].content[1]"),
        ({"model": "tiny", "input": [{"role": "user", "content": [{"type": "input_image",
            "image_url": "http://169.254.169.254/latest/meta-data"}]}]}, 400,
         "input[0].content[0].image_url"),
    ],
)  # fmt: skip
def test_bad_requests_get_clear_errors(
    app: tuple[TestClient, FakeUpstream], body: dict[str, Any], status: int, param: str
) -> None:
    client, fake = app
    response = client.post("/v1/responses", json=body)
    assert response.status_code == status
    assert response.json()["error"]["param"] == param
    assert fake.calls == []


def test_images_and_refusals_in_the_input_reach_the_engine_as_chat_content(
    app: tuple[TestClient, FakeUpstream],
) -> None:
    """An image comes inline (a data: URL) and goes to the engine as a chat `image_url`
    part; an assistant's refusal, replayed from an earlier output, is what it said; a
    text-only message keeps its joined text (the same bytes whatever parts it came in)."""
    client, fake = app
    image = "data:image/png;base64,iVBORw0KGgo="
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "What is "},
                                     {"type": "input_text", "text": "this?"}]},
        {"type": "message", "role": "assistant", "content": [
            {"type": "refusal", "refusal": "I cannot say."}]},
        {"role": "user", "content": [
            {"type": "input_text", "text": "Look again:"},
            {"type": "input_image", "image_url": image, "detail": "low"}]},
    ]  # fmt: skip
    answer = sdk(client).responses.create(model="tiny", input=items)  # type: ignore[arg-type]
    assert answer.status == "completed"
    assert answer.background is False
    assert violations("Response", answer.model_dump(exclude_unset=True)) == []
    assert sent(fake) == [
        {"role": "user", "content": "What is this?"},
        {"role": "assistant", "content": "I cannot say."},
        {"role": "user", "content": [
            {"type": "text", "text": "Look again:"},
            {"type": "image_url", "image_url": {"url": image, "detail": "low"}}]},
    ]  # fmt: skip


async def test_a_stream_cut_by_max_output_tokens_ends_incomplete() -> None:
    from gateway.responses.stream import ResponseEvents

    kept: list[dict[str, Any]] = []

    async def keep(response: dict[str, Any]) -> None:
        kept.append(response)

    async def chat() -> Any:
        yield b'data: {"choices":[{"index":0,"delta":{"content":"abc"},"finish_reason":"length"}]}\n\n'
        yield b"data: [DONE]\n\n"

    events = ResponseEvents("resp_1", {"model": "tiny"}, 1, keep)
    out = [orjson.loads(e.split(b"data: ", 1)[1]) async for e in events.convert(chat())]
    assert out[-1]["type"] == "response.incomplete"
    assert out[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert violations("ResponseStreamEvent", out[-1]) == []
    assert kept == [out[-1]["response"]]
