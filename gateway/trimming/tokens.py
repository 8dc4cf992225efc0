"""Token counts for budgets and reports.

The engine model's own `tokenizer.json` (HF `tokenizers`, offline) when the policy names
it; else tiktoken's o200k_base from the encoding file shipped in this package (it cannot be
downloaded at run time); an estimate of one token per 4 bytes only if that fails to load,
labelled as such wherever it is reported.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Protocol

from gateway.chat.messages import Message


class TokenCounter(Protocol):
    name: str

    def count(self, text: str) -> int: ...

    def encode(self, text: str) -> list[int]: ...


class HFTokenizer:
    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(path))
        self.name = f"tokenizer.json ({path})"

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self._tokenizer.encode(text, add_special_tokens=False).ids
        return ids

    def count(self, text: str) -> int:
        return len(self.encode(text))


SHIPPED_ENCODINGS = Path(__file__).parent / "encodings"


class TiktokenCounter:
    """tiktoken's o200k_base from the file shipped in gateway/trimming/encodings/."""

    def __init__(self) -> None:
        import tiktoken

        # tiktoken finds its files through this variable; set only while loading, so the
        # process's own setting (if any) is left as it was.
        previous = os.environ.get("TIKTOKEN_CACHE_DIR")
        os.environ["TIKTOKEN_CACHE_DIR"] = str(SHIPPED_ENCODINGS)
        try:
            self._encoding = tiktoken.get_encoding("o200k_base")
        finally:
            if previous is None:
                del os.environ["TIKTOKEN_CACHE_DIR"]
            else:
                os.environ["TIKTOKEN_CACHE_DIR"] = previous
        self.name = "tiktoken o200k_base"

    def encode(self, text: str) -> list[int]:
        return self._encoding.encode(text, disallowed_special=())

    def count(self, text: str) -> int:
        return len(self.encode(text))


class ByteEstimate:
    """One token per 4 UTF-8 bytes; `encode` yields one pseudo-token per 4-byte chunk so
    prefix-cache estimates still work."""

    name = "estimate (4 bytes per token)"

    def encode(self, text: str) -> list[int]:
        data = text.encode()
        return [hash(data[i : i + 4]) for i in range(0, len(data), 4)]

    def count(self, text: str) -> int:
        return (len(text.encode()) + 3) // 4


@functools.cache
def token_counter(tokenizer_json: str | None) -> TokenCounter:
    if tokenizer_json:
        return HFTokenizer(Path(tokenizer_json))
    try:
        return TiktokenCounter()
    except (ImportError, OSError, ValueError):  # not installed, or the file is damaged
        return ByteEstimate()


def message_text(message: Message) -> str:
    """The text of a message as a chat template renders it, near enough for budgets."""
    parts = [str(message.get("role", ""))]
    content = message.get("content")
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):
        parts.extend(str(p.get("text", "")) for p in content if isinstance(p, dict))
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        parts.append(f"{function.get('name')}({function.get('arguments')})")
    return "\n".join(parts)
