"""Policy YAML: strict schema (schema.py), loading with precise errors (loader.py)."""

from gateway.policy.loader import PolicyError, load_policy, parse_policy
from gateway.policy.schema import Endpoint, Policy

__all__ = ["Endpoint", "Policy", "PolicyError", "load_policy", "parse_policy"]
