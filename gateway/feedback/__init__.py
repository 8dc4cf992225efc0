"""Explicit feedback on served requests (`POST /v1/feedback`): a score a person or an
evaluator gives a request id, kept in the tenant's own Redis stream, joined to the request
log by `gateway dataset export` (gateway/offline/dataset.py)."""
