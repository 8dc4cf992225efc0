"""The Anthropic Messages API on top of the chat pipeline: translated to Chat Completions
for vLLM and back (docs/concepts/anthropic-api.md)."""
