"""Choosing the replica for a request: filter, then cost, then pick (see router.py)."""
