"""Reading the request log (or a dataset export) back: one JSON object per line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class LogLineError(ValueError):
    """A line that is not JSON: the file is not a request log."""


def read_entries(path: str | Path) -> Iterator[dict[str, Any]]:
    """Each line's object; blank lines and lines holding anything but an object skipped."""
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except json.JSONDecodeError as exc:
                raise LogLineError(f"{path}:{number}: not JSON ({exc})") from exc
            if isinstance(entry, dict):
                yield entry
