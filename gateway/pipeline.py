"""The request path, top to bottom: parse, resolve the model, continue the session,
canonicalise, choose a tier and a replica, send, check the answer where it has checks
(escalating once), relay it, checkpoint the turn. Each step is a call into the module
that owns it.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from starlette.responses import Response

from gateway.approvals.gate import ApprovalGate, GateAnswer, Guard
from gateway.chat.inbound import InboundRequest, parse_request
from gateway.delivery.relay import RelayResponse, ReplayedStream, StreamRelay
from gateway.delivery.whole import Answer, read_answer
from gateway.errors import (
    ModelNotFound,
    NoHealthyReplica,
    OutputCheckFailed,
    Overloaded,
    UpstreamError,
)
from gateway.fleet.replicas import Fleet, Pool
from gateway.policy import Endpoint, Policy
from gateway.prompt.prefix_watch import FingerprintStore
from gateway.prompt.steps import PrefixSteps
from gateway.quota.service import Quota
from gateway.request_context import RequestContext
from gateway.resilience.dispatcher import Dispatch, Dispatcher
from gateway.resilience.response_cache import ResponseCache, cache_key
from gateway.routing.costs import RouteRequest
from gateway.routing.router import Decision, Router
from gateway.session_steps import Checkpointer, SessionSteps, report_turn
from gateway.sessions.ids import SessionRef
from gateway.sessions.turns import SessionTurns, Turn
from gateway.telemetry.metrics import GatewayMetrics
from gateway.telemetry.record import RequestRecord, ResultFacts
from gateway.tenants.identity import OPEN_ACCESS, TenantAccess
from gateway.tenants.settings import TenantPolicies
from gateway.tiering.chooser import TierChoice, TierChooser, load_learned_router
from gateway.tiering.stickiness import MemorySessionTiers
from gateway.upstream.client import Upstream

log = logging.getLogger(__name__)

# What makes a pool unable to answer, so that a fallback is tried: nothing reached the
# client yet. An engine's 4xx is the client's to fix and is passed on instead.
_CANNOT_ANSWER = (NoHealthyReplica, Overloaded, UpstreamError)

_UPSTREAM_PATHS = {
    Endpoint.chat: "/v1/chat/completions",
    Endpoint.completions: "/v1/completions",
    Endpoint.embeddings: "/v1/embeddings",
}


class Pipeline:
    def __init__(
        self,
        policy: Policy,
        fleet: Fleet,
        router: Router,
        upstream: Upstream,
        *,
        fingerprints: FingerprintStore,
        metrics: GatewayMetrics,
        sessions: SessionTurns | None = None,
        tiers: TierChooser | None = None,
        dispatcher: Dispatcher | None = None,
        answers: ResponseCache | None = None,
        tenants: TenantPolicies | None = None,
        approvals: ApprovalGate | None = None,
        quota: Quota | None = None,
    ) -> None:
        self._tiers = tiers or TierChooser(
            policy,
            fleet,
            memory=MemorySessionTiers(),
            cached_share=router.cached_share,
            load_scorer=load_learned_router,
        )
        self._sessions = SessionSteps(policy, sessions, metrics)
        self._policy = policy
        # Tool calls held for a person's approval; None (no cost) when the policy names none.
        self._approvals = approvals
        # Rate limits and budgets; a caller nothing limits costs a dict lookup.
        self._quota = quota
        # Each tenant's limits, fallbacks and tiers, merged once (gateway/tenants/settings.py).
        self.tenants = tenants or TenantPolicies(policy)
        self._fleet = fleet
        self._dispatcher = dispatcher or Dispatcher(policy, router, upstream, metrics)
        self._prefixes = PrefixSteps(policy, fingerprints, metrics)
        self._metrics = metrics
        # Kept deterministic answers, the last fallback (when the policy turns it on).
        self._answers = answers if policy.resilience.response_cache.enabled else None

    async def handle(
        self, endpoint: Endpoint, raw_body: bytes, context: RequestContext
    ) -> Response:
        record = context.record
        tenant = self.tenants.of(context.access.name)
        request = parse_request(endpoint, raw_body, tenant.limits)
        self._check_model(request.model, endpoint, context.access)
        if self._quota is not None:  # rate limits and budgets (gateway/quota/)
            grant = await self._quota.admit(
                request, len(raw_body), context.access, context.identity
            )
            if grant is not None:
                record.quota = grant  # the edge sends its headers and settles it
                request = grant.request  # another model when served over budget
        record.note_request(request)  # after the check: only known aliases become labels
        session = self._sessions.session_of(request, context)
        record.session = session.id if session else None
        with record.stage("hydrate"):
            turn, request, degraded = await self._sessions.hydrate(request, session, context)
        notes: dict[str, str] = {}
        if degraded and session is not None:  # served, not kept: the client is told
            record.degraded = "checkpoint"
            notes = {
                "X-Gateway-Session": session.id,
                "X-Gateway-Session-Turn": "unsaved",
                "X-Gateway-Degraded": "checkpoint",
            }
        request, hide_usage = _with_usage(request)
        guard = self._guard(request, session, context) if self._approvals is not None else None
        if guard is not None and (kept := await guard.resume(_client_usage(request, hide_usage))):
            return await self._answered_here(kept, request, turn, context, notes)
        with record.stage("canonicalise"):
            request, tools_json = self._prefixes.canonicalise(request)
        if prefix_changes := await self._prefixes.changes(request, session):
            notes["X-Gateway-Prefix-Change"] = ",".join(prefix_changes)
        request, cache_seed = self._prefixes.scoped(request, tenant.cache_scope)
        route = self._prefixes.route_request(
            request,
            session.id if session else context.session_id,
            tools_json,
            context.access.name,
            cache_seed,
        )
        with record.stage("choose_tier"):
            choice = await self._tiers.choose(
                request.model,
                endpoint,
                request.body,
                route,
                task=context.task,
                clamps=tenant.tier_clamps,
                response_schema=request.response_schema,
            )
        if choice.checks is not None or guard is not None:
            return await self._checked(
                request, route, context, choice, turn, hide_usage, notes, guard
            )
        answer_key = cache_key(request.body) if self._answers is not None else None
        try:
            choice, dispatch = await self._dispatch(choice, request, route, context)
        except _CANNOT_ANSWER:
            cached = await self._cached_answer(answer_key, request.model, choice, turn, context)
            if cached is None:
                raise
            return cached
        headers = self._dispatched(request, route, choice, dispatch, notes, record)
        checkpoint = None
        if turn is not None:
            headers["X-Gateway-Session"] = turn.session.id
            checkpoint = self._sessions.checkpointer(turn, request, choice, dispatch, context)
        if request.stream:
            return self._relay_stream(request, dispatch, headers, checkpoint, record, hide_usage)
        return await self._relay_whole(
            request, dispatch, headers, checkpoint, record, answer_key, context.access.name
        )

    async def _checked(
        self,
        request: InboundRequest,
        route: RouteRequest,
        context: RequestContext,
        choice: TierChoice,
        turn: Turn | None,
        hide_usage: bool,
        notes: dict[str, str],
        guard: Guard | None = None,
    ) -> Response:
        """An answer with checks is read whole and checked before the client sees it; one
        that fails moves up a tier once, and a failure with nowhere to go is an error. An
        answer that may call a tool needing approval is read whole too, and held if it does."""
        checks = choice.checks
        constrain = self._tiers.structured_outputs(request.model)
        escalated = False
        while True:
            engine_can = constrain and choice.pool.spec.structured_outputs
            sent = request
            if checks is not None:
                sent = request.with_body(checks.constrain(request.body, engine_can))
            choice, dispatch = await self._dispatch(choice, sent, route, context)
            headers = self._dispatched(request, route, choice, dispatch, notes, context.record)
            answer = await self._read_answer(sent, dispatch, context.record.result, hide_usage)
            problems = checks.problems(answer.reply) if checks else []
            if not problems:
                if checks:
                    outcome = "escalated" if escalated else "passed"
                    self._metrics.cascades.labels(request.model, outcome).inc()
                break
            for check, _ in problems:
                self._metrics.output_check_failures.labels(request.model, choice.tier, check).inc()
            failed = f"{problems[0][0]}: {problems[0][1]}"
            if choice.escalate_to is None:
                self._metrics.cascades.labels(request.model, "failed").inc()
                raise OutputCheckFailed(
                    f"The answer of tier `{choice.tier}` failed its checks: {failed}",
                    headers=choice.header_values(),
                )
            choice = self._tiers.escalated(request.model, choice, problems[0][0])
            context.record.escalating()
            escalated = True
        held = await guard.hold(answer, _client_usage(sent, hide_usage)) if guard else None
        if held is not None:
            answer = held.answer  # the client is told the call awaits approval instead
            headers.update(held.headers)
        if turn is not None:
            headers["X-Gateway-Session"] = turn.session.id
            commit = self._sessions.checkpointer(turn, request, choice, dispatch, context)
            turn_number = await commit(answer.reply, answer.usage)
            report_turn(headers, turn_number)
        return _whole(answer, headers)

    def _guard(
        self, request: InboundRequest, session: SessionRef | None, context: RequestContext
    ) -> Guard | None:
        """The request's guard when it may call a tool that needs approval."""
        if self._approvals is None or request.endpoint is not Endpoint.chat:
            return None
        return self._approvals.guard(
            request,
            session,
            tenant=context.access.name,
            request_id=context.request_id,
            record=context.record,
        )

    async def _answered_here(
        self,
        kept: GateAnswer,
        request: InboundRequest,
        turn: Turn | None,
        context: RequestContext,
        notes: dict[str, str],
    ) -> Response:
        """An approval's answer, given without the engine; kept in the session like any
        turn, so the history the client resends matches the stored one."""
        headers = {**notes, **kept.headers}
        if turn is not None:
            headers["X-Gateway-Session"] = turn.session.id
            route = {"answered_by": "gateway", "approval": kept.approval, "event": kept.event}
            commit = self._sessions.committer(turn, request, request.body, route, context)
            report_turn(headers, await commit(kept.answer.reply, kept.answer.usage))
        return _whole(kept.answer, headers)

    def _dispatched(
        self,
        request: InboundRequest,
        route: RouteRequest,
        choice: TierChoice,
        dispatch: Dispatch,
        notes: dict[str, str],
        record: RequestRecord,
    ) -> dict[str, str]:
        """Records the decisions; returns the headers that report them."""
        decision = dispatch.decision
        self._record_route(choice.pool, decision)
        self._metrics.tier_decisions.labels(request.model, choice.tier, choice.by).inc()
        record.tier, record.tier_by, record.tier_reason = choice.tier, choice.by, choice.reason
        record.fallback = choice.fallback
        record.blocks, record.route_session = route.blocks, route.session
        record.routed(
            decision.replica.id, choice.pool.name, decision.reason, decision.cached_blocks
        )
        return {**dispatch.headers(), **choice.header_values(), **notes}

    async def _read_answer(
        self,
        request: InboundRequest,
        dispatch: Dispatch,
        facts: ResultFacts,
        hide_usage: bool = False,
    ) -> Answer:
        return await read_answer(
            dispatch,
            facts,
            stream=request.stream,
            hide_usage=hide_usage,
            # Only logprobs chunks need fixing; every other answer passes byte for byte.
            conform=bool(request.body.get("logprobs")),
            idle_s=self._policy.timeouts.idle_s,
        )

    def _check_model(self, alias: str, endpoint: Endpoint, access: TenantAccess) -> None:
        """A model the tenant may not use is answered exactly as one that does not exist,
        and no error lists a model the tenant cannot see."""
        if access.models is None:
            self._tiers.check_model(alias, endpoint)
            return
        available = f" Available models: {', '.join(access.visible(self._fleet.descriptions))}."
        if not access.allows(alias):
            raise ModelNotFound(f"The model `{alias}` does not exist.{available}", param="model")
        try:
            self._tiers.check_model(alias, endpoint)
        except ModelNotFound as exc:
            message = exc.message.split(" Available models: ")[0] + available
            raise ModelNotFound(message, param="model") from None

    def _record_route(self, pool: Pool, decision: Decision) -> None:
        self._metrics.route_decisions.labels(pool.name, decision.reason).inc()
        if decision.total_blocks:
            blocks = self._metrics.prefix_blocks
            blocks.labels(pool.name, "yes").inc(decision.cached_blocks)
            blocks.labels(pool.name, "no").inc(decision.total_blocks - decision.cached_blocks)

    async def _dispatch(
        self,
        choice: TierChoice,
        request: InboundRequest,
        route: RouteRequest,
        context: RequestContext,
    ) -> tuple[TierChoice, Dispatch]:
        """Send to the chosen pool; when it cannot answer, to the model's fallbacks in turn
        (the tenant's own, and only models the tenant may use)."""
        try:
            return choice, await self._send(choice.pool, request, route, context)
        except _CANNOT_ANSWER as exc:
            failure = exc
        tenant = self.tenants.of(context.access.name)
        for fallback in tenant.fallbacks.get(request.model, ()):
            try:
                alternative = await self._tiers.choose(
                    fallback, request.endpoint, request.body, route, clamps=tenant.tier_clamps
                )
                dispatch = await self._send(alternative.pool, request, route, context)
            except _CANNOT_ANSWER as exc:
                log.warning("fallback %s of %s failed too: %s", fallback, request.model, exc)
                continue
            self._metrics.fallbacks.labels(request.model, fallback).inc()
            return replace(alternative, fallback=fallback), dispatch
        raise failure

    async def _send(
        self, pool: Pool, request: InboundRequest, route: RouteRequest, context: RequestContext
    ) -> Dispatch:
        headers = {"Content-Type": "application/json", "X-Request-Id": context.request_id}
        if request.stream:
            headers["Accept"] = "text/event-stream"
        return await self._dispatcher.send(
            pool,
            request.model,
            _UPSTREAM_PATHS[request.endpoint],
            request.body_for(pool.spec.served_model),
            headers,
            route,
            context.record,
        )

    async def _relay_whole(
        self,
        request: InboundRequest,
        dispatch: Dispatch,
        headers: dict[str, str],
        checkpoint: Checkpointer | None,
        record: RequestRecord,
        answer_key: str | None = None,
        tenant: str = OPEN_ACCESS.name,
    ) -> Response:
        answer = await self._read_answer(request, dispatch, record.result)
        if checkpoint is not None:
            turn_number = await checkpoint(answer.reply, answer.usage)
            report_turn(headers, turn_number)
        if answer_key is not None and self._answers is not None:
            await self._answers.put(answer_key, answer.payload, tenant=tenant)
        return Response(answer.payload, media_type=answer.media_type, headers=headers)

    async def _cached_answer(
        self,
        key: str | None,
        model: str,
        choice: TierChoice,
        turn: Turn | None,
        context: RequestContext,
    ) -> Response | None:
        """The last fallback: this same deterministic request's kept answer."""
        if key is None or self._answers is None:
            return None
        payload = await self._answers.get(key, tenant=context.access.name)
        if payload is None:
            return None
        self._metrics.fallbacks.labels(model, "cache").inc()
        headers = {**choice.header_values(), "X-Gateway-Fallback": "cache"}
        if turn is not None:  # not a new answer of the engine: the turn is not kept
            headers["X-Gateway-Session"] = turn.session.id
            report_turn(headers, None)
        return Response(payload, media_type="application/json", headers=headers)

    def _relay_stream(
        self,
        request: InboundRequest,
        dispatch: Dispatch,
        headers: dict[str, str],
        checkpoint: Checkpointer | None,
        record: RequestRecord,
        hide_usage: bool = False,
    ) -> RelayResponse:
        relay = StreamRelay(
            dispatch.replica,
            dispatch.response,
            on_end=dispatch.finish,
            deadline=dispatch.deadline,
            idle_s=self._policy.timeouts.idle_s,
            # Only logprobs chunks need fixing; every other stream passes byte for byte.
            conform=bool(request.body.get("logprobs")),
            on_done=checkpoint,
            hide_usage=hide_usage,
            facts=record.result,
            capture=record.capture,
        )
        return RelayResponse(relay, headers)


def _whole(answer: Answer, headers: dict[str, str]) -> Response:
    """An answer read (or written) whole: replayed as a stream when it is one."""
    if answer.events is not None:
        return ReplayedStream(answer.events, headers)
    return Response(answer.payload, media_type=answer.media_type, headers=headers)


def _client_usage(request: InboundRequest, hide_usage: bool) -> bool:
    """Whether a stream's client asked for the usage chunk (the gateway always does)."""
    return request.stream and not hide_usage


def _with_usage(request: InboundRequest) -> tuple[InboundRequest, bool]:
    """Every stream asks the engine for its usage (token accounting and the session
    checkpoint need it), even when the client did not; then that one extra chunk is not
    passed on (True)."""
    if not request.stream or request.endpoint is Endpoint.embeddings:
        return request, False
    options = request.body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage"):
        return request, False
    options = {**(options or {}), "include_usage": True}
    return request.with_body({**request.body, "stream_options": options}), True
