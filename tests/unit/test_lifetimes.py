"""What benchmarks and tests start never outlives them: a process killed with SIGKILL runs
no `finally`, and the reaper it started (`tests.lifetimes.suite_reaper`, engine/lifeline.py)
stops its servers all the same: the overhead benchmark's mock engines and targets, and the
tests' fault upstreams (as `running_gateway`, the Redis Cluster nodes and Phoenix). The
headless Chromium of the page tests is Playwright's: its driver exits when the test
process's end closes its stdin, and closes the browser first."""

from __future__ import annotations

from pathlib import Path

from engine.lifeline import GRACE_S
from tests.lifetimes import kill_and_wait_gone, started_parent

BENCH = """
import pathlib, sys
from tests.bench.overhead.targets import start_mock
mock = start_mock(0.0, pathlib.Path(sys.argv[1]))
print(mock.process.proc.pid, flush=True)
sys.stdin.read()  # until it is killed
"""


TEST = """
import pathlib, sys
from tests.fault.harness import FaultUpstream
from engine.supervisor import free_port
upstream = FaultUpstream("engine", free_port(), pathlib.Path(sys.argv[1]) / "upstream.log")
upstream.start()
print(upstream.proc.pid, flush=True)
sys.stdin.read()  # until it is killed
"""


BROWSER = """
import os, pathlib, sys
from tests.browser import chromium_page

def descendants(pid):
    for child in pathlib.Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        yield int(child)
        yield from descendants(int(child))

with chromium_page() as page:
    page.set_content("<p>open</p>")
    browser = next(
        pid for pid in descendants(os.getpid())
        if os.path.realpath(f"/proc/{pid}/exe") == "/usr/lib/chromium/chromium"  # the browser
    )
    print(browser, flush=True)
    sys.stdin.read()  # until it is killed
"""


def test_a_killed_test_process_leaves_no_fault_upstream_behind(tmp_path: Path) -> None:
    pytest_like, upstream = started_parent(TEST, str(tmp_path))
    kill_and_wait_gone(pytest_like, upstream, timeout_s=GRACE_S + 5)


def test_a_killed_benchmark_leaves_no_server_behind(tmp_path: Path) -> None:
    bench, mock = started_parent(BENCH, str(tmp_path))
    kill_and_wait_gone(bench, mock, timeout_s=GRACE_S + 5)


def test_a_killed_page_test_leaves_no_chromium_behind() -> None:
    page_test, browser = started_parent(BROWSER)
    kill_and_wait_gone(page_test, browser, timeout_s=10)
