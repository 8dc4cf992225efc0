"""Gateways under test: a real app (and real Redis) with the engine replaced by its twin."""

from __future__ import annotations

from collections.abc import Callable

from starlette.testclient import TestClient

from gateway.app import create_app
from gateway.policy import Policy
from gateway.state.store import StateStore
from tests.fakes import Call, FakeUpstream, Scripted

# One pool of one replica (the engine twin stands in for it), served as model `tiny`.
TINY_POLICY = """\
version: 1
pools:
  chat: {served_model: served-tiny, replicas: [{url: "http://a.test:1"}]}
models:
  tiny: {pool: chat}
"""


class OpenGateways:
    """Opens gateways on demand; `close_all` shuts every one down (lifespan included)."""

    def __init__(self) -> None:
        self._open: list[TestClient] = []

    def open(
        self, policy: Policy, script: Callable[[Call], Scripted]
    ) -> tuple[TestClient, FakeUpstream]:
        fake = FakeUpstream(script)
        client = TestClient(create_app(policy, upstream=fake, store=StateStore(policy.state)))
        client.__enter__()
        self._open.append(client)
        return client, fake

    def close_all(self) -> None:
        for client in self._open:
            client.__exit__(None, None, None)
