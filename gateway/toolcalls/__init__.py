"""Tool-call contracts: every call an engine makes checked before the agent acts on it."""
