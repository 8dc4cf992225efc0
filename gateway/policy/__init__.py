"""Policy YAML: the strict schema (`Policy` in schema.py, its sections in a module each:
routing.py, pools.py, auth.py, sessions.py, ...), loading with precise errors (loader.py)."""

from gateway.policy.loader import PolicyError, load_policy, parse_policy
from gateway.policy.pools import Endpoint
from gateway.policy.schema import Policy

__all__ = ["Endpoint", "Policy", "PolicyError", "load_policy", "parse_policy"]
