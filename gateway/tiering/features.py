"""What the learned tier router reads off a prompt: hashed words and a few counted facts.

A prompt becomes two things, both cheap enough for the request path (well under a
millisecond for the few kilobytes read):

- hashed tokens: lower-cased words and numbers of the question, adjacent word pairs, and
  the words of multiple-choice options (marked apart, since "A. 4" says something other
  than "4 apples"), folded into `2**bits` slots by CRC-32 (the hashing trick: no
  vocabulary to ship, and unseen words land on slots whose weights are near zero). Values
  are log counts scaled to unit length, so a long prompt does not outvote a short one;
- numeric features: sizes and counts that describe how much work a question asks for
  (length, sentences, quantities, operators, negations, two-part questions), which carry
  across subjects where words do not; those that only measure how much work a question
  asks for (`DIFFICULTY_NAMES`) are all the router's difficulty head reads.

Only the first `HEAD_CHARS` and last `TAIL_CHARS` characters are read: the question and
its options sit at the ends of a long prompt, and the cap bounds the decision time.
"""

from __future__ import annotations

import math
import re
import zlib
from collections import Counter
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

# Bump when the features change meaning: an artifact records the version it was trained on.
FEATURES_VERSION = 1

HEAD_CHARS = 2048
TAIL_CHARS = 512

_OPTION = re.compile(r"^\s*\(?([A-J])[.):]\s*(.*)$")
_TOKEN = re.compile(r"[a-z]+|\d+(?:[.,]\d+)*|[^\sa-z\d]")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_SENTENCE_END = re.compile(r"[.?!](?:\s|$)")
_PAIR_MARKER = re.compile(r"\b\w+ [12] \|")  # "Statement 1 |", "Scenario 2 |"

_PAIR_MIX = 0x9E3779B1
_OPTION_MIX = 0x5BD1E995
_UPPER = re.compile(r"[A-Z]")
_MATH_SYMBOL = re.compile(r"[-+*/=^<>√∑∫×÷≤≥∞π]")
_NEGATIONS = frozenset({"not", "except", "false", "least", "incorrect", "never", "cannot"})
_FIRST_PERSON = frozenset({"i", "me", "my"})


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_NUMBER_WORDS = _words(
    "one two three four five six seven eight nine ten eleven twelve twenty thirty forty "
    "fifty hundred thousand million twice thrice half double triple quarter third dozen "
    "dozens pair percent"
)
_STEP_WORDS = _words(
    "each twice half remaining total per every times more less left rest average cost "
    "costs spent profit altogether"
)

NUMERIC_NAMES: tuple[str, ...] = (
    "log_chars",
    "log_words",
    "sentences",
    "clauses",
    "numbers",
    "distinct_numbers",
    "quantities",
    "largest_number",
    "decimals",
    "digit_ratio",
    "math_symbols",
    "negations",
    "step_words",
    "first_person",
    "question_marks",
    "upper_ratio",
    "long_words",
    "mean_word_length",
    "non_ascii",
    "lines",
    "pair_markers",
    "has_dollar",
    "has_percent",
    "has_options",
    "numeric_options",
    "option_length",
    "paired_options",
)


# How much work a question asks for, read the same way in any domain (no subject words, no
# answer-format or style cues): the difficulty head of `gateway.offline.route_train.train`
# sees only these.
_DIFFICULTY = _words(
    "log_words sentences clauses numbers distinct_numbers quantities step_words question_marks"
)
DIFFICULTY_NAMES = tuple(name for name in NUMERIC_NAMES if name in _DIFFICULTY)


@dataclass(frozen=True)
class PromptFeatures:
    slots: npt.NDArray[np.int64]  # hashed slots, distinct
    values: npt.NDArray[np.float64]  # their values, unit length
    numeric: tuple[float, ...]  # in NUMERIC_NAMES order


def readable_part(text: str) -> str:
    if len(text) <= HEAD_CHARS + TAIL_CHARS:
        return text
    return text[:HEAD_CHARS] + "\n" + text[-TAIL_CHARS:]


def split_question(text: str) -> tuple[str, list[str]]:
    """The question and its multiple-choice options (`A. ...` lines at the end, before an
    optional `Answer:` line); no options for an open question."""
    lines = text.strip().split("\n")
    if lines and lines[-1].strip().lower().startswith("answer"):
        lines.pop()
    options: list[str] = []
    while lines and (match := _OPTION.match(lines[-1])):
        options.append(match.group(2))
        lines.pop()
    options.reverse()
    return "\n".join(lines), options


_NO_SLOTS = np.zeros(0, dtype=np.int64)
_NO_VALUES = np.zeros(0, dtype=np.float64)


def extract(text: str, bits: int, *, words: bool = True) -> PromptFeatures:
    """`words=False`: the numeric features only (a router without word weights)."""
    question, options = split_question(readable_part(text))
    tokens = _TOKEN.findall(question.lower())
    counts = Counter(tokens)
    if words:
        slots, values = _hashed(tokens, counts, options, (1 << bits) - 1)
    else:
        slots, values = _NO_SLOTS, _NO_VALUES
    return PromptFeatures(slots, values, _numeric(len(text), question, counts, options))


def _hashed(
    tokens: list[str], counts: Counter[str], options: list[str], mask: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    # Each distinct word is hashed once; positions index into those hashes.
    index = {token: i for i, token in enumerate(counts)}
    codes = np.fromiter((zlib.crc32(t.encode()) for t in counts), np.uint64, len(counts))
    sequence = codes[np.fromiter((index[t] for t in tokens), np.int64, len(tokens))]
    # A pair's slot mixes its words' hashes (only the low bits are kept, so numpy's
    # wrap-around gives the same slots as exact arithmetic); option words are offset by a
    # constant so "4" as an answer and "4" in the question differ.
    pairs = (sequence[:-1] * np.uint64(_PAIR_MIX)) ^ sequence[1:]
    option_words = [t for option in options for t in _TOKEN.findall(option.lower())]
    in_options = np.fromiter(
        (zlib.crc32(t.encode()) ^ _OPTION_MIX for t in option_words), np.uint64, len(option_words)
    )
    every = np.concatenate([sequence, pairs, in_options]) & np.uint64(mask)
    slots, repeats = np.unique(every.astype(np.int64), return_counts=True)
    values = np.log1p(repeats.astype(np.float64))
    norm = float(np.sqrt(values @ values)) or 1.0
    return slots, values / norm


def _numeric(
    prompt_chars: int, question: str, counts: Counter[str], options: list[str]
) -> tuple[float, ...]:
    words = letters = long_words = 0
    for token, n in counts.items():
        if token.isalpha():
            words += n
            letters += len(token) * n
            long_words += n * (len(token) >= 9)
    numbers = _NUMBER.findall(question)
    magnitudes = [float(n.replace(",", "")) for n in numbers if n.count(".") <= 1]
    chars = max(1, len(question))
    log = math.log1p
    sentences = len(_SENTENCE_END.findall(question))

    def tally(vocabulary: frozenset[str]) -> int:
        return sum(counts.get(w, 0) for w in vocabulary)

    values = {
        "log_chars": log(prompt_chars),
        "log_words": log(words),
        "sentences": log(sentences),
        "clauses": log(sentences + question.count(",") + question.count(";")),
        "numbers": log(len(numbers)),
        "distinct_numbers": log(len(set(numbers))),
        "quantities": log(len(numbers) + tally(_NUMBER_WORDS)),
        "largest_number": log(max(magnitudes, default=0.0)),
        "decimals": log(sum("." in n for n in numbers)),
        "digit_ratio": sum(map(question.count, "0123456789")) / chars,
        "math_symbols": log(len(_MATH_SYMBOL.findall(question))),
        "negations": log(tally(_NEGATIONS)),
        "step_words": log(tally(_STEP_WORDS)),
        "first_person": log(tally(_FIRST_PERSON)),
        "question_marks": log(question.count("?")),
        "upper_ratio": len(_UPPER.findall(question)) / chars,
        "long_words": long_words / max(1, words),
        "mean_word_length": letters / max(1, words),
        "non_ascii": log(len(question) - len(question.encode("ascii", "ignore"))),
        "lines": log(question.count("\n")),
        "pair_markers": log(len(_PAIR_MARKER.findall(question)) if "|" in question else 0),
        "has_dollar": float("$" in question),
        "has_percent": float("%" in question),
        "has_options": float(bool(options)),
        "numeric_options": sum(map(_is_number, options)) / len(options) if options else 0.0,
        "option_length": log(sum(map(len, options)) / len(options)) if options else 0.0,
        # "True, False" / "Wrong, Not wrong": one answer judges two claims at once.
        "paired_options": (
            sum("," in o and len(o) < 30 for o in options) / len(options) if options else 0.0
        ),
    }
    return tuple(values[name] for name in NUMERIC_NAMES)


def _is_number(option: str) -> bool:
    return _NUMBER.fullmatch(option.strip().strip("$%").strip()) is not None
