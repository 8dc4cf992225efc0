"""A stored response's input items: kept as OpenAI lists them, paged both ways, read back
along the chain of responses only as far as a page needs."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.errors import InvalidRequest
from gateway.responses.input_items import MAX_CHAIN, Page, kept_inputs, listing, page_of


def test_a_string_input_is_one_user_message_with_an_id() -> None:
    assert kept_inputs("hi", "resp_abc") == [
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "hi"}],
            "id": "msg_abc_in0",
        }
    ]


def test_items_keep_their_own_ids_and_get_one_by_type_where_they_have_none() -> None:
    items = [
        {"role": "assistant", "content": "earlier"},
        {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "ok", "id": "mine"},
    ]
    kept = kept_inputs(items, "resp_abc")
    assert [k["id"] for k in kept] == ["msg_abc_in0", "fc_abc_in1", "mine"]
    assert kept[0]["content"] == [{"type": "output_text", "text": "earlier"}]
    assert items[0] == {"role": "assistant", "content": "earlier"}  # the request untouched


def chain(n: int) -> tuple[dict[str, Any], dict[str, dict[str, Any]], list[str]]:
    """n responses each continuing the one before: the newest record, every record by
    id, and the reads a listing made."""
    records: dict[str, dict[str, Any]] = {}
    previous = None
    for i in range(n):
        rid = f"resp_{i}"
        records[rid] = {
            "input": kept_inputs(f"question {i}", rid),
            "previous": previous,
            "response": {"output": [{"type": "message", "id": f"out_{i}", "role": "assistant"}]},
        }
        previous = rid
    return records[f"resp_{n - 1}"], records, []


def listed(n: int, page: Page) -> tuple[dict[str, Any], list[str]]:
    newest, records, reads = chain(n)

    async def read(rid: str) -> dict[str, Any] | None:
        reads.append(rid)
        return records.get(rid)

    return asyncio.run(listing(newest, read, page)), reads


def test_a_chain_is_listed_newest_first_and_read_only_as_far_as_the_page() -> None:
    answer, reads = listed(300, Page(limit=3))
    ids = [item["id"] for item in answer["data"]]
    assert ids == ["msg_299_in0", "out_298", "msg_298_in0"]
    assert answer["has_more"] is True
    assert (answer["first_id"], answer["last_id"]) == ("msg_299_in0", "msg_298_in0")
    assert reads == ["resp_298", "resp_297"]  # two records of 300, not all of them


def test_pages_follow_after_in_both_orders_and_end() -> None:
    answer, _ = listed(3, Page(limit=2, descending=False))
    assert [i["id"] for i in answer["data"]] == ["msg_0_in0", "out_0"]
    answer, _ = listed(3, Page(limit=2, descending=False, after="out_0"))
    assert [i["id"] for i in answer["data"]] == ["msg_1_in0", "out_1"]
    answer, _ = listed(3, Page(limit=2, descending=False, after="out_1"))
    assert [i["id"] for i in answer["data"]] == ["msg_2_in0"]
    assert answer["has_more"] is False
    answer, _ = listed(3, Page(limit=10, after="out_0"))
    assert [i["id"] for i in answer["data"]] == ["msg_0_in0"]


def test_an_unknown_after_is_a_400_naming_it() -> None:
    with pytest.raises(InvalidRequest) as raised:
        listed(2, Page(after="nope"))
    assert raised.value.param == "after"


def test_a_chain_ends_where_a_record_is_gone_and_after_max_chain() -> None:
    newest, records, _ = chain(5)
    del records["resp_2"]

    async def read(rid: str) -> dict[str, Any] | None:
        return records.get(rid)

    answer = asyncio.run(listing(newest, read, Page(limit=100)))
    assert [i["id"] for i in answer["data"]] == ["msg_4_in0", "out_3", "msg_3_in0"]
    answer, reads = listed(MAX_CHAIN + 5, Page(limit=100, descending=False))
    assert len(reads) == MAX_CHAIN - 1  # the newest came with the call
    assert answer["data"][0]["id"] == "msg_5_in0"


def test_an_image_s_url_is_listed_only_when_included() -> None:
    part = {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}
    record = {"input": kept_inputs([{"role": "user", "content": [part]}], "resp_x")}

    async def read(rid: str) -> None:
        return None

    plain = asyncio.run(listing(record, read, Page()))
    assert plain["data"][0]["content"] == [{"type": "input_image"}]
    included = asyncio.run(listing(record, read, Page(image_urls=True)))
    assert included["data"][0]["content"] == [part]


@pytest.mark.parametrize(
    ("query", "param"),
    [({"limit": "0"}, "limit"), ({"limit": "101"}, "limit"), ({"limit": "x"}, "limit"),
     ({"order": "up"}, "order")],
)  # fmt: skip
def test_a_bad_query_is_a_400_naming_it(query: dict[str, str], param: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        page_of(query, [])
    assert raised.value.param == param


def test_the_query_s_defaults_are_openai_s() -> None:
    assert page_of({}, []) == Page(limit=20, descending=True, after=None, image_urls=False)
    assert page_of({"order": "asc", "limit": "5"}, ["message.input_image.image_url"]) == Page(
        limit=5, descending=False, after=None, image_urls=True
    )
