"""The request path's side of tool-call contracts: which requests are checked, what a
reply's calls are judged to be, and what the policy's steps make of an invalid one.

A chat request that declares tools gets a `ToolCheck` (with `tool_calls.check` on, the
default). Its reply's calls are judged (gateway/toolcalls/contract.py, then the policy's
analyzers), and an invalid one goes through the steps of `tool_calls.on_invalid`:

- `repair` was applied already where one exists (the judged calls carry it);
- `reask`: the same pool is asked again with the conversation as it was plus the
  invalid reply and the checker's findings appended (the prefix the engine cached is the
  same, so the second prefill is mostly a cache hit);
- `escalate`: one tier up, where the model has tiers;
- `refuse`: an OpenAI-shaped 502 `invalid_tool_call`, or (`refuse_as: message`) an
  assistant message saying which call was refused and why, with no call in it.

Re-asks are bounded (`reask_max`) and escalation goes up at most the tiers there are:
nothing is retried without bound, and nothing is dropped silently. Each outcome is counted
(`gateway_tool_calls_total`) and noted on the request's trace.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.chat.messages import Message
from gateway.errors import InvalidRequest
from gateway.policy.tool_calls import Step, ToolCallsSpec
from gateway.telemetry.metrics import GatewayMetrics
from gateway.toolcalls.argument_rules import CompiledRules
from gateway.toolcalls.contract import CallIssue, Review, ToolContract, ToolContracts
from gateway.toolcalls.tool_choice import ANY_TOOL, AS_SENT, ToolChoice

# How much of a problem the agent, a re-ask or a log line is told.
_DETAIL_CHARS = 300


@dataclass(frozen=True)
class Judgement:
    """A reply's calls judged: as they are to be sent, the repairs made, what is wrong
    with them (schema and analyzer denials), and the tools an analyzer holds."""

    review: Review
    issues: tuple[CallIssue, ...]
    held: tuple[str, ...] = ()

    @property
    def valid(self) -> bool:
        return not self.issues

    def summary(self) -> str:
        return "; ".join(issue.describe()[:_DETAIL_CHARS] for issue in self.issues)


class ToolCallChecks:
    """Built once per policy: the contracts' cache and each tool's compiled analyzers."""

    def __init__(self, spec: ToolCallsSpec, metrics: GatewayMetrics) -> None:
        self.spec = spec
        self._metrics = metrics
        self._contracts = ToolContracts()
        self.rules = {name: CompiledRules(rules) for name, rules in spec.tools.items()}

    def for_request(
        self,
        model: str,
        tools: Any,
        tools_json: bytes | None,
        choices: Any = None,
        tool_choice: ToolChoice = AS_SENT,
    ) -> ToolCheck | None:
        """The check of a request's answer; None when it declares no tools (or checks
        are off). `choices`: the request's `n`; only one choice's calls are judged, so
        more is a 400 rather than calls nobody checked. `tool_choice`: the call the
        answer owes and the tools it may call (gateway/toolcalls/tool_choice.py)."""
        if not self.spec.check or not isinstance(tools, list) or not tools:
            return None
        if choices not in (None, 1):
            raise InvalidRequest(
                "`n` must be 1 when the request declares tools: every tool call is checked "
                "before it is passed on, one choice's (`tool_calls.check` in the policy).",
                param="n",
                code="tool_checks_need_one_choice",
            )
        return ToolCheck(self, model, self._contracts.of(tools, tools_json), tool_choice)

    def constrain(self, tools: list[Any]) -> list[Any] | None:
        """The tools to send with `strict: true` where the policy marks them strict; None
        when none is (the request is sent as it came)."""
        spec = self.spec
        if not spec.strict:
            return None
        changed = False
        sent: list[Any] = []
        for tool in tools:
            function = tool.get("function") if isinstance(tool, dict) else None
            if not isinstance(function, dict):
                sent.append(tool)
                continue
            name = function.get("name")
            if isinstance(name, str) and spec.is_strict(name) and not function.get("strict"):
                tool = {**tool, "function": {**function, "strict": True}}
                changed = True
            sent.append(tool)
        return sent if changed else None

    def count(self, model: str, outcome: str, times: int = 1) -> None:
        self._metrics.tool_calls.labels(model, outcome).inc(times)

    def count_problem(self, model: str, problem: str) -> None:
        self._metrics.tool_call_problems.labels(model, problem).inc()


class ToolCheck:
    """One request's check. `demand`: the call the request's `tool_choice` makes the
    answer owe (`ANY_TOOL` or a tool's name; None: none); `allowed`: the tools its calls
    may name (None: every declared one). gateway/toolcalls/tool_choice.py reads both."""

    def __init__(
        self,
        checks: ToolCallChecks,
        model: str,
        contract: ToolContract,
        choice: ToolChoice = AS_SENT,
    ) -> None:
        self._checks = checks
        self.model = model
        self.contract = contract
        self.demand = choice.demand
        self.allowed = choice.allowed

    def missing(self, calls: list[dict[str, Any]]) -> CallIssue | None:
        """What is wrong with an answer that owes a call (`tool_choice` required or
        named) and made none, or none to the named tool; None when it owes none or made
        it. vLLM constrains such answers, but not every parser's way (its Hermes
        parser under `required` lets the model write text that is no call at all)."""
        demand = self.demand
        if demand is None:
            return None
        names = [(c.get("function") or {}).get("name") for c in calls if isinstance(c, dict)]
        allowed = self.allowed
        if demand == ANY_TOOL:
            if any(allowed is None or name in allowed for name in names):
                return None
        elif demand in names:
            return None
        if demand != ANY_TOOL:
            wanted = f"a call to `{demand}`"
        elif allowed is None:
            wanted = "a call to one of the declared tools"
        else:
            wanted = "a call to one of " + ", ".join(f"`{n}`" for n in sorted(allowed))
        made = ", ".join(f"`{n}`" for n in names) if names else "none"
        detail = f"`tool_choice` asked for {wanted}; the answer made {made}"
        return CallIssue(len(calls), demand or "*", "no_tool_call", detail)

    def judge(
        self, calls: list[dict[str, Any]], *, count: bool = True, whole: bool = True
    ) -> Judgement:
        """The calls judged; their problems and repairs counted unless `count` is False
        (then `note` counts them once the judgement is final). `whole`: these are all the
        answer's calls, so the call `tool_choice` owes is looked for among them (False for
        one call of a stream, whose owed call is looked for at its end)."""
        spec = self._checks.spec
        review = self.contract.review(calls, lambda tool: "repair" in spec.steps(self.model, tool))
        issues = list(review.issues)
        held: list[str] = []
        for index, (call, arguments) in enumerate(zip(review.calls, review.arguments, strict=True)):
            name = (call.get("function") or {}).get("name")
            rules = self._checks.rules.get(name) if isinstance(name, str) else None
            if rules is None or arguments is None:
                continue
            ruling = rules.rule(arguments)
            if ruling.verdict == "deny":
                detail = "refused by the policy: " + "; ".join(ruling.reasons)
                issues.append(CallIssue(index, str(name), "denied", detail))
            elif ruling.verdict == "hold":
                held.append(str(name))
        if self.allowed is not None:
            issues += self._not_allowed(review.calls)
        if whole and (missing := self.missing(review.calls)) is not None:
            issues.append(missing)
        judgement = Judgement(review, tuple(issues), tuple(dict.fromkeys(held)))
        if count:
            self.note(judgement)
        return judgement

    def _not_allowed(self, calls: list[dict[str, Any]]) -> list[CallIssue]:
        """Calls to declared tools that the request's `allowed_tools` choice leaves out
        (an undeclared tool is `unknown_tool` already)."""
        allowed, declared = self.allowed, self.contract.tools
        assert allowed is not None
        issues = []
        for index, call in enumerate(calls):
            name = (call.get("function") or {}).get("name")
            if name in declared and name not in allowed:
                listed = ", ".join(f"`{n}`" for n in sorted(allowed))
                detail = (
                    f"`{name}` is not allowed by this request's `tool_choice` (allowed: {listed})"
                )
                issues.append(CallIssue(index, name, "tool_not_allowed", detail))
        return issues

    def note(self, judgement: Judgement) -> None:
        for issue in judgement.issues:
            self._checks.count_problem(self.model, issue.problem)
        for repair in judgement.review.repairs:
            self._checks.count_problem(self.model, repair)

    def may_settle(self, judgement: Judgement) -> bool:
        """Whether the policy's steps for this invalid call ask again or escalate before
        refusing (a live stream then waits for its end to settle it)."""
        tool = judgement.issues[0].tool if judgement.issues else None
        for step in self._checks.spec.steps(self.model, tool):
            if step == "refuse":
                return False
            if step == "escalate" or (step == "reask" and self.reask_max > 0):
                return True
        return False

    def step(self, judgement: Judgement, *, reasks_left: bool, can_escalate: bool) -> Step:
        """The first of the policy's steps (for the first invalid call's tool) that
        applies now."""
        tool = judgement.issues[0].tool if judgement.issues else None
        for step in self._checks.spec.steps(self.model, tool):
            if step == "reask" and reasks_left:
                return step
            if step == "escalate" and can_escalate:
                return step
            if step == "refuse":
                return step
        return "refuse"  # every list ends in a refusal, said or not

    @property
    def reask_max(self) -> int:
        return self._checks.spec.reask_max

    @property
    def refuse_as(self) -> str:
        return self._checks.spec.refusal(self.model)

    def count(self, outcome: str, times: int = 1) -> None:
        self._checks.count(self.model, outcome, times)

    def reask_body(
        self, body: dict[str, Any], reply: Message | None, judgement: Judgement
    ) -> dict[str, Any]:
        """The request asked again: the conversation as sent, then the invalid reply (as
        text: its arguments may not parse, and chat templates parse them) and what was
        wrong with it."""
        attempted = [
            f"{(c.get('function') or {}).get('name')}({(c.get('function') or {}).get('arguments')})"
            for c in (reply or {}).get("tool_calls") or []
        ]
        said = (reply or {}).get("content")
        parts = [said] if isinstance(said, str) and said else []
        if attempted:
            parts.append("I called: " + "; ".join(a[:_DETAIL_CHARS] for a in attempted))
        text = "\n".join(parts) or "(no answer)"
        rejected = "Those tool calls were rejected" if attempted else "That answer was rejected"
        correction = (
            f"{rejected}: {judgement.summary()}. Call the tools again with arguments that "
            "match their schemas exactly (valid JSON, only declared tools and fields)."
        )
        messages = [
            *body.get("messages", []),
            {"role": "assistant", "content": text},
            {"role": "user", "content": correction},
        ]
        return {**body, "messages": messages}

    def refusal(self, judgement: Judgement) -> Message:
        """What the agent is told instead of the refused calls, as the assistant's answer."""
        return {
            "role": "assistant",
            "content": "The gateway refused the model's tool call, so nothing was run: "
            + judgement.summary()
            + ".",
        }
