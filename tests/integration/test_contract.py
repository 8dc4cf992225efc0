"""What the gateway returns validates against OpenAI's published OpenAPI schemas
(../shared/data/openai/openapi.yaml), streamed chunks and errors included."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import orjson
import pytest

from tests.integration.conftest import Gateway
from tests.openapi_contract import violations

pytestmark = pytest.mark.engine

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


@pytest.fixture
def http(gateway: Gateway) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.v1, timeout=120) as client:
        yield client


def post(http: httpx.Client, path: str, body: dict[str, object]) -> httpx.Response:
    return http.post(path, content=orjson.dumps(body), headers={"Content-Type": "application/json"})


# The tiny model's weights are random: a named `tool_choice` constrains only the call's name
# in vLLM 0.32 and its arguments are whatever the model says (`true`, `[]`, text cut short),
# which the gateway refuses. The call itself is made certain by constraining the text to the
# Hermes markup vLLM's tool parser reads, with `tool_choice` left `auto`.
MAKE_THE_CALL = {
    "temperature": 0,
    "max_tokens": 120,
    "structured_outputs": {
        "regex": r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "Oslo"\}\}\n</tool_call>'
    },
}


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"tools": TOOLS},
        {"tools": TOOLS, **MAKE_THE_CALL},
        {"logprobs": True, "top_logprobs": 2},
    ],
    ids=["plain", "tools", "tool-call", "logprobs"],
)
def test_chat_completion_matches_schema(http: httpx.Client, extra: dict[str, object]) -> None:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 6,
        **extra,
    }
    response = post(http, "/chat/completions", body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert violations("CreateChatCompletionResponse", answer) == []
    if "structured_outputs" in extra:
        (call,) = answer["choices"][0]["message"]["tool_calls"]
        assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}


def test_a_named_tool_choice_answers_in_one_of_the_two_published_shapes(
    http: httpx.Client,
) -> None:
    """Whatever arguments the random model gives the named call, the client gets either a
    completion with a valid call or the gateway's refusal, each as OpenAI publishes it."""
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 40,
        "tools": TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    }
    response = post(http, "/chat/completions", body)
    if response.status_code == 200:
        assert violations("CreateChatCompletionResponse", response.json()) == []
        return
    assert response.status_code == 502, response.text
    assert response.json()["error"]["code"] == "invalid_tool_call"
    assert violations("ErrorResponse", response.json()) == []


@pytest.mark.parametrize("logprobs", [False, True])
@pytest.mark.parametrize("include_usage", [True, False])
def test_stream_chunks_match_schema(
    http: httpx.Client, include_usage: bool, logprobs: bool
) -> None:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 6,
        "stream": True,
        "stream_options": {"include_usage": include_usage},
        "logprobs": logprobs,
        "ignore_eos": True,  # a vLLM extension, passed through untouched: exact token counts
    }
    with http.stream("POST", "/chat/completions", content=orjson.dumps(body)) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line]
    assert events[-1] == "data: [DONE]"
    chunks = [orjson.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert chunks
    for chunk in chunks:
        assert violations("CreateChatCompletionStreamResponse", chunk) == []
    if include_usage:
        assert chunks[-1]["choices"] == []
        assert chunks[-1]["usage"]["completion_tokens"] == 6
    else:
        assert all(chunk.get("usage") is None for chunk in chunks)


def test_completion_matches_schema(http: httpx.Client) -> None:
    response = post(http, "/completions", {"model": "tiny", "prompt": "Hello", "max_tokens": 4})
    assert response.status_code == 200
    assert violations("CreateCompletionResponse", response.json()) == []


def test_embedding_matches_schema(http: httpx.Client) -> None:
    response = post(http, "/embeddings", {"model": "tiny-embed", "input": "Hello"})
    assert response.status_code == 200
    assert violations("CreateEmbeddingResponse", response.json()) == []


def test_model_list_matches_schema(http: httpx.Client) -> None:
    response = http.get("/models")
    assert violations("ListModelsResponse", response.json()) == []
    assert violations("Model", http.get("/models/tiny").json()) == []


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/chat/completions", b"{oops", 400),
        ("/chat/completions", b'{"model": "tiny"}', 400),
        (
            "/chat/completions",
            b'{"model": "nope", "messages": [{"role": "user", "content": "x"}]}',
            404,
        ),
        (
            "/chat/completions",
            b'{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 99999999}',
            400,
        ),
        (
            "/chat/completions",
            b'{"model": "tiny-all-down", "messages": [{"role": "user", "content": "x"}]}',
            503,
        ),
        ("/embeddings", b'{"model": "tiny-embed"}', 400),
    ],
)
def test_errors_match_schema(http: httpx.Client, path: str, body: bytes, status: int) -> None:
    response = http.post(path, content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == status
    assert violations("ErrorResponse", response.json()) == []
