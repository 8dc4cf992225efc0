"""Rate limits per tenant and per key, budgets per tenant (policy: gateway/policy/quota.py).

service.py   `Quota`: what limits a request, admission, the 429s, settling at the end
store.py     the `QuotaStore` seam and its records; `RedisQuotaStore` (one Lua script
             per operation, atomic across every gateway replica)
memory.py    the in-memory twin, for unit tests of the request path
estimate.py  a request's tokens and cost, guessed up front without a tokenizer
headers.py   Retry-After and OpenAI's x-ratelimit-* headers
"""
