"""Trimming a session's context to validated state diffs and compacted history."""
