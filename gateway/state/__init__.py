"""Shared state in Redis: the store, the client, and every key's layout."""
