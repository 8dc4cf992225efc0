"""Telemetry: per-request records turned into metrics, usage, logs and spans."""
