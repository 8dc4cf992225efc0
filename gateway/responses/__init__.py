"""The Responses API on top of sessions: hydrated from checkpoints, spoken to vLLM as
Chat Completions."""
