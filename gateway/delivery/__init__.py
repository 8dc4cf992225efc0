"""Delivering an engine's answer to the client: relaying a stream as it
comes, or reading an answer whole (to check it, keep it, or convert it)."""
