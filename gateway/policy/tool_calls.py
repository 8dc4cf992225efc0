"""The policy's `tool_calls:` section: what the gateway does with the tool calls engines
make (gateway/toolcalls/).

Every call is checked against the request's declared tools and their JSON Schemas (on by
default). A call that fails is handled by the steps of `on_invalid`, in order, the first
that applies winning: `repair` (a deterministic fix, where exactly one exists), `reask`
(the same pool once more, the problem appended to the conversation), `escalate` (one tier
up, where the model has tiers), `refuse` (the agent is told, as `refuse_as` says). The
steps may be set per model alias and per tool.

`tools.<name>.arguments` declares analyzers on argument values: RE2 allow and deny lists,
and for code-carrying arguments what the code does (Python, shell, SQL, parsed by their
own parsers), each effect mapped to allow, deny or hold (a person approves it through
`approvals:`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from gateway.policy.approvals import ToolName
from gateway.policy.base import Name, Strict
from gateway.untrusted.regex import LinearRegex, UnsafePattern

Step = Literal["repair", "reask", "escalate", "refuse"]
Verdict = Literal["allow", "deny", "hold"]
Language = Literal["python", "shell", "sql"]
Effect = Literal[
    "reads", "writes_files", "deletes", "spawns_processes", "network", "drops_tables",
    "unparsable",
]  # fmt: skip

# A tool's name, or `*` for every tool.
StrictName = Annotated[str, Field(pattern=r"^(\*|[A-Za-z0-9_-]{1,64})$")]

DEFAULT_STEPS: tuple[Step, ...] = ("repair", "reask", "escalate", "refuse")


class ArgumentRule(Strict):
    pointer: str = Field(
        pattern=r"^(/[^/]*)*$",
        max_length=256,
        description="The argument, as a JSON pointer into the call's arguments "
        "(`/command`, `/query`, `/files/0/path`). A call without it passes this rule.",
    )
    allow: tuple[str, ...] = Field(
        (),
        max_length=64,
        description="RE2 patterns; when given, a string value must match one (searched).",
    )
    deny: tuple[str, ...] = Field(
        (), max_length=64, description="RE2 patterns; a string value matching one is denied."
    )
    language: Language | None = Field(
        None, description="The value is code: parsed as this language and classified."
    )
    effects: dict[Effect, Verdict] = Field(
        default_factory=dict,
        description="What to do with code that has each effect (the strictest wins: deny, "
        "then hold, then allow). Effects not listed are allowed; `unparsable` code is "
        "denied unless listed.",
    )

    @field_validator("allow", "deny")
    @classmethod
    def _linear(cls, patterns: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in patterns:
            try:
                LinearRegex(pattern)
            except UnsafePattern as exc:
                raise ValueError(f"{pattern!r}: {exc}") from None
        return patterns


class ToolRules(Strict):
    on_invalid: tuple[Step, ...] | None = Field(
        None, description="The steps for an invalid call to this tool (default: the model's)."
    )
    arguments: tuple[ArgumentRule, ...] = Field(
        (), max_length=32, description="Analyzers on this tool's argument values."
    )


class ModelToolCalls(Strict):
    on_invalid: tuple[Step, ...] | None = Field(
        None, description="The steps for an invalid call made for this model alias."
    )
    refuse_as: Literal["error", "message"] | None = None


class ToolCallsSpec(Strict):
    check: bool = Field(
        True,
        description="Check every tool call against the request's declared tools and their "
        "JSON Schemas before the client sees it (whole and streamed answers).",
    )
    on_invalid: tuple[Step, ...] = Field(
        DEFAULT_STEPS,
        min_length=1,
        description="What happens to an invalid call, in order; the first step that "
        "applies wins (`refuse` always applies).",
    )
    reask_max: int = Field(
        1, ge=0, le=3, description="Re-asks per request at most (`reask`); 0 turns them off."
    )
    refuse_as: Literal["error", "message"] = Field(
        "error",
        description="`error`: an OpenAI-shaped 502 `invalid_tool_call` (in-stream for a "
        "stream); `message`: the assistant says which call was refused and why, as its "
        "answer, so the agent framework shows it and goes on.",
    )
    strict: tuple[StrictName, ...] = Field(
        (),
        description="Tools sent to the engine with `strict: true`, so it produces only "
        "calls that match their schema (vLLM structured outputs); `*` marks every tool.",
    )
    models: dict[Name, ModelToolCalls] = Field(
        default_factory=dict, description="Settings for one model alias's requests."
    )
    tools: dict[ToolName, ToolRules] = Field(
        default_factory=dict, description="Settings and analyzers for one tool, by name."
    )

    def steps(self, model: str, tool: str | None) -> tuple[Step, ...]:
        rules = self.tools.get(tool) if tool is not None else None
        if rules is not None and rules.on_invalid is not None:
            return rules.on_invalid
        per_model = self.models.get(model)
        if per_model is not None and per_model.on_invalid is not None:
            return per_model.on_invalid
        return self.on_invalid

    def refusal(self, model: str) -> Literal["error", "message"]:
        per_model = self.models.get(model)
        if per_model is not None and per_model.refuse_as is not None:
            return per_model.refuse_as
        return self.refuse_as

    def is_strict(self, tool: str) -> bool:
        return "*" in self.strict or tool in self.strict

    @property
    def holds(self) -> frozenset[str]:
        """Tools some of whose calls an analyzer may hold for a person."""
        return frozenset(
            name
            for name, rules in self.tools.items()
            if any("hold" in rule.effects.values() for rule in rules.arguments)
        )
