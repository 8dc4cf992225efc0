"""Shared fixtures. Redis is real: the one this machine kind runs at 127.0.0.1:6379, or
`REDIS_URL`, or a redis-server this suite starts itself when neither answers."""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

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
