"""A tenant's own settings in the policy (`tenants.<name>.limits`, `.trimming`, `.tiers`,
`.fallbacks`) and what they mean once merged over the top-level sections.

Overrides are partial: a field a tenant leaves out keeps the top-level value, so a change
to a default reaches every tenant that did not set that field. A tenant's limit may be
lower or higher than the default (the policy is the operator's: a batch tenant may need
room an interactive one must not have); the bounds of the top-level fields still hold.

`tiers` restricts every model a tenant may use: a fixed model's pool tier must be one of
them (checked at load, gateway/policy/tenant_checks.py), and a routable model's chosen
tier is moved to an allowed one (`tier_clamps`). gateway/tenants/settings.py builds the
runtime objects from these, once per policy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, TypeVar

from pydantic import BaseModel, Field

from gateway.policy.base import HostName, Strict

# Per routable model alias: each tier the tenant may not use -> the tier it is served on.
TierClamps = Mapping[str, Mapping[str, str]]

_Section = TypeVar("_Section", bound=BaseModel)


class LimitsOverride(Strict):
    """Any of `limits`' fields, for one tenant (the same bounds as there)."""

    max_body_bytes: int | None = Field(None, gt=0, description="Larger bodies get 413.")
    max_messages: int | None = Field(None, ge=1, description="Most `messages` (input items).")
    max_tools: int | None = Field(None, ge=1, description="Most `tools` in one request.")
    max_json_depth: int | None = Field(None, ge=8, le=128, description="Deepest nesting.")
    max_tokens: int | None = Field(None, ge=1, description="Highest `max_tokens` asked for.")
    max_n: int | None = Field(None, ge=1, description="Highest `n` (choices) asked for.")
    hosted_tools: Literal["drop", "refuse"] | None = Field(
        None, description="Tools the engine cannot run: left out, or refused with 400."
    )
    stored_bytes: int | None = Field(
        None, ge=1, description="Most bytes its stored conversations may hold in Redis."
    )
    media_url_hosts: tuple[HostName, ...] | None = Field(
        None, description="Hosts whose media URLs the engine may fetch (none: inline only)."
    )


class TrimmingOverride(Strict):
    """`trimming`'s switch and watermarks, for one tenant; the tokenizer and the state
    tools stay the policy's. After merging, low water must stay below high water."""

    enabled: bool | None = Field(None, description="Trim this tenant's session contexts.")
    high_water_tokens: int | None = Field(None, ge=64, description="Compaction trigger.")
    low_water_tokens: int | None = Field(None, ge=64, description="Tail kept by compaction.")


def merged(default: _Section, override: BaseModel | None) -> _Section:
    """The top-level section with the fields the override sets replaced. The same object
    when it sets none, so a tenant without overrides shares the default's runtime objects."""
    if override is None:
        return default
    given = override.model_dump(exclude_none=True)
    if all(getattr(default, name) == value for name, value in given.items()):
        return default
    return default.model_copy(update=given)


def clamp_tier(tiers: tuple[str, ...], chosen: str, allowed: frozenset[str]) -> str | None:
    """The tier a request the chooser sent to `chosen` is served on, `tiers` ordered
    cheapest first: the most capable allowed tier below it (a tier list is usually a cost
    cap), else the cheapest allowed above it; None when the route has no allowed tier."""
    position = tiers.index(chosen)
    below = [tier for tier in tiers[:position] if tier in allowed]
    if below:
        return below[-1]
    return next((tier for tier in tiers[position + 1 :] if tier in allowed), None)


def tier_clamps(routes: Mapping[str, tuple[str, ...]], allowed: frozenset[str]) -> TierClamps:
    """`routes`: each routable alias the tenant may use -> its tiers, cheapest first."""
    clamps: dict[str, dict[str, str]] = {}
    for alias, tiers in routes.items():
        moves = {
            tier: target
            for tier in tiers
            if tier not in allowed and (target := clamp_tier(tiers, tier, allowed)) is not None
        }
        if moves:
            clamps[alias] = moves
    return clamps
