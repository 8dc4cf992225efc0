"""Headless-Chromium harness for page tests: Debian's /usr/bin/chromium driven by Python
Playwright (no `playwright install`, nothing downloaded), with every page request recorded and
anything not bound for a local host refused, so a page that reaches for a CDN fails its test
instead of quietly working only online."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import ConsoleMessage, Page, Route, sync_playwright
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Request as PlaywrightRequest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
)
ARTIFACTS = Path(__file__).resolve().parent / "browser-artifacts"
LOCAL_HOSTS = frozenset({"127.0.0.1"})
# Schemes that never leave the browser (the page's inline favicon is a data: URL).
_IN_BROWSER_SCHEMES = frozenset({"data", "blob", "about"})


@dataclass
class PageLog:
    """What a page did while under test: console errors, uncaught exceptions, every request
    it made, and the requests refused for going to a host outside `LOCAL_HOSTS`."""

    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)

    def foreign_requests(self) -> list[str]:
        return [url for url in self.requests if not is_local(url)]

    def requests_to(self, path: str) -> list[str]:
        return [url for url in self.requests if urlsplit(url).path == path]


def is_local(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme in _IN_BROWSER_SCHEMES or parts.hostname in LOCAL_HOSTS


@contextmanager
def chromium_page(
    log: PageLog | None = None, *, width: int = 1440, height: int = 900, timeout_ms: float = 10_000
) -> Iterator[Page]:
    """A fresh page in a fresh headless Chromium, closed on exit. What the page does is recorded
    in `log` (pass one to read it); requests to any host but 127.0.0.1 are aborted and listed
    in `log.blocked`."""
    if not CHROMIUM.is_file():
        pytest.fail(
            f"{CHROMIUM} is missing: browser tests need Debian's chromium (make test installs it)"
        )
    log = log if log is not None else PageLog()

    def on_console(msg: ConsoleMessage) -> None:
        if msg.type == "error":
            log.console_errors.append(msg.text)

    def on_page_error(err: PlaywrightError) -> None:
        log.page_errors.append(f"{err.name}: {err.message}")

    def on_request(request: PlaywrightRequest) -> None:
        log.requests.append(request.url)

    def guard(route: Route) -> None:
        url = route.request.url
        if is_local(url):
            route.continue_()
        else:
            log.blocked.append(url)
            route.abort("blockedbyclient")

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=list(CHROMIUM_ARGS)
        )
        try:
            context = browser.new_context(viewport={"width": width, "height": height})
            context.set_default_timeout(timeout_ms)
            context.route("**/*", guard)
            page = context.new_page()
            page.on("console", on_console)
            page.on("pageerror", on_page_error)
            page.on("request", on_request)
            yield page
            context.close()
        finally:
            browser.close()


def save_screenshot(page: Page, name: str) -> Path:
    """Full-page PNG at tests/browser-artifacts/<name>.png, for a human to look at."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
