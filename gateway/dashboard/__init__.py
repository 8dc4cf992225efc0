"""The live dashboard: one self-contained HTML page (inline CSS and JS, no CDN) that polls
`GET /dashboard/data` and draws its own SVG charts, so it works on an offline box."""

from __future__ import annotations

from pathlib import Path

# Read once at import: the page is static, and serving it must not touch the disk per request.
PAGE: bytes = (Path(__file__).parent / "page.html").read_bytes()

__all__ = ["PAGE"]
