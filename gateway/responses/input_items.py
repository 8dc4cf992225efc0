"""`GET /v1/responses/{id}/input_items`: the items a stored response was made from, listed
as OpenAI lists them.

Each response record keeps its request's own input, normalised (`kept_inputs`), and the id
of the response it continued. A response's input items are then the chain's: each earlier
response's input and output, oldest first, then its own input (instructions are not
items). The chain is walked from the newest record back, one Redis read a response, and
only as far as the page needs when the order is `desc` (the default): an agent listing
the latest items of a 300-turn conversation reads a few records, not 300.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from gateway.errors import InvalidRequest

# How many responses a listing walks back through at most: a chain longer than this lists
# its latest responses' items only (`has_more` stays false past it; the docs say so).
MAX_CHAIN = 1_000
_ID_PREFIX = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "custom_tool_call": "ctc",
    "custom_tool_call_output": "ctco",
    "reasoning": "rs",
    "compaction": "cmp",
}
# `include` values that add to a listing; images' URLs are left out unless asked for, as
# OpenAI lists them (an inline image is the largest thing a record keeps).
_IMAGE_URLS = "message.input_image.image_url"


def kept_inputs(items: Any, response_id: str) -> list[dict[str, Any]]:
    """A request's `input` (already checked by `input_messages`) as the items a listing
    gives back: a string is one user message, a message's string content one text part,
    and every item has an id, its own or one made from the response's id and its place."""
    listed = [{"role": "user", "content": items}] if isinstance(items, str) else items
    kept: list[dict[str, Any]] = []
    for i, item in enumerate(listed):
        one = {"type": "message", **item}
        content = one.get("content")
        if one["type"] == "message" and isinstance(content, str):
            part = "output_text" if one.get("role") == "assistant" else "input_text"
            one["content"] = [{"type": part, "text": content}]
        if not isinstance(one.get("id"), str):
            one["id"] = f"{_ID_PREFIX.get(one['type'], 'item')}_{response_id[5:]}_in{i}"
        kept.append(one)
    return kept


@dataclass(frozen=True)
class Page:
    limit: int = 20
    descending: bool = True
    after: str | None = None
    image_urls: bool = False


def page_of(query: Mapping[str, str], include: Sequence[str]) -> Page:
    """The listing's query, checked: `limit` 1-100 (default 20), `order` `asc` or `desc`
    (default), `after` an item id; `include` may ask for images' URLs."""
    limit_text = query.get("limit", "20")
    # ASCII digits only (`str.isdigit` takes "²"), and few of them (int() of 5,000 raises).
    plain = limit_text.isascii() and limit_text.isdigit() and len(limit_text) <= 3
    limit = int(limit_text) if plain else 0
    if not 1 <= limit <= 100:
        raise InvalidRequest(
            f"Invalid 'limit': {limit_text!r}. Expected an integer between 1 and 100.",
            param="limit",
            code="invalid_value",
        )
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequest(
            f"Invalid 'order': {order!r}. Expected 'asc' or 'desc'.",
            param="order",
            code="invalid_value",
        )
    return Page(limit, order == "desc", query.get("after"), _IMAGE_URLS in include)


# Reads one stored response record of the caller's tenant (None: not kept, or expired).
ReadRecord = Callable[[str], Awaitable[dict[str, Any] | None]]


async def newest_first(
    record: dict[str, Any], read: ReadRecord
) -> AsyncGenerator[dict[str, Any], None]:
    """The chain's items, newest first, read back record by record; it ends where a record
    was deleted or expired, or after MAX_CHAIN responses."""
    for item in reversed(record.get("input") or ()):
        yield item
    previous, walked = record.get("previous"), 1
    while isinstance(previous, str) and walked < MAX_CHAIN:
        earlier = await read(previous)
        if earlier is None:
            return
        walked += 1
        for item in reversed((earlier.get("response") or {}).get("output") or ()):
            yield item
        for item in reversed(earlier.get("input") or ()):
            yield item
        previous = earlier.get("previous")


async def listing(record: dict[str, Any], read: ReadRecord, page: Page) -> dict[str, Any]:
    """One page of the response's input items, in OpenAI's list shape."""
    chain = newest_first(record, read)
    if not page.descending:  # oldest first: the whole chain, then turned round
        oldest_first = [item async for item in chain][::-1]
        chain = _replayed(oldest_first)
    items: list[dict[str, Any]] = []
    found = page.after is None
    async with aclosing(chain):
        async for item in chain:  # read only as far as the page reaches
            if found:
                items.append(item)
                if len(items) > page.limit:
                    break
            found = found or item.get("id") == page.after
    if not found:
        raise InvalidRequest(
            f"No input item with id '{page.after}' in this response.",
            param="after",
            code="invalid_value",
        )
    shown = [_shown(item, page.image_urls) for item in items[: page.limit]]
    return {
        "object": "list",
        "data": shown,
        "first_id": shown[0].get("id") if shown else None,
        "last_id": shown[-1].get("id") if shown else None,
        "has_more": len(items) > page.limit,
    }


async def _replayed(items: list[dict[str, Any]]) -> AsyncGenerator[dict[str, Any], None]:
    for item in items:
        yield item


def _shown(item: dict[str, Any], image_urls: bool) -> dict[str, Any]:
    """The item as listed: an image part's URL only where `include` asked for it."""
    content = item.get("content")
    if image_urls or not isinstance(content, list):
        return item
    if not any(isinstance(p, dict) and "image_url" in p for p in content):
        return item
    parts = [
        {k: v for k, v in p.items() if k != "image_url"} if isinstance(p, dict) else p
        for p in content
    ]
    return {**item, "content": parts}
