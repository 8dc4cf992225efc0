"""Credentials kept out of everything the gateway writes: log lines, the request log and
span attributes (captured prompts included).

`redact(text)` replaces what looks like a credential with `[REDACTED]`:

- the token after `Bearer` or `Basic` (an Authorization header's value),
- OpenAI-style keys, `sk-...` (the gateway's own keys look so too),
- a long token (16 characters or more) after a name such as `key=`, `api_key:`,
  `"token": "`, `secret=`, `password=` or `authorization:`,
- a URL's password (`redis://:PASSWORD@host`, `https://user:PASSWORD@host`).

The gateway never logs a request's headers or keys itself (gateway/edge/auth.py holds only
digests); this is the second line: a key an agent pasted into a prompt, a URL with
`?api_key=` in an access log line, a library's exception text. `RedactingFilter` applies
`redact` to every log record that reaches a handler; `gateway serve` installs it on every
handler (`install_log_redaction`, `redacting_log_config` for uvicorn's own).
"""

from __future__ import annotations

import copy
import logging
import re
from typing import Any

REDACTED = "[REDACTED]"

_SECRET = re.compile(
    r"""
    (?P<scheme>\b(?:bearer|basic)\s+)[A-Za-z0-9._~+/=-]{6,}
    | (?-i:\bsk-[A-Za-z0-9_-]{6,})
    | (?P<name>\b(?:api[_-]?key|access[_-]?token|refresh[_-]?token|token|secret|password
                   |passwd|key|authorization)(?:\\?["'])?\s*[:=]\s*(?:\\?["'])?)
      [A-Za-z0-9._~+/=-]{16,}
    """,
    re.IGNORECASE | re.VERBOSE,
)


def _replace(match: re.Match[str]) -> str:
    return (match.group("scheme") or match.group("name") or "") + REDACTED


# A URL's password: `scheme://user:PASSWORD@`. Its own pattern, tried only on text that
# holds both "://" and "@": as one more branch of `_SECRET` it made every call 1.4x slower.
_URL_PASSWORD = re.compile(r"(?P<userinfo>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/@:]*:)[^\s/@]+(?=@)")


# Where a `_SECRET` match can begin: the first letters of each of its branches, lowercase.
# `_SECRET.sub` tries every branch at every position of a text: 2.8 ms for a 26 KB
# tau-bench conversation (captured with content on), 7 us for a log line. Found with
# `str.find` and tried only there: 0.28 ms and 2 us (2026-12-07, best of 5).
_CAN_START = (
    "bearer", "basic", "sk-", "api", "access", "refresh", "token", "secret", "passw", "key",
    "authorization",
)  # fmt: skip


def redact(text: str) -> str:
    """`text` with every credential-like token replaced by `[REDACTED]`: what
    `_SECRET.sub(_replace, text)` returns, with `_SECRET` tried only where a match may
    begin."""
    lowered = text.lower()
    if len(lowered) != len(text):  # a character whose lowercase is two: positions move
        text = _SECRET.sub(_replace, text)
    else:
        text = _redact_at(text, _starts(lowered))
    if "@" in text and "://" in text:
        text = _URL_PASSWORD.sub(rf"\g<userinfo>{REDACTED}", text)
    return text


def _starts(lowered: str) -> list[int]:
    """Every position where one of `_CAN_START` begins, in order."""
    found: list[int] = []
    for word in _CAN_START:
        at = lowered.find(word)
        while at >= 0:
            found.append(at)
            at = lowered.find(word, at + 1)
    found.sort()
    return found


def _redact_at(text: str, starts: list[int]) -> str:
    parts: list[str] = []
    kept = 0  # text[:kept] is in `parts`
    for start in starts:
        if start < kept:
            continue  # inside a credential already replaced
        found = _SECRET.match(text, start)
        if found is not None:
            parts += (text[kept:start], _replace(found))
            kept = found.end()
    if not parts:
        return text
    parts.append(text[kept:])
    return "".join(parts)


class RedactingFilter(logging.Filter):
    """Redacts a record's message, its arguments and its traceback in place; drops nothing.

    Arguments are redacted one by one and kept apart from the message where that is
    enough, because some formatters (uvicorn's access log) read them back one by one."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        args = record.args
        if isinstance(args, tuple):
            record.args = tuple(_redacted_arg(arg) for arg in args)
        elif isinstance(args, dict):
            record.args = {key: _redacted_arg(arg) for key, arg in args.items()}
        if record.args:
            # A credential split between the format and an argument ("Bearer %s"):
            # only the merged message shows it, so the merged message is kept instead.
            message = record.getMessage()
            clean = redact(message)
            if clean != message:
                record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            # Formatted now, so the text handlers print is the redacted one.
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


def _redacted_arg(arg: Any) -> Any:
    if arg is None or isinstance(arg, int | float):  # bool is an int
        return arg
    text = arg if isinstance(arg, str) else str(arg)
    clean = redact(text)
    # An object whose text held nothing secret keeps its own formatting (%r, %d, ...).
    return clean if clean != text or isinstance(arg, str) else arg


def install_log_redaction(*logger_names: str) -> None:
    """Put a `RedactingFilter` on every handler of the named loggers, by default the root
    logger's (a handler's filters see the records propagated from every logger below)."""
    redacting = RedactingFilter()
    for name in logger_names or ("",):
        for handler in logging.getLogger(name).handlers:
            if not any(isinstance(f, RedactingFilter) for f in handler.filters):
                handler.addFilter(redacting)


def redacting_log_config(config: dict[str, Any]) -> dict[str, Any]:
    """A `logging.config.dictConfig` mapping (such as uvicorn's) with a `RedactingFilter`
    on every handler it defines."""
    out = copy.deepcopy(config)
    out.setdefault("filters", {})["redact"] = {"()": RedactingFilter}
    for handler in out.get("handlers", {}).values():
        handler["filters"] = [*handler.get("filters", []), "redact"]
    return out
