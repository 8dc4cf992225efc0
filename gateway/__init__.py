"""Agent-pipeline gateway: an OpenAI-compatible front door for self-hosted vLLM engines."""

__version__ = "0.1.0"
