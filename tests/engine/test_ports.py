"""Ports for servers about to start (engine/supervisor.py `free_port`)."""

from __future__ import annotations

import random
import socket
from collections.abc import Iterator

import pytest

from engine import supervisor
from engine.supervisor import _ephemeral_start, free_port


def test_free_ports_are_below_the_ephemeral_range_distinct_and_bindable() -> None:
    """An outgoing connection's local end never takes them while a server loads."""
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(1024 <= port < _ephemeral_start() for port in ports)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", ports[0]))


def _candidates(monkeypatch: pytest.MonkeyPatch, ports: list[int]) -> None:
    """free_port's random draws come from `ports`, in order. The ports handed out so far
    in this process are set aside for the test: which numbers earlier tests drew is
    chance, and a test that counted on a neighbour being unused failed in CI."""
    monkeypatch.setattr(supervisor, "_handed_out", set())
    draws: Iterator[int] = iter(ports)
    monkeypatch.setattr(random, "randrange", lambda low, high: next(draws))


def _kernel_port() -> int:
    """A port nothing listens on now (the kernel's choice, released at once)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_a_port_in_use_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        taken: int = listener.getsockname()[1]
        spare = _kernel_port()
        _candidates(monkeypatch, [taken, taken, spare])
        assert free_port() == spare


def test_a_port_already_handed_out_is_not_handed_out_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first, second = _kernel_port(), _kernel_port()
    _candidates(monkeypatch, [first, first, second])
    assert free_port() == first
    assert free_port() == second  # `first` is still free, but a server may be about to bind it
