"""Knowing the engines: pools and replicas, DNS discovery, health checks and
each engine's own /metrics."""
