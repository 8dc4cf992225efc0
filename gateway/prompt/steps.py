"""The pipeline's prefix steps, between the session and the tier: the request made
byte-stable (canonical tools, volatile values moved out of the system prompt), a session's
prefix changes reported, and the prefix blocks that cache-aware routing matches against
what each replica holds.
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.chat.inbound import InboundRequest
from gateway.policy import Endpoint
from gateway.policy.canonicalize import CanonicalizeSpec
from gateway.policy.routing import RoutingSpec
from gateway.policy.schema import ModelSpec
from gateway.prompt.blocks import client_conversation, conversation_key, request_blocks
from gateway.prompt.canonical import Canonicalizer, Fingerprint, fingerprint
from gateway.prompt.prefix_watch import FingerprintStore
from gateway.routing.costs import RouteRequest
from gateway.sessions.ids import SessionRef
from gateway.telemetry.metrics import GatewayMetrics
from gateway.tenants.cache_scope import CacheScope, client_salt


class PrefixSteps:
    def __init__(
        self,
        routing: RoutingSpec,
        canonicalize: CanonicalizeSpec,
        models: Mapping[str, ModelSpec],
        fingerprints: FingerprintStore,
        metrics: GatewayMetrics,
    ) -> None:
        """`canonicalize`: the policy's setting; a model's own (`models.<alias>.canonicalize`)
        replaces it for that alias."""
        self._routing = routing
        self._prefix_routing = routing.strategy == "cache_aware"
        self._fingerprints = fingerprints
        self._metrics = metrics
        # One canonicalizer (and tool cache) per distinct setting, not per model alias.
        shared = Canonicalizer(canonicalize)
        self._canonical = {
            alias: Canonicalizer(model.canonicalize) if model.canonicalize else shared
            for alias, model in models.items()
        }

    def canonicalize(self, request: InboundRequest) -> tuple[InboundRequest, bytes | None]:
        """The canonical request, and its tools serialised (prefix hashing reuses them)."""
        if request.endpoint is not Endpoint.chat:
            return request, None
        canonical = self._canonical[request.model].apply(request.body)
        if canonical.body is not None:
            request = request.with_body(canonical.body)
        return request, canonical.tools_json

    async def changes(self, request: InboundRequest, session: SessionRef | None) -> list[str]:
        """Which parts of the session's prefix (system prompt, tools) changed since its
        previous turn; none outside a session."""
        if session is None:
            return []
        if not self._canonical[request.model].spec.detect_prefix_changes:
            return []
        current = fingerprint(request.body)
        previous_text = await self._fingerprints.swap(
            session.id, current.encode(), tenant=session.tenant
        )
        previous = Fingerprint.decode(previous_text) if previous_text else None
        changes = current.changes_from(previous) if previous else []
        for part in changes:
            self._metrics.prefix_changes.labels(request.model, part).inc()
        return changes

    def scoped(self, request: InboundRequest, scope: CacheScope) -> tuple[InboundRequest, int]:
        """The request in its tenant's cache scope (gateway/tenants/cache_scope.py): sent with
        the scope's `cache_salt`, the client's own folded in, never the client's as is; and
        the seed of its prefix block ids."""
        if request.endpoint is Endpoint.embeddings:
            return request, 0
        salted = scope.salted(client_salt(request.body))
        if salted.salt is None:
            return request, 0
        return request.with_body({**request.body, "cache_salt": salted.salt}), salted.seed

    def route_request(
        self,
        request: InboundRequest,
        session: str | None,
        tools_json: bytes | None,
        tenant: str,
        seed: int = 0,
    ) -> RouteRequest:
        """What replica choice reads: the prefix blocks (cache-aware routing only) in the
        keyspace of the request's cache scope (`seed`), and the conversation the request
        continues: named by our header, or by the client's own `prompt_cache_key`, or
        implicit."""
        blocks: tuple[int, ...] = ()
        if self._prefix_routing and request.endpoint is not Endpoint.embeddings:
            blocks = request_blocks(
                request.body, self._routing.block_bytes, tools_json, request.messages_json, seed
            )
            if session is None:
                session = client_conversation(request.body)
            if session is None and self._routing.implicit_sessions:
                session = conversation_key(request.body, blocks)
        return RouteRequest(blocks, session, tenant)
