"""Strict readings of text a client (or an operator's command line) sends: numbers, and
labels the gateway stores and writes into logs.

Numbers: Python's own tests are wider than HTTP's. `str.isdigit()` is True for `²` and
`①`, which `int()` then refuses (a ValueError that escaped as a 500), `int()` itself
reads `١٢` (Arabic-Indic), `１２` (full-width), ` 12 `, `+12` and `1_2` as 12, and it
refuses strings of more than 4,300 digits. A number here is ASCII `0-9` and nothing else.

Labels: a key's name or a reviewer's reason ends up in Redis, in `gateway keys list`, in
audit entries and log lines. A CR or LF in one would forge a line of its own there, and
other control characters (C0, DEL, C1, and the Unicode line and paragraph separators,
which some log viewers break lines on) hide or rewrite text on a terminal. They are
refused, not escaped: what was stored is then exactly what the client sent.
"""

from __future__ import annotations

import re

from gateway.errors import InvalidRequest

# Past this many digits a number is bigger than any count, size or index the gateway
# takes (10**18 < 2**63: it still fits a Redis integer), so it is read as that ceiling.
MAX_DIGITS = 18
HUGE: int = 10**MAX_DIGITS

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def ascii_number(text: str) -> int | None:
    """`text` as a whole number when it is one or more ASCII digits and nothing else;
    None otherwise. Past 18 digits, `HUGE`: whatever range the caller checks then
    refuses it as out of range, as its real value would be, at no cost."""
    if not text or not text.isascii() or not text.isdigit():
        return None
    if len(text.lstrip("0")) > MAX_DIGITS:
        return HUGE
    return int(text)


def control_character(text: str) -> str | None:
    """The first control character in `text` (C0, DEL, C1, U+2028, U+2029), as the
    escape a message can show (`\\n`, `\\x1b`, `\\u2028`); None when there is none."""
    found = _CONTROL.search(text)
    return None if found is None else repr(found.group())[1:-1]


def check_label(value: str, *, param: str) -> str:
    """A stored label with no control character in it; a 400 naming `param` otherwise."""
    if (bad := control_character(value)) is not None:
        raise InvalidRequest(
            f"`{param}` must not contain control characters (found `{bad}`): line breaks, "
            "tabs and the like would forge or hide lines where it is written.",
            param=param,
            code="invalid_value",
        )
    return value
