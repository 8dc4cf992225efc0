"""The request path, top to bottom. `Pipeline.handle` states each step once, in order:
parse and admit, continue the session (trimming it), canonicalize, choose a tier, choose
a replica and send, check the answer where it has checks (escalating once), relay it,
and deliver: one exit that builds the response headers and commits the session turn.
Each step is a call into the module that owns it, and adds what it decides to the one
per-request value, `Call`. The pipeline answers with the gateway's own `Served` value;
the HTTP layer renders it (gateway/api/inference.py).
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from gateway import headers as gateway_headers
from gateway.approvals.gate import ApprovalGate, Guard
from gateway.call import Call, Live, Reply, Settled
from gateway.chat.inbound import InboundRequest, parse_request
from gateway.chat.messages import Message
from gateway.delivery.events import EventSteps
from gateway.delivery.relay import StreamRelay
from gateway.delivery.served import Served
from gateway.delivery.whole import Answer, read_answer
from gateway.errors import (
    ModelNotFound,
    OutputCheckFailed,
    UpstreamError,
)
from gateway.fallback_steps import CANNOT_ANSWER, FallbackSteps
from gateway.fleet.replicas import Fleet, Pool, UnservedModel
from gateway.policy import Endpoint, Policy
from gateway.prompt.prefix_watch import FingerprintStore
from gateway.prompt.steps import PrefixSteps
from gateway.quota.service import Quota
from gateway.request_context import RequestContext
from gateway.resilience.dispatcher import Dispatch, Dispatcher, SlotOutcome
from gateway.resilience.response_cache import ResponseCache, cache_key
from gateway.routing.router import ReplicaChoice, Router
from gateway.session_steps import Checkpointer, SessionSteps
from gateway.sessions.turns import SessionTurns
from gateway.telemetry.metrics import GatewayMetrics
from gateway.tenants.identity import TenantAccess
from gateway.tenants.settings import TenantPolicies
from gateway.tiering.chooser import TierChoice, TierChooser, load_learned_router
from gateway.tiering.features import readable_part
from gateway.tiering.stickiness import MemorySessionTiers
from gateway.tool_call_steps import ToolCallSteps
from gateway.toolcalls.checker import ToolCallChecks
from gateway.toolcalls.stream_hold import ToolCallHold
from gateway.toolcalls.tool_choice import AS_SENT, declared_names, read_tool_choice
from gateway.upstream.client import Upstream

log = logging.getLogger(__name__)


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
        response_cache: ResponseCache | None = None,
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
        self._session_steps = SessionSteps(policy.sessions, sessions, metrics, fleet)
        # A stream's longest silence, read as it is relayed (and a whole answer's).
        self._idle_s = policy.timeouts.idle_s
        # Tool calls held for a person's approval; None (no cost) when the policy names none.
        self._approvals = approvals
        # Rate limits and budgets; a caller nothing limits costs a dict lookup.
        self._quota = quota
        # Each tenant's limits, fallbacks and tiers, merged once (gateway/tenants/settings.py).
        self.tenants = tenants or TenantPolicies(policy)
        self._fleet = fleet
        # Fields each alias's requests get when they lack them (`models.<alias>.defaults`).
        self._defaults = {alias: m.defaults for alias, m in policy.models.items() if m.defaults}
        self._dispatcher = dispatcher or Dispatcher(policy, router, upstream, metrics)
        # A pool that cannot answer: a wider window, then the model's fallbacks.
        self._fallbacks = FallbackSteps(self._tiers, self._dispatcher, metrics)
        self._prefix_steps = PrefixSteps(
            policy.routing, policy.canonicalize, policy.models, fingerprints, metrics
        )
        self._metrics = metrics
        # Every tool call checked against the declared tools (gateway/toolcalls/), and an
        # invalid one asked again, escalated or refused (gateway/tool_call_steps.py).
        self._tool_calls = ToolCallChecks(policy.tool_calls, metrics)
        self._tool_call_steps = ToolCallSteps(self._tiers, self._resend)
        # Kept deterministic answers, the last fallback (when the policy turns it on).
        self._response_cache = response_cache if policy.resilience.response_cache.enabled else None

    async def handle(
        self,
        endpoint: Endpoint,
        body: bytes | dict[str, Any],
        context: RequestContext,
        *,
        parsed: dict[str, Any] | None = None,
    ) -> Served:
        """`body`: the client's bytes, or a body the gateway built (the Responses API's);
        `parsed`: the client's bytes already parsed, when the caller had to look inside."""
        call = self._parse(endpoint, body, context, parsed)  # a model the tenant may use
        call = await self._admit(call)  # rate limits and budgets
        call = await self._continue_session(call)  # its stored history, trimmed
        if (kept := await self._approval_answer(call)) is not None:
            return await self._deliver(call, kept)  # the gateway answers, not an engine
        call = await self._canonicalize(call)  # a stable prefix, its changes, its blocks
        call = await self._choose_tier(call)
        if self._is_checked(call):  # read whole, checked (escalated once), maybe held
            return await self._deliver(call, await self._checked(call))
        return await self._deliver(call, await self._send(call))

    def check(self, endpoint: Endpoint, body: dict[str, Any], context: RequestContext) -> None:
        """Refuses a request this caller may not make (its shape, limits and model), as
        `handle` would, for an answer the gateway gives without an engine."""
        self._parse(endpoint, body, context)

    async def count_tokens(self, body: dict[str, Any], context: RequestContext) -> int:
        """How many prompt tokens the engine would see for this chat request: its own
        tokenizer and chat template, asked (`POST /tokenize`) on the replica the request
        would be routed to; nothing is generated, no quota is taken, no turn is kept."""
        call = self._parse(Endpoint.chat, body, context)
        call = await self._choose_tier(await self._canonicalize(call))
        assert call.choice is not None and call.route is not None
        pool, request = call.choice.pool, call.request
        ask: dict[str, Any] = {
            k: request.body[k] for k in ("messages", "tools") if k in request.body
        }
        ask.update(model=pool.spec.served_model, add_generation_prompt=True)
        headers = {"Content-Type": "application/json", "X-Request-Id": context.request_id}
        dispatch = await self._dispatcher.send(
            pool, request.model, "/tokenize", orjson.dumps(ask), headers, call.route,
            context.record,
        )  # fmt: skip
        outcome: SlotOutcome = "failed"
        try:
            answer = orjson.loads(await dispatch.response.read())
            count = answer.get("count") if isinstance(answer, dict) else None
            if type(count) is not int:
                raise UpstreamError("the engine's /tokenize answer has no count")
            outcome = "ok"
            return count
        except orjson.JSONDecodeError as exc:
            raise UpstreamError("the engine's /tokenize answer is not JSON") from exc
        finally:
            dispatch.finish(outcome)

    # The steps, in order.

    def _parse(
        self,
        endpoint: Endpoint,
        body: bytes | dict[str, Any],
        context: RequestContext,
        parsed: dict[str, Any] | None = None,
    ) -> Call:
        tenant = self.tenants.of(context.access.name)
        request = parse_request(endpoint, body, tenant.limits, parsed=parsed)
        self._check_model(request.model, endpoint, context.access)
        if (defaults := self._defaults.get(request.model)) is not None:
            missing = {k: v for k, v in defaults.items() if k not in request.body}
            if missing:
                request = request.with_body({**request.body, **missing})
        return Call(request, context, tenant)

    async def _admit(self, call: Call) -> Call:
        request, context = call.request, call.context
        if self._quota is not None:  # rate limits and budgets (gateway/quota/)
            grant = await self._quota.admit(request, request.size, context.access, context.identity)
            if grant is not None:
                context.charges.charge = grant  # the edge sends its headers, settles it
                request = grant.request  # another model when served over budget
        context.record.note_request(request)  # after the check: only known aliases count
        return call.but(request=request)

    async def _continue_session(self, call: Call) -> Call:
        """The session's stored conversation put in front (trimmed, in sessions/turns.py);
        a stream asks the engine for its usage; the guard of a call that may need
        approval."""
        context = call.context
        record = context.record
        session = self._session_steps.session_of(call.request, context)
        record.session = session.id if session else None
        with record.stage("hydrate"):
            turn, request, degraded = await self._session_steps.hydrate(
                call.request, session, context
            )
        unsaved = None
        if degraded is not None and session is not None:  # served, not kept: the client is told
            record.degraded = degraded
            unsaved = session
        request, hide_usage = _with_usage(request)
        call = call.but(
            request=request,
            session=session,
            turn=turn,
            unsaved=unsaved,
            hide_usage=hide_usage,
        )
        return call.but(guard=self._guard(call))

    async def _approval_answer(self, call: Call) -> Reply | None:
        """An approval's answer, given without the engine; kept in the session like any
        turn, so the history the client resends matches the stored one."""
        if call.guard is None:
            return None
        kept = await call.guard.resume(call.client_usage)
        if kept is None:
            return None
        commit = None
        if call.turn is not None:
            route = {"answered_by": "gateway", "approval": kept.approval, "event": kept.event}
            commit = self._session_steps.committer(
                call.turn, call.request, call.request.body, route, call.context
            )
        return Reply(kept.answer, kept.headers, commit)

    async def _canonicalize(self, call: Call) -> Call:
        request, session, context = call.request, call.session, call.context
        declared = request.body.get("tools") if request.endpoint is Endpoint.chat else None
        tool_choice = AS_SENT
        if declared:
            if (strict := self._tool_calls.constrain(declared)) is not None:
                request = request.with_body({**request.body, "tools": strict})  # before hashing
            if (asked := request.body.get("tool_choice")) is not None:
                tool_choice = read_tool_choice(asked, declared_names(declared))
                if tool_choice.engine is not None:  # `allowed_tools`: vLLM does not take it
                    request = request.with_body({**request.body, "tool_choice": tool_choice.engine})
        with context.record.stage("canonicalize"):
            request, tools_json = self._prefix_steps.canonicalize(request)
        tools = self._tool_calls.for_request(
            request.model, declared, tools_json, request.body.get("n"), tool_choice
        )
        headers = dict(call.headers)
        if prefix_changes := await self._prefix_steps.changes(request, session):
            headers[gateway_headers.PREFIX_CHANGE] = ",".join(prefix_changes)
        request, cache_seed = self._prefix_steps.scoped(request, call.tenant.cache_scope)
        route = self._prefix_steps.route_request(
            request,
            session.id if session else context.session_id,
            tools_json,
            context.access.name,
            cache_seed,
        )
        return call.but(request=request, route=route, headers=headers, tools=tools)

    async def _choose_tier(self, call: Call) -> Call:
        request, context = call.request, call.context
        assert call.route is not None
        with context.record.stage("choose_tier"):
            choice = await self._tiers.choose(
                request.model,
                request.endpoint,
                request.body,
                call.route,
                task=context.task,
                clamps=call.tenant.tier_clamps,
                response_schema=request.response_schema,
            )
        return call.but(choice=choice)

    async def _send(self, call: Call) -> Reply | Live:
        """Choose a replica and send (the model's fallbacks when its pool cannot answer,
        then this same request's kept answer); relay a stream, read a completion whole
        (its tool calls judged: gateway/tool_call_steps.py)."""
        request = call.request
        answer_key = cache_key(request.body) if self._response_cache is not None else None
        try:
            choice, dispatch = await self._fallbacks.send(call, request)
        except CANNOT_ANSWER:
            cached = await self._cached_answer(answer_key, call)
            if cached is None:
                raise
            return cached
        headers = self._note_routing(call, choice, dispatch)
        if request.stream:
            commit = self._checkpointer(call, choice, dispatch)
            return Live(self._relay(call, choice, dispatch, commit), headers)
        answer = await self._read_answer(call, request, dispatch)
        settled = Settled(choice, dispatch, headers, answer)
        settled = await self._tool_call_steps.settle(call, settled)
        commit = self._checkpointer(call, settled.choice, settled.dispatch)
        keep_as = answer_key if settled.stands else None  # a refusal is not kept
        return Reply(settled.answer, settled.headers, commit, keep_as)

    async def _checked(self, call: Call) -> Reply:
        """An answer with checks is read whole and checked before the client sees it; one
        that fails moves up a tier once, and a failure with nowhere to go is an error. Its
        tool calls are judged as any answer's (gateway/tool_call_steps.py). An answer that
        may call a tool needing approval is read whole too, and held if it does."""
        request, record = call.request, call.context.record
        assert call.choice is not None
        choice, checks = call.choice, call.choice.checks
        constrain = self._tiers.structured_outputs(request.model)
        escalated = False
        if checks is not None:
            record.cascade_tier = choice.tier  # whose answer the outcome is about
        while True:
            engine_can = constrain and choice.pool.spec.structured_outputs
            sent = request
            if checks is not None:
                sent = request.with_body(checks.constrain(request.body, engine_can))
            settled = await self._resend(call, choice, sent)
            choice = settled.choice  # a fallback's, when the pool could not answer
            problems = checks.problems(settled.answer.reply) if checks else []
            if not problems:
                if checks:
                    outcome = "escalated" if escalated else "passed"
                    self._metrics.cascades.labels(request.model, outcome).inc()
                    record.cascade = outcome
                break
            for check, _ in problems:
                self._metrics.output_check_failures.labels(request.model, choice.tier, check).inc()
            failed = f"{problems[0][0]}: {problems[0][1]}"
            if choice.escalate_to is None:
                self._metrics.cascades.labels(request.model, "failed").inc()
                record.cascade = record.cascade or "failed"
                raise OutputCheckFailed(
                    f"The answer of tier `{choice.tier}` failed its checks: {failed}",
                    headers=choice.header_values(),
                )
            choice = self._tiers.escalated(request.model, choice, problems[0][0])
            record.escalating()
            escalated = True
        settled = await self._tool_call_steps.settle(call, settled)
        answer, headers = settled.answer, settled.headers
        guard = call.guard
        held = await guard.hold(answer, call.client_usage, also=settled.held) if guard else None
        if held is not None:
            answer = held.answer  # the client is told the call awaits approval instead
            headers = {**headers, **held.headers}
            if call.tools is not None:
                call.tools.count("held")
        return Reply(answer, headers, self._checkpointer(call, settled.choice, settled.dispatch))

    async def _deliver(self, call: Call, outcome: Reply | Live) -> Served:
        """The one exit: the response headers, built once, and the session turn committed
        (a relayed stream's by its relay, before `[DONE]`)."""
        headers = {**outcome.headers, **call.headers}
        turn = call.turn
        session = turn.session if turn is not None else call.unsaved
        if session is not None:
            headers[gateway_headers.SESSION] = session.id
        if call.unsaved is not None:
            headers.update(gateway_headers.turn_kept(None, call.context.record.degraded))
        if isinstance(outcome, Live):
            return Served(headers, stream=outcome.relay)
        answer = outcome.answer
        if turn is not None:
            number = await outcome.commit(answer.reply, answer.usage) if outcome.commit else None
            headers.update(gateway_headers.turn_kept(number))
        if outcome.keep_as is not None and self._response_cache is not None:
            await self._response_cache.put(
                outcome.keep_as, answer.payload, tenant=call.context.access.name
            )
        return Served.answer(answer, headers)

    # What the steps call.

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
        except UnservedModel as exc:
            raise ModelNotFound(exc.problem + available, param="model") from None

    def _guard(self, call: Call) -> Guard | None:
        """The request's guard when it may call a tool that needs approval."""
        request, context = call.request, call.context
        if self._approvals is None or request.endpoint is not Endpoint.chat:
            return None
        return self._approvals.guard(
            request,
            call.session,
            tenant=context.access.name,
            request_id=context.request_id,
            record=context.record,
            analyzed=self._tool_calls.spec.holds,
        )

    def _is_checked(self, call: Call) -> bool:
        return (
            call.guard is not None
            or (call.choice is not None and call.choice.checks is not None)
            or (call.tools is not None and not call.request.stream)  # streams: held live
        )

    async def _resend(self, call: Call, choice: TierChoice, request: InboundRequest) -> Settled:
        """`request` sent for `call` to `choice` (its fallbacks when it cannot answer),
        recorded, and its answer read whole: a checked answer's each try, and a tool
        call's re-ask or escalation."""
        choice, dispatch = await self._fallbacks.send(call.but(choice=choice), request)
        headers = self._note_routing(call, choice, dispatch)
        answer = await self._read_answer(call, request, dispatch)
        return Settled(choice, dispatch, headers, answer)

    def _note_routing(self, call: Call, choice: TierChoice, dispatch: Dispatch) -> dict[str, str]:
        """Records the decisions; returns the headers that report them."""
        assert call.route is not None
        record, route, decision = call.context.record, call.route, dispatch.decision
        self._record_route(choice.pool, decision)
        metrics = self._metrics
        metrics.child(metrics.tier_decisions, call.request.model, choice.tier, choice.by).inc()
        record.tier, record.tier_by, record.tier_reason = choice.tier, choice.by, choice.reason
        if choice.shadow is not None and record.shadow is None:  # the first choice's
            record.shadow = choice.shadow
        if record.content_allowed and choice.text is not None and record.route_text is None:
            # What the router reads of it, no more (its first 2 KB and last 512 characters).
            record.route_text = readable_part(choice.text)
        record.fallback = choice.fallback
        record.blocks, record.route_session = route.blocks, route.session
        held = decision.engine_held
        record.routed(
            decision.replica.id,
            choice.pool.name,
            decision.reason,
            decision.cached_blocks,
            held.tokens if held is not None else None,
            held is not None and held.evicted,
        )
        return {**dispatch.headers(), **choice.header_values()}

    def _record_route(self, pool: Pool, decision: ReplicaChoice) -> None:
        metrics, name = self._metrics, pool.name
        metrics.child(metrics.route_decisions, name, decision.reason).inc()
        if decision.engine_held is not None and decision.engine_held.evicted:
            metrics.child(metrics.route_engine_evicted, name).inc()
        if decision.total_blocks:
            blocks = metrics.prefix_blocks
            metrics.child(blocks, name, "yes").inc(decision.cached_blocks)
            metrics.child(blocks, name, "no").inc(decision.total_blocks - decision.cached_blocks)

    def _checkpointer(
        self, call: Call, choice: TierChoice, dispatch: Dispatch
    ) -> Checkpointer | None:
        if call.turn is None:
            return None
        return self._session_steps.checkpointer(
            call.turn, call.request, choice, dispatch, call.context
        )

    async def _read_answer(self, call: Call, request: InboundRequest, dispatch: Dispatch) -> Answer:
        return await read_answer(
            dispatch,
            call.context.record.result,
            stream=request.stream,
            hide_usage=call.hide_usage,
            # Only logprobs chunks need fixing; every other answer passes byte for byte.
            conform=bool(request.body.get("logprobs")),
            idle_s=self._idle_s,
        )

    def _relay(
        self,
        call: Call,
        choice: TierChoice,
        dispatch: Dispatch,
        commit: Checkpointer | None,
    ) -> StreamRelay:
        record = call.context.record
        hold = None
        if call.tools is not None:  # calls held until whole and judged; bad ones settled

            async def recover(reply: Message) -> Message:
                return await self._tool_call_steps.recover_stream(call, choice, dispatch, reply)

            hold = ToolCallHold(call.tools, recover)
        steps = EventSteps(
            record.result,
            hide_usage=call.hide_usage,
            # Only logprobs chunks need fixing; every other stream passes byte for byte.
            conform=bool(call.request.body.get("logprobs")),
            # Collected for the turn's checkpoint, or for a trace that records content.
            collect=record.capture,
            on_reply=commit,
        )
        return StreamRelay(
            dispatch.replica,
            dispatch.response,
            steps,
            deadline=dispatch.deadline,
            idle_s=self._idle_s,
            on_end=dispatch.finish,
            hold=hold,
        )

    async def _cached_answer(self, key: str | None, call: Call) -> Reply | None:
        """The last fallback: this same deterministic request's kept answer (not a new
        answer of the engine: the turn is not kept)."""
        if key is None or self._response_cache is None:
            return None
        payload = await self._response_cache.get(key, tenant=call.context.access.name)
        if payload is None:
            return None
        assert call.choice is not None
        self._metrics.fallbacks.labels(call.request.model, "cache").inc()
        headers = {**call.choice.header_values(), gateway_headers.FALLBACK: "cache"}
        return Reply(Answer(None, None, payload), headers, commit=None)


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
