"""Clients' Lark grammars run with a bound (llguidance): a grammar that does not compile is
refused with its reason, an input is matched or told where it breaks, and neither a
backtracking terminal nor an ambiguous grammar holds the event loop."""

from __future__ import annotations

import time

import pytest

from gateway.untrusted.lark_grammars import (
    GRAMMAR_CHARS,
    MATCH_BUDGET_S,
    UnusableGrammar,
    lark_grammar,
)
from tests.grammars import APPLY_PATCH_LARK, PATCH

UPDATE = "*** Begin Patch\n*** Update File: a.py\n@@ def f():\n-    return 1\n+    return 2\n*** End Patch\n"


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (PATCH, None),
        (UPDATE, None),
        ("rm -rf /", "it breaks the tool's grammar at byte 0"),
        ("*** Begin Patch\n*** Add File: x\n", "it ends before the tool's grammar is complete"),
        ("*** Begin Patch\n*** Add File: x\nno plus\n", "it breaks the tool's grammar at byte 32"),
    ],
)
def test_codex_s_apply_patch_grammar_matches_patches_and_says_where_others_break(
    text: str, problem: str | None
) -> None:
    assert lark_grammar(APPLY_PATCH_LARK).mismatch(text) == problem


@pytest.mark.parametrize(
    ("definition", "reason"),
    [
        ("start: undefined_rule", "unknown name"),
        ('start: "a"\n' + "# padding\n" * GRAMMAR_CHARS, "longer than 8,000 characters"),
    ],
)
def test_a_grammar_that_cannot_run_is_refused_with_its_reason(definition: str, reason: str) -> None:
    with pytest.raises(UnusableGrammar, match=reason):
        lark_grammar(definition)


@pytest.mark.parametrize(
    ("definition", "text", "problem"),
    [
        # Python's re takes seconds on this terminal and input; llguidance's lexer does not
        # backtrack
        ("start: /(a+)+b/", "a" * 5_000, "it ends before the tool's grammar is complete"),
        # every split of the input is a parse: the Earley items per byte grow until the
        # budget stops the match
        ('start: x\nx: x x | "a"', "a" * 3_000, "it could not be checked against the tool's grammar within its bound"),
    ],
)  # fmt: skip
def test_hostile_grammars_end_within_their_bound(definition: str, text: str, problem: str) -> None:
    started = time.process_time()
    assert lark_grammar(definition).mismatch(text) == problem
    assert time.process_time() - started < 20 * MATCH_BUDGET_S  # bounded, not a timing target


def test_a_compiled_grammar_is_reused_and_each_match_starts_afresh() -> None:
    grammar = lark_grammar(APPLY_PATCH_LARK)
    assert lark_grammar(APPLY_PATCH_LARK) is grammar
    assert grammar.mismatch("rm") is not None
    assert grammar.mismatch(PATCH) is None  # the failed match left nothing behind
