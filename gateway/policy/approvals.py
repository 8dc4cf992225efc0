"""The policy's `approvals:` section: the tools whose calls a person must approve before
the agent gets them (gateway/approvals/ holds them). Off while no tool is named, and then
nothing of it runs on the request path.

Which tools need approval for a request: `tools` for everyone, plus `models[<alias>]` for
requests to that model alias, plus `tenants[<tenant>]` for that tenant's requests.
`approval_references` checks, at load, that those aliases and tenants exist and that keys
are checked at all (without them nobody could approve).
"""

from __future__ import annotations

from collections.abc import Iterator
from string import Formatter
from typing import Annotated, Any

from pydantic import Field, field_validator

from gateway.policy.base import Strict

# As OpenAI names functions.
ToolName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]

# What a hold message template may name: the held calls' tool names, a short summary of
# their arguments, and the approval id (required: the agent's user needs it to ask).
PLACEHOLDERS = ("tools", "arguments", "approval_id")
DEFAULT_MESSAGE = (
    "The action {tools} ({arguments}) needs a human's approval before it runs. "
    "It is waiting for a reviewer: approval {approval_id}."
)


class ApprovalsSpec(Strict):
    tools: tuple[ToolName, ...] = Field(
        (),
        description="Tools whose calls are held for approval in every tenant and model "
        "(e.g. cancel_reservation, book_reservation). None named anywhere: approvals off.",
    )
    models: dict[str, tuple[ToolName, ...]] = Field(
        default_factory=dict,
        description="More tools held for requests to a model alias, by alias.",
    )
    tenants: dict[str, tuple[ToolName, ...]] = Field(
        default_factory=dict, description="More tools held for a tenant's requests, by tenant."
    )
    ttl_s: int = Field(
        86_400,
        ge=10,
        le=30 * 86_400,
        description="A held call nobody decided within this long expires: the agent is "
        "told it was not run, and a decision is refused (409).",
    )
    keep_s: int = Field(
        7 * 86_400,
        ge=60,
        le=400 * 86_400,
        description="How long a decided or expired approval stays readable "
        "(`GET /v1/approvals/{id}`).",
    )
    message: str = Field(
        DEFAULT_MESSAGE,
        max_length=2000,
        description="What the agent is answered instead of a held call; may name "
        "{tools}, {arguments} and must name {approval_id}.",
    )
    audit_max_entries: int = Field(
        100_000,
        ge=100,
        description="Entries kept in each tenant's audit stream in Redis (older ones are "
        "trimmed); every entry is also logged on the `gateway.audit` logger.",
    )

    @field_validator("message")
    @classmethod
    def _known_placeholders(cls, value: str) -> str:
        try:
            named = {field for _, field, _, _ in Formatter().parse(value) if field is not None}
        except ValueError as exc:
            raise ValueError(f"not a valid template: {exc}") from None
        unknown = sorted(named - set(PLACEHOLDERS))
        if unknown:
            raise ValueError(f"unknown placeholder(s) {unknown}; expected {list(PLACEHOLDERS)}")
        if "approval_id" not in named:
            raise ValueError("the message must name {approval_id}: it is how a reviewer is asked")
        return value

    @property
    def enabled(self) -> bool:
        return bool(self.tools or any(self.models.values()) or any(self.tenants.values()))


def approval_references(data: dict[str, Any]) -> Iterator[tuple[tuple[str, ...], str]]:
    """(where, what is wrong) for each `approvals` entry naming an undefined model alias
    or tenant, and for approvals turned on without API keys (nobody could approve)."""
    approvals = _mapping(data.get("approvals"))
    for section, defined in (
        ("models", data.get("models")),
        ("tenants", {"default": None, **_mapping(data.get("tenants"))}),
    ):
        known = _mapping(defined)
        for name in _mapping(approvals.get(section)):
            if name not in known:
                names = ", ".join(sorted(str(k) for k in known)) or "(none defined)"
                kind = "model" if section == "models" else "tenant"
                yield (
                    ("approvals", section, str(name)),
                    (f"{kind} {name!r} is not defined (expected one of: {names})"),
                )
    named = [approvals.get("tools"), *_mapping(approvals.get("models")).values()]
    named.append(_analyzer_holds(data))
    named += _mapping(approvals.get("tenants")).values()
    auth = _mapping(data.get("auth"))
    if any(named) and not (auth.get("keys_file") or data.get("tenants")):
        yield (
            ("approvals",),
            (
                "approvals need API keys (`auth.keys_file` or `tenants`): only a key with the "
                "`approver` role may decide a held call"
            ),
        )


def _analyzer_holds(data: dict[str, Any]) -> list[str]:
    """Tools an analyzer of `tool_calls` may hold for a person (they need approvals too)."""
    tools = _mapping(_mapping(data.get("tool_calls")).get("tools"))
    return [
        str(name)
        for name, rules in tools.items()
        for rule in _mapping(rules).get("arguments") or ()
        if "hold" in _mapping(_mapping(rule).get("effects")).values()
    ]


def _mapping(value: Any) -> dict[Any, Any]:
    return value if isinstance(value, dict) else {}
