"""Ports for servers about to start (engine/supervisor.py `free_port`)."""

from __future__ import annotations

import random
import socket

import pytest

from engine.supervisor import _ephemeral_start, free_port


def test_free_ports_are_below_the_ephemeral_range_distinct_and_bindable() -> None:
    """An outgoing connection's local end never takes them while a server loads."""
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(1024 <= port < _ephemeral_start() for port in ports)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", ports[0]))


def test_a_port_in_use_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        taken = free_port()
        listener.bind(("127.0.0.1", taken))
        listener.listen()
        tries = iter([taken, taken, taken - 1])
        monkeypatch.setattr(random, "randrange", lambda low, high: next(tries))
        assert free_port() == taken - 1
