"""Every file of the repository that the docs, the README, the Makefile or a docstring or
comment names (`gateway/routing/router.py`, a test file, a manifest) exists:
a file moved or a test promised and never written fails here, not in a reader's hands.
The same for every `make` target they name."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A repository path with a file extension, not inside a longer path or URL.
NAMED = re.compile(
    r"(?<![A-Za-z0-9_./-])((?:gateway|engine|tests|deploy|policies|docs)/[A-Za-z0-9_./-]+"
    r"\.(?:py|yaml|yml|md|json|sh|jinja|txt|toml))"
)


def sources() -> list[Path]:
    found = [ROOT / "README.md", ROOT / "Makefile"]
    found += sorted((ROOT / "docs").rglob("*.md"))
    for folder in ("gateway", "engine", "tests"):
        found += sorted((ROOT / folder).rglob("*.py"))
    for folder in ("deploy", "policies"):
        found += sorted((ROOT / folder).rglob("*.yaml"))
    return found


def test_every_file_named_in_the_docs_and_the_code_exists() -> None:
    missing: dict[str, list[str]] = {}
    for source in sources():
        for path in NAMED.findall(source.read_text(encoding="utf-8", errors="replace")):
            if not (ROOT / path).exists():
                missing.setdefault(path, []).append(str(source.relative_to(ROOT)))
    assert not missing, missing


# A module named from inside the package (`routing/router.py`, `sessions/store.py`), as
# docstrings and tables do; vLLM's own files are named as `vllm/...`.
RELATIVE = re.compile(r"(?<![A-Za-z0-9_./-])([a-z_]+(?:/[a-z_0-9]+)*/[a-z_0-9]+\.py)\b")
_BASES = ("", "gateway", "engine", "tests", "tests/unit")
_ELSEWHERE = ("vllm/",)


def test_every_module_named_from_inside_its_package_exists() -> None:
    missing: dict[str, list[str]] = {}
    for source in sources():
        for path in RELATIVE.findall(source.read_text(encoding="utf-8", errors="replace")):
            if path.startswith(_ELSEWHERE):
                continue
            places = [ROOT / base / path for base in _BASES]
            places += [source.parent / path, source.parent.parent / path]
            if not any(place.exists() for place in places):
                missing.setdefault(path, []).append(str(source.relative_to(ROOT)))
    assert not missing, missing


def test_every_make_target_named_in_the_docs_and_the_code_exists() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([A-Za-z0-9_.-]+):", makefile, re.MULTILINE))
    named = re.compile(r"[`(]make ([a-z][a-z0-9-]*)(?![a-z0-9*-])")
    missing: dict[str, list[str]] = {}
    for source in sources():
        for target in named.findall(source.read_text(encoding="utf-8", errors="replace")):
            if target not in targets:
                missing.setdefault(target, []).append(str(source.relative_to(ROOT)))
    assert not missing, missing
