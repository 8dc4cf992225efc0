"""Named regexes for volatile prompt content, usable in `canonicalize.volatile.patterns`."""

from __future__ import annotations

_TZ = r"(?:\s?(?:UTC|Z|[+-]\d{2}:?\d{2}))?"

PRESETS: dict[str, str] = {
    "date": r"\b\d{4}-\d{2}-\d{2}\b",
    "time": r"\b\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:\s?[AaPp][Mm])?" + _TZ + r"\b",
    "datetime": r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?",
    "uuid": r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b",
    "request_id": r"\b(?:req|request|trace|run)[-_][A-Za-z0-9]{6,}\b",
}
