"""The app with the engine twin (tests/unit/anthropic/twin.py) and a real Redis."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from gateway.policy import parse_policy
from tests.fakes import FakeUpstream
from tests.unit.anthropic.twin import engine
from tests.unit.clients import TINY_POLICY, OpenGateways


@pytest.fixture
def gateways() -> Iterator[OpenGateways]:
    opened = OpenGateways()
    yield opened
    opened.close_all()


@pytest.fixture
def app(redis_url: str, gateways: OpenGateways) -> tuple[TestClient, FakeUpstream]:
    policy = parse_policy(TINY_POLICY + f"state: {{redis_url: '{redis_url}'}}\n")
    return gateways.open(policy, engine)
