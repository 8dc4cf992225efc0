"""Shared fixtures, and the markers that say what a test needs beyond Python.

Redis is real: the one this machine kind runs at 127.0.0.1:6379, or `REDIS_URL`, or a
redis-server this suite starts itself when neither answers. Tests are marked `redis` and
`process` at collection (see `pytest_collection_modifyitems`), so `-m "not redis and not
process"` selects the ones that need neither."""

from __future__ import annotations

import inspect
import os
import socket
import subprocess
import tempfile
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.lifeline import Lifeline
from engine.supervisor import free_port
from gateway.state.store import redis_server_binary

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = ROOT.parent / "shared" / "data"


def _redis_answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@pytest.fixture(scope="session")
def engine_lifeline() -> Iterator[Lifeline]:
    """The reaper every engine the suite starts is held by: the engines die with the test
    process however it ends, a killed pytest included (engine/lifeline.py)."""
    lifeline = Lifeline.start()
    try:
        yield lifeline
    finally:
        lifeline.close()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    if url := os.environ.get("REDIS_URL"):
        yield url
        return
    if _redis_answers("127.0.0.1", 6379):
        yield "redis://127.0.0.1:6379/9"
        return
    binary = redis_server_binary()
    if binary is None:
        pytest.fail("no Redis at 127.0.0.1:6379 and no redis-server to start")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="agw-redis-") as tmp:
        proc = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", tmp],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            for _ in range(100):
                if _redis_answers("127.0.0.1", port):
                    break
                time.sleep(0.05)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            proc.terminate()
            proc.wait(timeout=10)


# --- Markers: what a test needs, found from what it calls --------------------------------

# Callables that start a long-lived OS process (one-shot commands run to completion, such as
# `kubectl kustomize` or a HEALTHCHECK probe, are not counted), and what each one needs.
PROCESS_STARTERS: dict[str, frozenset[str]] = {
    "subprocess.Popen": frozenset({"process"}),
    "asyncio.subprocess.create_subprocess_exec": frozenset({"process"}),
    "tests.integration.conftest.running_gateway": frozenset({"process"}),  # `gateway serve`
    "tests.fault.harness.running_upstreams": frozenset({"process"}),  # fake engines
    "tests.phoenix.running_phoenix": frozenset({"process"}),  # Arize Phoenix
    "tests.browser.chromium_page": frozenset({"process"}),  # headless Chromium
    "engine.supervisor.up": frozenset({"process"}),  # engine replicas
    "tests.integration.test_redis_cluster._start_cluster": frozenset({"process", "redis"}),
    "gateway.state.store.EmbeddedRedis": frozenset({"process", "redis"}),
    "tests.lifetimes.started_parent": frozenset({"process"}),  # a parent to kill
}
# Fixtures whose needs are stated rather than found: `redis_url` starts a redis-server only
# where no Redis answers, which is what `redis` already says.
FIXTURE_NEEDS: dict[str, frozenset[str]] = {"redis_url": frozenset({"redis"})}
# Tests that start a process where no name shows it: a StateStore whose spec has no
# redis_url starts an embedded redis-server.
STARTS_PROCESS_UNSEEN: dict[str, frozenset[str]] = {
    "tests/unit/state/test_state_store.py::test_embedded_store_is_durable_across_restarts": (
        frozenset({"process", "redis"})
    ),
    "tests/unit/state/test_state_store.py::test_a_second_gateway_on_a_served_state_directory_is_refused": (
        frozenset({"process", "redis"})
    ),
    "tests/unit/state/test_state_store.py::test_the_embedded_server_dies_with_its_gateway_even_by_sigkill": (
        frozenset({"process", "redis"})
    ),
    "tests/unit/lifetime/test_startup.py::test_a_gateway_refused_its_state_directory_says_so_in_one_line": (
        frozenset({"process", "redis"})
    ),
    "tests/unit/lifetime/test_startup.py::test_a_start_up_that_fails_late_leaves_the_state_directory_free": (
        frozenset({"process", "redis"})
    ),
    # `gateway serve --workers 2` starts its workers.
    "tests/unit/edge/test_workers.py::test_workers_that_cannot_start_are_not_restarted": (
        frozenset({"process"})
    ),
}
_STARTER_NAMES = frozenset(name.rsplit(".", 1)[1] for name in PROCESS_STARTERS)


def _qualified_name(obj: object) -> str:
    return f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}"


def _names_used(code: types.CodeType) -> set[str]:
    """Global and attribute names a function's code uses, its nested functions included."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names_used(const)
    return names


def _needs_of(func: Callable[..., Any], seen: set[int]) -> set[str]:
    """The markers `func` needs: from the starters it names, and, recursively, from what the
    helpers under tests/ that it names need (code outside tests/ counts only as a starter)."""
    func = inspect.unwrap(func)
    code = getattr(func, "__code__", None)
    if code is None or id(func) in seen:
        return set()
    seen.add(id(func))
    scope: dict[str, Any] = getattr(func, "__globals__", {})
    names = _names_used(code)
    used = [scope[name] for name in names if name in scope]
    # `subprocess.Popen`, `harness.running_upstreams`: attributes of imported modules. Only
    # these are looked up, as a module's `__getattr__` may warn (and warnings are errors).
    for module in [value for value in used if isinstance(value, types.ModuleType)]:
        ours = module.__name__.startswith("tests.")
        for name in names:
            if (ours or name in _STARTER_NAMES) and hasattr(module, name):
                used.append(getattr(module, name))
    needs: set[str] = set()
    for obj in used:
        needs |= PROCESS_STARTERS.get(_qualified_name(obj), frozenset())
        if not getattr(obj, "__module__", "").startswith("tests."):
            continue
        if inspect.isclass(obj):
            for member in vars(obj).values():
                if inspect.isfunction(member):
                    needs |= _needs_of(member, seen)
        elif inspect.isfunction(obj):
            needs |= _needs_of(obj, seen)
    return needs


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by these markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks each test with what it needs: `redis` when it takes the `redis_url` fixture,
    directly or through its fixtures (their closure is all in `name2fixturedefs`), and
    `process` (with `redis` for a redis-server) when it starts one of PROCESS_STARTERS in
    its body, its fixtures or the test helpers they call."""
    for item in items:
        needs = set(STARTS_PROCESS_UNSEEN.get(item.nodeid, frozenset()))
        if not isinstance(item, pytest.Function):
            continue
        seen: set[int] = set()
        needs |= _needs_of(item.function, seen)
        for name, defs in item._fixtureinfo.name2fixturedefs.items():
            if name in FIXTURE_NEEDS:
                needs |= FIXTURE_NEEDS[name]
                continue
            for fixture in defs:
                needs |= _needs_of(fixture.func, seen)
        for marker in sorted(needs):
            item.add_marker(marker)
