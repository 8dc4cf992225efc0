"""The layout stays true: the folders of gateway/ are its architecture, and these rules keep
them honest. Read from the source with `ast` (nothing is imported), so a rule broken by an
import inside a function fails here too.

- No cycles between packages: each folder can be read (and changed) knowing only the folders
  it imports.
- `gateway/offline/` (training, evaluation, replay) is never imported by serving code: only
  by `gateway/cli/`, which starts those tools.
- The request path's pure parts do no I/O: `prompt/` and `routing/` import no HTTP client,
  no Redis, nothing that serves (but for the prefix watch, whose fingerprints every
  gateway shares through Redis).
- `upstream/` (talking to one engine) imports nothing above it: only `errors` and the
  chat shapes.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GATEWAY = ROOT / "gateway"

# What talks to the network, a database or serves HTTP: never in the pure steps.
_IO = ("aiohttp", "httpx", "redis", "uvicorn", "fastapi", "starlette", "socket")
_SHARED_STATE = {"gateway.prompt.prefix_watch"}


def _module_of(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_of(module: str) -> str:
    """`gateway.routing.costs` -> `routing`; a root module (the spine) is its own name."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


@cache
def _imports() -> dict[str, set[str]]:
    """Every gateway module and the modules (any, not only gateway's) it imports."""
    graph: dict[str, set[str]] = {}
    for path in sorted(GATEWAY.rglob("*.py")):
        module = _module_of(path)
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
                names |= {f"{node.module}.{alias.name}" for alias in node.names}
        graph[module] = names
    return graph


def _gateway_imports(module: str) -> Iterator[str]:
    graph = _imports()
    for name in _imports()[module]:
        if name in graph:  # a module (not a name imported from one)
            yield name


def _package_graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for module in _imports():
        source = _package_of(module)
        for target in map(_package_of, _gateway_imports(module)):
            if source and target and target != source:
                edges.setdefault(source, set()).add(target)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Each elementary cycle's nodes once (Tarjan's strongly connected components of size
    more than one: enough to name the packages caught in one)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def _why(source: str, target: str) -> list[str]:
    """The module imports that make package `source` depend on package `target`."""
    return sorted(
        f"{module} -> {name}"
        for module in _imports()
        if _package_of(module) == source
        for name in _gateway_imports(module)
        if _package_of(name) == target
    )


def test_no_package_imports_itself_through_another() -> None:
    edges = _package_graph()
    cycles = _cycles(edges)
    explained = [
        (
            cycle,
            [line for a in cycle for b in cycle if b in edges.get(a, ()) for line in _why(a, b)],
        )
        for cycle in cycles
    ]
    assert not cycles, f"package cycles: {explained}"


def test_serving_never_imports_the_offline_tools() -> None:
    offenders = sorted(
        f"{module} -> {name}"
        for module in _imports()
        if _package_of(module) not in {"offline", "cli"}
        for name in _gateway_imports(module)
        if _package_of(name) == "offline"
    )
    assert not offenders


def test_the_pure_steps_do_no_io() -> None:
    offenders = sorted(
        f"{module} -> {name}"
        for module in _imports()
        if _package_of(module) in {"prompt", "routing"} and module not in _SHARED_STATE
        for name in _imports()[module]
        if name.split(".")[0] in _IO
    )
    assert not offenders


def test_upstream_imports_nothing_above_it() -> None:
    allowed = {"gateway.errors", "gateway.chat"}
    offenders = sorted(
        f"{module} -> {name}"
        for module in _imports()
        if _package_of(module) == "upstream"
        for name in _gateway_imports(module)
        if _package_of(name) != "upstream" and not name.startswith(tuple(allowed))
    )
    assert not offenders


def test_the_root_holds_only_the_spine() -> None:
    """Everything but the request path's spine lives in a folder named for what it owns."""
    spine = {
        "__init__", "__main__", "app", "errors", "headers", "periodic", "pipeline",
        "reload", "request_context", "runtime",
        "session_steps",  # the pipeline's checkpoint step: it knows dispatches and tiers
        "tool_call_steps",  # the pipeline's re-asks and escalations: they dispatch again
        "fallback_steps",  # the pipeline's wider windows and fallbacks: tiers and dispatches
        "call",  # the values the pipeline's steps pass along
    }  # fmt: skip
    assert {path.stem for path in GATEWAY.glob("*.py")} <= spine
