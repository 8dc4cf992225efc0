"""The policy's `canonicalize` section: how prompts are made byte-stable before routing
(tools sorted, schema keys sorted, volatile values moved out of the system prompt) and
whether prefix changes are reported (gateway/prompt/canonical.py applies it)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from gateway.policy.base import Strict
from gateway.policy.volatile_presets import PRESETS
from gateway.untrusted.regex import LinearRegex, UnsafePattern


class VolatilePattern(Strict):
    name: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]*$")] = Field(
        description="Placeholder name; without `regex`, a preset: " + ", ".join(sorted(PRESETS))
    )
    regex: str | None = Field(
        None,
        description="Regex in RE2 syntax (linear time: no backreferences, no lookaround); "
        "defaults to the preset's.",
    )

    @field_validator("regex")
    @classmethod
    def _linear_regex(cls, pattern: str | None) -> str | None:
        # It runs on every client's system prompt: RE2, so no pattern can backtrack.
        if pattern is not None:
            try:
                LinearRegex(pattern)
            except UnsafePattern as exc:
                raise ValueError(f"not a valid regex: {exc.reason} (RE2 syntax)") from None
        return pattern

    @model_validator(mode="after")
    def _regex_or_preset(self) -> VolatilePattern:
        if self.regex is None and self.name not in PRESETS:
            raise ValueError(
                f"no preset named {self.name!r}: give a regex or one of {sorted(PRESETS)}"
            )
        return self


class VolatileSpec(Strict):
    patterns: tuple[VolatilePattern, ...] = Field(min_length=1)
    placement: Literal["trailing_system", "last_user"] = Field(
        "trailing_system",
        description="Where the cut values go: a final system note, or the last user message.",
    )
    note_prefix: str = "Current values:"


class CanonicalizeSpec(Strict):
    sort_tools: bool = Field(True, description="Order tools by function name.")
    sort_schema_keys: bool = Field(True, description="Serialise tool schemas with sorted keys.")
    volatile: VolatileSpec | None = Field(
        None, description="Move volatile values out of the system prompt (off unless set)."
    )
    detect_prefix_changes: bool = Field(
        True, description="Report, per session, when the system prompt or tools change."
    )
