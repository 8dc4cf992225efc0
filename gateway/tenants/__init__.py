"""Tenants and their API keys.

- identity.py: who a key belongs to (`Identity`) and what its tenant may do (`TenantAccess`);
- tenants.py: the policy's tenants and their static keys, held in memory;
- runtime.py: keys created at run time, kept hashed in Redis, with a small TTL cache;
- checks.py: the key checks the edge uses (tenant keys for /v1, admin keys for /admin).
"""
