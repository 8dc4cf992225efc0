"""What the three languages share: the vocabulary, the report one analysis fills, and the
way code found inside code is handed to its own language's reader.

Findings are short reasons for a person who decides (`shutil.rmtree(...) deletes files`,
`rm -rf /`, `DROP TABLE users`): at most MAX_FINDINGS (8), each at most MAX_FINDING_CHARS
(120) characters, control characters escaped, at least one for every effect found. The
most destructive come first (drops_tables, deletes, unparsable ... reads).

Code inside code crosses languages (Python's `os.system("...")` is read as shell, shell's
`python -c` as Python), so `nested` looks the reader of a language up in READERS, which the
package's `__init__` fills once every language's module is imported. This module imports
none of them, and they import each other only one way: python_code reads the literal word
list of `subprocess.run(["rm", "x"])` with shell_code's `read_command`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal, get_args

Language = Literal["python", "shell", "sql"]
Effect = Literal[
    "reads", "writes_files", "deletes", "spawns_processes", "network", "drops_tables",
    "unparsable",
]  # fmt: skip
EFFECTS: tuple[Effect, ...] = get_args(Effect)
MAX_FINDINGS = 8
MAX_FINDING_CHARS = 120
# bash -c inside bash -c inside ...: each level re-parses a substring, so three bound the
# work to a few times one parse of the whole argument.
MAX_NESTING = 3

# A person reads the findings: the most destructive reasons come first.
_PRESENTATION: Final[tuple[Effect, ...]] = (
    "drops_tables", "deletes", "unparsable", "spawns_processes", "network", "writes_files",
    "reads",
)  # fmt: skip

# The effects a command or statement has, for the languages' tables.
READS: Final[tuple[Effect, ...]] = ("reads",)
WRITES: Final[tuple[Effect, ...]] = ("writes_files",)
DELETES: Final[tuple[Effect, ...]] = ("deletes",)
SPAWNS: Final[tuple[Effect, ...]] = ("spawns_processes",)
NETWORK: Final[tuple[Effect, ...]] = ("network",)
NOTHING: Final[tuple[Effect, ...]] = ()


@dataclass(frozen=True)
class Analysis:
    """What the code would do, and why, for the policy and the person it may ask."""

    effects: frozenset[Effect]
    findings: tuple[str, ...]  # at most MAX_FINDINGS, each at most MAX_FINDING_CHARS long


class Report:
    """The effects one analysis found, with the first reason for each and a few more."""

    def __init__(self) -> None:
        self._first: dict[Effect, str] = {}
        self._more: list[str] = []
        self._offered = 0

    def add(self, effect: Effect, reason: str) -> None:
        self._offered += 1
        reason = _clip(reason)
        if effect not in self._first:
            self._first[effect] = reason
        elif len(self._more) < MAX_FINDINGS and reason not in {*self._more, *self._first.values()}:
            self._more.append(reason)

    def wants(self, effect: Effect) -> bool:
        """Whether a reason for `effect` would still be shown: rendering one can cost more
        than finding it (SQL is regenerated from its tree). One reason to read is enough."""
        if effect not in self._first:
            return True
        enough = len(self._more) >= MAX_FINDINGS or self._offered >= 4 * MAX_FINDINGS
        return effect != "reads" and not enough

    def unparsable(self, language: str, exc: BaseException) -> None:
        self.add("unparsable", f"{language} not parsed: {why(exc)}")

    def analysis(self) -> Analysis:
        firsts = [self._first[effect] for effect in _PRESENTATION if effect in self._first]
        findings = dict.fromkeys([*firsts, *self._more])  # one command can be two effects
        return Analysis(frozenset(self._first), tuple(findings)[:MAX_FINDINGS])


# A language's reader: adds to the report what the code does, `depth` levels inside code.
Reader = Callable[[str, Report, int], None]

# By language; filled by the package's __init__ (see the module docstring).
READERS: dict[str, Reader] = {}


def nested(language: Language, code: str, report: Report, depth: int) -> None:
    """Code found inside code (bash -c, eval, python -c ...), one level further down."""
    if depth >= MAX_NESTING:
        report.add("unparsable", f"{language} nested more than {MAX_NESTING} deep: not parsed")
    elif code.strip():
        READERS[language](code, report, depth + 1)


def unparsable(reason: str) -> Analysis:
    return Analysis(frozenset({"unparsable"}), (_clip(reason),))


def why(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _clip(text: str) -> str:
    # Findings end up in approval screens and log lines: a newline or an escape sequence
    # from the code must not forge or hide anything there.
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:MAX_FINDING_CHARS])
    if len(shown) <= MAX_FINDING_CHARS and len(text) <= MAX_FINDING_CHARS:
        return shown
    return shown[: MAX_FINDING_CHARS - 3] + "..."


def each(effect: Effect, *names: str) -> dict[str, Effect]:
    return dict.fromkeys(names, effect)


def commands(effects: tuple[Effect, ...], *names: str) -> dict[str, tuple[Effect, ...]]:
    return dict.fromkeys(names, effects)
