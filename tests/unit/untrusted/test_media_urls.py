"""Media named by URL: a multimodal vLLM fetches any `http(s)://` (and, where allowed,
`file://`) URL an image, audio or video part names, from inside the cluster. The gateway
refuses such a part with a 400 naming it before any engine is asked; inline `data:` media
and hosts the policy lists pass; no spelling of a URL reads as a listed host unless every
URL parser would read it so."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import urllib3.util
import yarl
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from gateway.chat.inbound import parse_request
from gateway.errors import InvalidRequest
from gateway.policy import Endpoint, PolicyError, parse_policy
from gateway.policy.schema import LimitsSpec
from gateway.tenants.settings import TenantPolicies
from gateway.untrusted.media_urls import check_media_urls, host_of
from tests.fakes import FakeUpstream

PNG = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGAAAAAFAAFC"
)
METADATA = "http://169.254.169.254/latest/meta-data/iam/security-credentials/"


def image(url: Any) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def user(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "text", "text": "what is this?"}, *parts]}


def refusal(messages: list[Any], hosts: tuple[str, ...] = ()) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        check_media_urls(messages, hosts)
    assert (caught.value.status, caught.value.code) == (400, "unsupported_media_url")
    return caught.value


@pytest.mark.parametrize(
    "part",
    [
        image(METADATA),
        image("https://example.com/cat.png"),
        image("file:///etc/passwd"),
        image("HTTP://127.0.0.1:6379/"),
        {"type": "image_url", "image_url": METADATA},  # the string form vLLM also reads
        {"image_url": {"url": METADATA}},  # no `type`: vLLM reads the part by its key
        {"type": "text", "text": "x", "image_url": {"url": METADATA}},  # a `type` that lies
        {"type": "input_image", "image_url": METADATA},  # the Responses-style part
        {"type": "audio_url", "audio_url": {"url": METADATA}},
        {"type": "video_url", "video_url": {"url": METADATA}},
        {"video_url": METADATA},
        image(" data:image/png;base64,AAAA"),  # vLLM's test is the first five characters
    ],
)
def test_a_part_the_engine_would_fetch_is_refused_naming_it(part: dict[str, Any]) -> None:
    messages = [{"role": "system", "content": "be brief"}, user(part)]
    error = refusal(messages)
    key = next(k for k in ("image_url", "audio_url", "video_url") if k in part)
    nested = isinstance(part[key], dict)
    assert error.param == f"messages[1].content[1].{key}" + (".url" if nested else "")
    assert "data:" in error.message and METADATA not in error.message


def test_inline_media_and_text_pass() -> None:
    check_media_urls(
        [
            {"role": "system", "content": "be brief"},
            user(image(PNG), image("DATA:image/png;base64,AAAA")),
            {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]},
            {"role": "assistant", "content": None, "tool_calls": []},
            {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": METADATA}]},
            "not an object",  # the parse names that one
            {"role": "user", "content": [image(None), "text", 7]},  # the engine's to refuse
        ],
        (),
    )  # fmt: skip


def test_a_listed_host_passes_and_nothing_else_reads_as_it() -> None:
    hosts = ("images.example.com",)
    check_media_urls([user(image("https://images.example.com/cat.png"))], hosts)
    check_media_urls([user(image("http://IMAGES.example.com:8443/a?b#c"))], hosts)
    for url in (
        "https://images.example.com@169.254.169.254/",  # a user part: the host is after it
        "https://images.example.com:80@169.254.169.254/",
        "https://169.254.169.254\\@images.example.com/",  # parsers split on \ differently
        "https://images.example.com\\.evil.test/",
        "https://images.example.com.evil.test/",
        "https://evil.test/images.example.com",
        "https://evil.test?images.example.com",
        "https://images.example.com\t.evil.test/",
        "https://images.example.com\uff0eevil.test/",  # a full-width dot
        "ftp://images.example.com/cat.png",
        "file://images.example.com/etc/passwd",
        "https://images.example.com:x/",
        "//images.example.com/cat.png",
    ):
        error = refusal([user(image(url))], hosts)
        assert "images.example.com" in error.message  # says where URLs are taken from


def test_host_of_reads_only_plain_urls() -> None:
    assert host_of("https://a.example.com/x") == "a.example.com"
    assert host_of("http://A.Example.COM:8080") == "a.example.com"
    assert host_of("https://[::1]:8080/") is None  # read by no two parsers alike
    for url in (
        "https://u@a.example.com/",
        "https://a.example.com\\/",
        "mailto:a@b",
        "",
        "https://",
    ):
        assert host_of(url) is None, url


# Pieces a URL is made of, the awkward ones weighted in: separators, a user part, the
# backslash and percent signs parsers read differently, whitespace, IPv6 brackets, and
# characters that look like ASCII ones.
_PIECES = st.sampled_from(
    ["images.example.com", "evil.test", "169.254.169.254", "@", ":", "/", "\\", "?", "#",
     "%2e", "%40", ".", "[", "]", "::1", " ", "\t", "80", "x", "\uff0e", "\u3002", ";"]
)  # fmt: skip


@settings(max_examples=1000, deadline=None)
@given(
    scheme=st.sampled_from(["http://", "https://", "HTTP://", "http:/", "http:\\\\", ""]),
    before=st.lists(_PIECES, max_size=3),
    host=st.sampled_from(["images.example.com", "169.254.169.254", "a-b.c"]),
    after=st.lists(_PIECES, max_size=6),
)
def test_a_host_read_is_the_host_vllm_fetches_from(
    scheme: str, before: list[str], host: str, after: list[str]
) -> None:
    """vLLM parses a media URL with urllib3 (`parse_url`, its domain check) and fetches the
    URL urllib3 gives back with aiohttp (yarl). Whenever `host_of` reads a host, both
    read the same one, so a listed host cannot be spelt to reach another. (200,000 such
    URLs, 4,966 of them with a host read, agreed when this was written.)"""
    url = scheme + "".join(before) + host + "".join(after)
    read = host_of(url)
    if read is None:
        return
    parsed = urllib3.util.parse_url(url)
    assert parsed.host is not None and parsed.host.lower() == read, url
    fetched = yarl.URL(parsed.url)
    assert fetched.host is not None and fetched.host.lower() == read, url


def test_chat_and_embeddings_bodies_are_checked_when_parsed() -> None:
    chat = {"model": "m", "messages": [user(image(METADATA))]}
    with pytest.raises(InvalidRequest) as caught:
        parse_request(Endpoint.chat, orjson.dumps(chat), LimitsSpec())
    assert caught.value.param == "messages[0].content[1].image_url.url"
    # vLLM's embeddings API takes chat messages too (multimodal embedding models).
    embeddings = {"model": "m", "input": "x", "messages": [user(image(METADATA))]}
    with pytest.raises(InvalidRequest):
        parse_request(Endpoint.embeddings, orjson.dumps(embeddings), LimitsSpec())
    # The check comes after each endpoint's own required fields, never instead of them.
    for endpoint, field in ((Endpoint.completions, "prompt"), (Endpoint.embeddings, "input")):
        with pytest.raises(InvalidRequest) as missing:
            parse_request(endpoint, orjson.dumps({"model": "m", "messages": []}), LimitsSpec())
        assert missing.value.param == field
    allowed = LimitsSpec(media_url_hosts=("169.254.169.254",))
    assert parse_request(Endpoint.chat, orjson.dumps(chat), allowed).model == "m"


def test_hosts_are_validated_at_load_and_set_per_tenant() -> None:
    assert LimitsSpec().media_url_hosts == ()
    assert LimitsSpec(media_url_hosts=("Images.Example.COM",)).media_url_hosts == (
        "images.example.com",
    )
    base = (
        "version: 1\npools:\n  p: {served_model: s, replicas: [{url: 'http://a.test:1'}]}\n"
        "models:\n  m: {pool: p}\n"
    )
    for bad in ("https://images.example.com", "images.example.com:443", "*.example.com", "a b"):
        with pytest.raises(PolicyError, match="media_url_hosts"):
            parse_policy(base + f"limits: {{media_url_hosts: ['{bad}']}}\n")
    policy = parse_policy(
        base + "tenants:\n  vision: {limits: {media_url_hosts: [images.example.com]}}\n"
    )
    assert policy.limits.media_url_hosts == ()
    assert TenantPolicies(policy).of("vision").limits.media_url_hosts == ("images.example.com",)


# Through the app (conftest.py): a 400 in OpenAI's shape, and the engine is never asked.
def test_the_app_refuses_a_fetched_part_and_passes_inline_media(
    gateway: tuple[TestClient, FakeUpstream],
) -> None:
    client, fake = gateway
    for stream in (False, True):
        body = {"model": "tiny", "messages": [user(image(METADATA))], "stream": stream}
        response = client.post("/v1/chat/completions", json=body)
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error"
        assert (error["param"], error["code"]) == (
            "messages[0].content[1].image_url.url",
            "unsupported_media_url",
        )
    assert fake.calls == []
    inline = {"model": "tiny", "messages": [user(image(PNG))]}
    assert client.post("/v1/chat/completions", json=inline).status_code == 200
    (call,) = fake.calls
    assert PNG in call.body.decode()  # passed on as the client sent it
