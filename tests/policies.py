"""Policy documents for tests, kept in the test Redis (`redis_url` of tests/conftest.py).

A test writes the policy it is about inline, where a reader sees it; what every such policy
shares is its state section, and that is added here rather than in each document (where it
forced an f-string, and so doubled braces, on policies with nothing else to fill in).
"""

from __future__ import annotations

import re

from gateway.policy import Policy, parse_policy

# PyYAML keeps the last of two equal keys without a word, so a second `state:` would
# silently drop one of them: refuse documents that bring their own.
_TOP_LEVEL_STATE = re.compile(r"^state\s*:", re.MULTILINE)


def with_redis(policy: str, redis_url: str) -> str:
    """`policy` (YAML text) with its state kept in the Redis at `redis_url`."""
    if _TOP_LEVEL_STATE.search(policy):
        raise ValueError("this policy has a state section of its own; with_redis adds one")
    ended = policy if policy.endswith("\n") else policy + "\n"
    return f"{ended}state: {{redis_url: '{redis_url}'}}\n"


def parse_with_redis(policy: str, redis_url: str) -> Policy:
    """`policy` (YAML text) loaded as `gateway serve` loads it, its state in `redis_url`."""
    return parse_policy(with_redis(policy, redis_url))
