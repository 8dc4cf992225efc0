"""Tiered routing: rules, the learned router, checks and the cascade (README, "Tiered routing")."""
