"""The dashboard page in a real headless Chromium, fed a fixed `/dashboard/data` from a tiny
local server: every card draws, the numbers printed are the payload's, nothing leaves
127.0.0.1, a failing data endpoint shows the error state while polling carries on, and a
payload of nulls draws without a single exception."""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson
import pytest
from playwright.sync_api import Page

from gateway.dashboard import PAGE
from tests.browser import PageLog, chromium_page, save_screenshot

# Every element that must reach data-ready="1" once the fixture has been drawn.
READY = (
    "stat-requests",
    "stat-rps",
    "stat-ttft",
    "stat-cache-hit",
    "stat-cost",
    "stat-saved",
    "rps-chart",
    "ttft-chart",
    "cache-chart",
    "savings",
    "tier-chart",
    "breakers",
    "replica-table",
    "spec-decoding",
)
NOW = 1_764_500_000.0
# The page polls this fast in tests (`?interval=`), so error-then-recovery takes well under 2 s.
PAGE_PATH = "/dashboard?interval=200"


def _bucket(i: int) -> dict[str, Any]:
    t = NOW - 300 + i * 5
    if i == 31:  # an idle bucket: no requests, so no latency or cache figures either
        return {
            "t": t,
            "requests": 0,
            "rps": 0.0,
            "errors": 0,
            "ttft_p50_ms": None,
            "ttft_p95_ms": None,
            "prompt_tokens": 0,
            "cached_prompt_tokens": 0,
            "cache_hit_ratio": None,
        }
    rps = 4.2 + 1.6 * math.sin(i / 6) + 0.5 * math.sin(i / 1.7)
    requests = round(rps * 5)
    prompt = requests * 420
    cached = round(prompt * (0.58 + 0.14 * math.sin(i / 8)))
    return {
        "t": t,
        "requests": requests,
        "rps": requests / 5,
        "errors": 1 if i in (17, 44) else 0,
        "ttft_p50_ms": round(34 + 5 * math.sin(i / 5) + 2 * math.sin(i / 1.3), 1),
        "ttft_p95_ms": round(82 + 18 * math.sin(i / 4) + 6 * math.sin(i / 1.9), 1),
        "prompt_tokens": prompt,
        "cached_prompt_tokens": cached,
        "cache_hit_ratio": cached / prompt,
    }


FIXTURE: dict[str, Any] = {
    "now": NOW,
    "window_s": 300,
    "bucket_s": 5,
    "series": [_bucket(i) for i in range(60)],
    "totals": {
        "requests": 1284,
        "errors": 3,
        "prompt_tokens": 539_280,
        "cached_prompt_tokens": 323_568,
        "completion_tokens": 41_088,
        "cache_hit_ratio": 0.6,
        "cost_usd": 0.1234,
        "saved_usd": {"cache": 0.0412, "trimming": 0.0087, "small_tier": 0.0225},
        "saved_tokens": {"cache": 323_568, "trimming": 58_200, "small_tier": 150_000},
    },
    "tiers": {"small": 871, "large": 413},
    "replicas": [
        {
            "id": "tiny-chat/0",
            "pool": "tiny-chat",
            "url": "http://127.0.0.1:8001",
            "healthy": True,
            "breaker": "closed",
            "inflight": 3,
            "requests": 702,
            "context_tokens": 16384,
            "engine": {
                "waiting": 0,
                "running": 3,
                "kv_cache_usage": 0.34,
                "prefix_cache_hit_ratio": 0.71,
                "spec_acceptance_rate": 0.62,
                "spec_mean_accepted_length": 2.48,
            },
        },
        {
            "id": "tiny-chat/1",
            "pool": "tiny-chat",
            "url": "http://127.0.0.1:8002",
            "healthy": True,
            "breaker": "half-open",
            "inflight": 1,
            "requests": 169,
            "engine": {
                "waiting": 2,
                "running": 1,
                "kv_cache_usage": 0.78,
                "prefix_cache_hit_ratio": 0.58,
                "spec_acceptance_rate": 0.55,
                "spec_mean_accepted_length": 2.1,
            },
        },
        {
            "id": "big-chat/0",
            "pool": "big-chat",
            "url": "http://127.0.0.1:8003",
            "healthy": False,
            "breaker": "open",
            "inflight": 0,
            "requests": 413,
            "engine": None,
        },
    ],
}
NULLS: dict[str, Any] = {
    "now": None,
    "window_s": None,
    "bucket_s": None,
    "series": [dict.fromkeys(_bucket(0)) for _ in range(3)],
    "totals": {
        "requests": None,
        "errors": None,
        "prompt_tokens": None,
        "cached_prompt_tokens": None,
        "completion_tokens": None,
        "cache_hit_ratio": None,
        "cost_usd": None,
        "saved_usd": {"cache": None, "trimming": None, "small_tier": None},
        "saved_tokens": None,
    },
    "tiers": {"small": None},
    "replicas": [
        {
            "id": None,
            "pool": None,
            "url": None,
            "healthy": None,
            "breaker": None,
            "inflight": None,
            "requests": None,
            "engine": dict.fromkeys(FIXTURE["replicas"][0]["engine"]),
        }
    ],
}
EMPTY: dict[str, Any] = {
    "now": NOW,
    "window_s": 300,
    "bucket_s": 5,
    "series": [],
    "totals": {},
    "tiers": {},
    "replicas": [],
}


@dataclass
class DataReply:
    """What the fake `/dashboard/data` answers; a test may change it while the page polls."""

    status: int = 200
    body: bytes = orjson.dumps(FIXTURE)


@dataclass
class Site:
    base: str
    reply: DataReply


def _handler(reply: DataReply) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/dashboard":
                self._send(200, "text/html; charset=utf-8", PAGE)
            elif path == "/dashboard/data":
                self._send(reply.status, "application/json", reply.body)
            else:
                self._send(404, "text/plain", b"not found")

        def _send(self, status: int, content_type: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the browser's requests are in PageLog; stderr noise helps nobody

    return Handler


@pytest.fixture
def site() -> Iterator[Site]:
    reply = DataReply()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(reply))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Site(f"http://127.0.0.1:{server.server_address[1]}", reply)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _text(page: Page, selector: str) -> str:
    return page.locator(selector).inner_text().strip()


def _wait_until(page: Page, ready: Callable[[], bool], timeout_s: float = 10.0) -> None:
    # Playwright delivers page events while it waits, so sleep through the page, not time.
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            pytest.fail("timed out waiting for the page")
        page.wait_for_timeout(50)


def _assert_offline_clean(log: PageLog) -> None:
    assert log.page_errors == []
    assert log.blocked == []
    assert log.foreign_requests() == []


def test_dashboard_draws_every_card_from_the_fixture(site: Site) -> None:
    log = PageLog()
    with chromium_page(log) as page:
        page.goto(site.base + PAGE_PATH)
        for testid in READY:
            page.wait_for_selector(f'[data-testid="{testid}"][data-ready="1"]')
        page.wait_for_selector('[data-testid="status"][data-state="ok"]')

        assert _text(page, '[data-testid="stat-cache-hit"] .value') == "60.0%"
        assert _text(page, '[data-testid="stat-saved"] .value') == "$0.0724"
        assert _text(page, '[data-testid="stat-cost"] .value') == "$0.1234"
        assert _text(page, '[data-testid="stat-requests"] .value') == "1,284"
        cache_row = _text(page, '[data-testid="savings-row"][data-kind="cache"]')
        assert "$0.0412" in cache_row
        assert "323.6k tokens" in cache_row
        assert "68%" in _text(page, '[data-testid="tier-row"][data-tier="small"]')
        badges = page.locator('[data-testid="breaker-badge"]')
        assert {
            badges.nth(i).get_attribute("data-replica"): badges.nth(i).get_attribute("data-state")
            for i in range(badges.count())
        } == {"tiny-chat/0": "closed", "tiny-chat/1": "half-open", "big-chat/0": "open"}
        assert page.locator('[data-testid="replica-row"]').count() == 3
        first = _text(page, '[data-testid="replica-row"][data-replica="tiny-chat/0"]')
        assert first.rstrip().endswith("16.4k")  # its engine's context window
        second = _text(page, '[data-testid="replica-row"][data-replica="tiny-chat/1"]')
        assert second.rstrip().endswith("—")  # not reported (yet)
        assert "2.48" in _text(page, '[data-testid="spec-row"][data-replica="tiny-chat/0"]')
        # Two lines per chart, TTFT's broken by the idle bucket: a path per segment.
        assert page.locator('[data-testid="ttft-chart"] path').count() >= 4

        save_screenshot(page, "dashboard-fixture")

    _assert_offline_clean(log)
    assert log.console_errors == []
    assert log.requests_to("/dashboard/data")


def test_failing_data_endpoint_shows_the_error_state_and_polling_recovers(site: Site) -> None:
    site.reply.status = 500
    site.reply.body = b'{"error": "boom"}'
    log = PageLog()
    with chromium_page(log) as page:
        page.goto(site.base + PAGE_PATH)
        page.wait_for_selector('[data-testid="status"][data-state="error"]')
        assert "HTTP 500" in _text(page, '[data-testid="status"]')
        assert "HTTP 500" in _text(page, '[data-testid="error-banner"]')
        assert page.locator("[data-ready]").count() == 0
        # It keeps asking while the endpoint fails...
        _wait_until(page, lambda: len(log.requests_to("/dashboard/data")) >= 3)
        save_screenshot(page, "dashboard-error")
        # ...and draws as soon as it answers again.
        site.reply.status = 200
        site.reply.body = orjson.dumps(FIXTURE)
        page.wait_for_selector('[data-testid="status"][data-state="ok"]')
        page.wait_for_selector('[data-testid="rps-chart"][data-ready="1"]')
        assert page.locator('[data-testid="error-banner"]').is_hidden()

    _assert_offline_clean(log)
    # Chromium itself logs each failed fetch; anything else on the console is the page's fault.
    assert log.console_errors
    assert all(re.search(r"status of 500", m) for m in log.console_errors), log.console_errors


@pytest.mark.parametrize("payload", [NULLS, EMPTY, {}], ids=["nulls", "empty", "bare"])
def test_payload_of_nulls_and_empties_draws_without_errors(
    site: Site, payload: dict[str, Any]
) -> None:
    site.reply.body = orjson.dumps(payload)
    log = PageLog()
    with chromium_page(log) as page:
        page.goto(site.base + PAGE_PATH)
        page.wait_for_selector('[data-testid="status"][data-state="ok"]')
        assert page.locator("[data-ready]").count() == 0
        assert _text(page, '[data-testid="stat-cache-hit"] .value') == "—"

    _assert_offline_clean(log)
    assert log.console_errors == []


def test_page_references_nothing_outside_itself() -> None:
    html = PAGE.decode()
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", html)
    assert not re.search(r"""url\(\s*["']?(?:https?:)?//""", html)
    assert "@import" not in html
    assert "<script src" not in html
