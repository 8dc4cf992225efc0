"""Regexes from clients and policies run with RE2: linear in the text whatever the pattern,
refused with RE2's reason when they need backtracking, and silent about it on stderr."""

from __future__ import annotations

import re

import pytest

from gateway.policy.volatile_presets import PRESETS
from gateway.untrusted.regex import LinearRegex, UnsafePattern
from tests.unit.deadline import deadline

BACKTRACKING = r"^(a+)+b$|^a*$"  # Python's `re`: 7.5 s on 28 `a`s, forever on 10,000


@pytest.mark.parametrize("length", [28, 10_000, 1_000_000])
def test_a_backtracking_pattern_runs_in_linear_time(length: int) -> None:
    regex = LinearRegex(BACKTRACKING)
    with deadline():
        found = [
            regex.search("a" * length),
            regex.search("a" * length + "c"),
            regex.fullmatch("a" * length + "b"),
        ]
    assert found == [True, False, True]


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        (r"(a)\1", "invalid escape sequence: \\1"),
        (r"(?=a)b", "invalid perl operator: (?="),
        (r"(?<!a)b", "invalid perl operator: (?<!"),
        (r"a\Z", "invalid escape sequence: \\Z"),
        ("[", "missing ]: ["),
        ("a{1001}", "invalid repetition size: {1001}"),
    ],
)
def test_a_pattern_that_needs_backtracking_is_refused_with_the_reason(
    pattern: str, reason: str, capfd: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(UnsafePattern) as refused:
        LinearRegex(pattern)
    assert refused.value.reason == reason
    assert refused.value.pattern == pattern
    assert capfd.readouterr().err == ""  # RE2's own logging is off


def test_a_pattern_too_large_for_its_memory_bound_is_refused(
    capfd: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(UnsafePattern, match="pattern too large"):
        LinearRegex(r"\pL{1000}")  # RE2 with default options logs this one to stderr
    assert capfd.readouterr().err == ""


def test_search_fullmatch_and_sub_behave_as_in_re() -> None:
    regex = LinearRegex(r"[A-Z]{3}-\d{4}")
    assert regex.search("id ABC-1234 here")
    assert not regex.fullmatch("id ABC-1234 here")
    assert regex.fullmatch("ABC-1234")
    assert regex.sub(lambda found: f"<{found}>", "x ABC-1234 y DEF-5678") == (
        "x <ABC-1234> y <DEF-5678>"
    )
    assert LinearRegex("é+").sub(lambda found: str(len(found)), "aééb") == "a2b"
    assert LinearRegex("a") == LinearRegex("a")
    assert LinearRegex("a") != LinearRegex("b")


SAMPLES = [
    "Today is 2024-05-17, it is 09:30 UTC (or 9:30 am), at 2024-05-17T09:30:00Z.",
    "Trace req-AbC123xyz and run_99887766 for 123e4567-e89b-12d3-a456-426614174000.",
    "Times: 23:59:59.123+02:00, 7:05PM, 12:00 Z; not a date: 12024-05-171.",
    "nothing volatile here, only words and 12 numbers",
]


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_the_volatile_presets_find_what_python_re_found(name: str) -> None:
    """They run on every client's system prompt; RE2 finds the same values in it (on ASCII
    text: RE2's `\\d` and `\\b` are ASCII, Python's are Unicode)."""
    regex, python = LinearRegex(PRESETS[name]), re.compile(PRESETS[name])
    for text in SAMPLES:
        assert matches(regex, text) == [found.group(0) for found in python.finditer(text)]


def matches(regex: LinearRegex, text: str) -> list[str]:
    found: list[str] = []

    def keep(value: str) -> str:
        found.append(value)
        return value

    regex.sub(keep, text)
    return found
