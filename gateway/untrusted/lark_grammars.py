"""Lark grammars a client gives its custom tools, run with a bound: compiled and matched by
llguidance, the Rust library OpenAI documents its custom tools' Lark dialect against
(and which vLLM's `guidance` backend runs).

Python's `lark` would not do: its lexer is one Python `re` of every terminal, and a
terminal is a client's regex (`/(a+)+b/` backtracks for seconds). llguidance's lexer is
built from regex derivatives, its parser is an Earley parser whose work per byte is capped
(`step_max_items`), and building a grammar spends bounded fuel; a grammar or an input past
a cap puts the matcher in an error state instead of running on. On top of that:

- a grammar of more than `GRAMMAR_CHARS` characters is not compiled (the custom tool
  describes it only, as before: gateway/chat/custom_tools.py);
- an input is matched for at most `MATCH_BUDGET_S` (50 ms) of CPU, looking at the clock
  between chunks: past it, it "could not be checked", which the tool-call check counts
  as a failed check, like a schema too costly to apply (gateway/untrusted/schemas.py).
  Measured here (2026-12-07, a slow hour): about 1 us a byte for a plain grammar, so
  inputs of tens of KB are matched whole; an ambiguous grammar (`x: x x | "a"`) runs
  into the budget after about 300 bytes.

Compiled grammars are kept by their text (agents send the same tools every turn); each
match runs on a fresh copy of the compiled matcher.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Any

import llguidance

GRAMMAR_CHARS = 8_000
# The string schema's keyword that carries a Lark grammar (JSON Schema has none): a custom
# tool's input has it (gateway/chat/custom_tools.py), the tool-call check applies it.
GRAMMAR_KEYWORD = "x-grammar"
MATCH_BUDGET_S = 0.050
# Bytes consumed between looks at the clock: few at first (a byte of an ambiguous grammar
# can cost ~0.1 ms), twice as many after each chunk that took under a millisecond.
_FIRST_CHUNK, _LAST_CHUNK = 16, 4_096
_LIMITS = llguidance.LLParserLimits(
    initial_lexer_fuel=200_000,  # building the lexer's first states: ~4 ms (50k/ms)
    step_lexer_fuel=20_000,
    step_max_items=2_000,  # Earley items per byte: ~0.1 ms (20k/ms)
    max_lexer_states=20_000,  # 1-2 kB each
    max_grammar_size=100_000,
)


class UnusableGrammar(Exception):
    """The grammar does not compile, or is too large to be run with a bound."""


class _Bytes:
    """A tokenizer whose tokens are the 256 bytes: a grammar matched byte by byte, as the
    text is, whatever model wrote it."""

    def __init__(self) -> None:
        self.eos_token_id = 256
        self.bos_token_id = None
        self.special_token_ids = [256]
        self.tokens = [bytes([b]) for b in range(256)] + [b"<eos>"]

    def __call__(self, text: bytes) -> list[int]:
        return list(text)


_TOKENIZER = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes()))


@dataclass(frozen=True)
class LarkGrammar:
    _matcher: Any  # llguidance.LLMatcher, compiled, never consumed from

    def mismatch(self, text: str) -> str | None:
        """Why `text` is not a sentence of the grammar, or None when it is."""
        matcher = self._matcher.deep_copy()
        data = text.encode()
        clock = time.process_time
        start, chunk, now = 0, _FIRST_CHUNK, clock()
        spent = now + MATCH_BUDGET_S
        while start < len(data):
            if not matcher.consume_tokens(list(data[start : start + chunk])):
                return f"it breaks the tool's grammar at byte {_failed_at(matcher, start)}"
            start += chunk
            before, now = now, clock()
            if now > spent:
                return "it could not be checked against the tool's grammar within its bound"
            if now - before < 0.001:
                chunk = min(chunk * 2, _LAST_CHUNK)
        if not matcher.is_accepting():
            return "it ends before the tool's grammar is complete"
        return None


def _failed_at(matcher: Any, start: int) -> int:
    """The byte the match failed at, as llguidance reports it (else the chunk's start)."""
    error = matcher.get_error()
    marker = " bytes;"
    at = error.find(marker)
    digits = error[:at].rsplit(" ", 1)[-1] if at > 0 else ""
    return int(digits) if digits.isascii() and digits.isdigit() else start


@functools.lru_cache(maxsize=64)
def lark_grammar(definition: str) -> LarkGrammar:
    """The grammar compiled, or UnusableGrammar saying why not (in llguidance's words, the
    first line: where the grammar is wrong)."""
    if len(definition) > GRAMMAR_CHARS:
        raise UnusableGrammar(f"longer than {GRAMMAR_CHARS:,} characters")
    grammar = llguidance.LLMatcher.grammar_from_lark(definition)
    matcher = llguidance.LLMatcher(_TOKENIZER, grammar, log_level=0, limits=_LIMITS)
    if matcher.is_error():
        raise UnusableGrammar(matcher.get_error().strip().splitlines()[0][:300])
    return LarkGrammar(matcher)
