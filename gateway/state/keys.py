"""Every Redis key the gateway writes, built here and nowhere else.

Redis Cluster places a key by the CRC16 of its hash tag, the text between the first `{`
and the next `}`, or of the whole key when it has none. Keys that belong together carry
the same tag, so they live in one slot (one node) and one MULTI/EXEC may touch them all:

    key                                    type    holds (written by)
    agw:{<tenant>/<session>}:turns         list    a checkpoint per turn (sessions/store.py)
    agw:{<tenant>/<session>}:blobs         hash    tool sets by digest (sessions/store.py)
    agw:{<tenant>/<session>}:snapshot      string  its first turns folded (sessions/store.py)
    agw:{<tenant>/<session>}:usage         hash    its usage counters (telemetry/usage.py)
    agw:{<tenant>/<session>}:prefix        string  last prefix fingerprint (prefix_watch.py)
    agw:{<tenant>/<session>}:tier:<route>  string  its sticky tier (tiering/stickiness.py)
    agw:{<tenant>/<session>}:approval      string  its open approval's id (approvals/store.py)
    agw:response:{<tenant>/<response id>}  string  a stored response (responses/records.py)
    agw:compaction:{<tenant>/<id>}         string  a compacted conversation (responses/)
    agw:answer:{<tenant>/<sha256>}         string  a kept answer (resilience/response_cache.py)
    agw:approval:{<tenant>/<approval id>}  hash    a held tool call (approvals/store.py)
    agw:approvals:{<tenant>}:index         zset    its approvals by time (approvals/store.py)
    agw:approvals:{<tenant>}:audit         stream  the tenant's audit log (approvals/audit.py)
    agw:feedback:{<tenant>}                stream  scores given to its requests (feedback/)
    agw:feedback:{<tenant>}:bytes          string  the stream's bytes (feedback/)
    agw:usage:<tenant>:<day>               hash    a ledger day row (telemetry/usage.py)
    agw:usage:tenants                      set     tenants with ledger rows (telemetry/usage.py)
    agw:apikey:{<sha256 hex>}              hash    a key made at run time (tenants/stored_keys.py)
    agw:apikeys:ids                        hash    key id -> its sha256 hex (tenants/stored_keys.py)
    agw:apikeys:tenant:{<tenant>}          set     its run-time key ids (tenants/stored_keys.py)
    agw:quota:{<tenant>}:tenant:<unit>     hash    the tenant's rate bucket (quota/store.py)
    agw:quota:{<tenant>}:key:<id>:<unit>   hash    one key's rate bucket (quota/store.py)
    agw:quota:{<tenant>}:<period>:<date>   hash    budget used in a day or month (quota/store.py)
    agw:quota:{<tenant>}:once:<call id>    string  an admission's answer, 60 s (quota/store.py)
    agw:stored:{<tenant>}:expiry           zset    its stored things by expiry (stored_bytes.py)
    agw:stored:{<tenant>}:bytes            hash    their bytes, and the total (stored_bytes.py)
    agw:routing:{<pool>}:placements        stream  where gateways sent what (sharing/)
    agw:routing:{<pool>}:inflight          hash    gateway -> its in-flight counts (sharing/)

Every command touches one key, or keys of one tag (a session's turns and blobs together),
so no command or transaction ever spans slots. Every quota key of one tenant carries the
tag `{<tenant>}`: the one Lua script that admits a request reads and writes all of them
(a script's keys must share a slot). The ledger's day rows are written in a batch that
does span slots; telemetry/usage.py splits it by slot. Day rows keep the names
they had before the cluster layout (no tag: each is read and written on its own), so a
ledger survives the upgrade; the other keys moved under tags, which orphans what an
embedded Redis held for sessions that were in flight across the upgrade.
"""

from __future__ import annotations


def _tag_text(value: str) -> str:
    """`value` made safe inside a hash tag: a brace would end or open the tag early, so
    braces (and `%`, to keep the mapping one-to-one) are percent-encoded. Checked session
    ids (sessions/ids.py) contain none of them and are used as they are."""
    if "{" not in value and "}" not in value and "%" not in value:
        return value
    return value.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")


def hash_tag(tenant: str, entity: str) -> str:
    """The tag that puts every key of one entity (a session, a response) in one slot."""
    return "{" + _tag_text(tenant) + "/" + _tag_text(entity) + "}"


def session_key(tenant: str, session: str, part: str) -> str:
    return f"agw:{hash_tag(tenant, session)}:{part}"


def session_tier_key(tenant: str, session: str, route: str) -> str:
    """`route`: the `tiering` entry whose choice this is."""
    return session_key(tenant, session, f"tier:{route}")


def response_key(tenant: str, response_id: str) -> str:
    return f"agw:response:{hash_tag(tenant, response_id)}"


def compaction_key(tenant: str, compaction_id: str) -> str:
    return f"agw:compaction:{hash_tag(tenant, compaction_id)}"


def answer_key(tenant: str, request_hash: str) -> str:
    return f"agw:answer:{hash_tag(tenant, request_hash)}"


def usage_day_key(tenant: str, day: str) -> str:
    return f"agw:usage:{tenant}:{day}"


USAGE_TENANTS_KEY = "agw:usage:tenants"


def api_key_key(digest_hex: str) -> str:
    """A run-time API key's record, found by the SHA-256 of the key (never the key)."""
    return "agw:apikey:{" + digest_hex + "}"


API_KEY_IDS_KEY = "agw:apikeys:ids"


def tenant_keys_key(tenant: str) -> str:
    return "agw:apikeys:tenant:{" + _tag_text(tenant) + "}"


def quota_key(tenant: str, part: str) -> str:
    """A tenant's rate bucket or budget counter (`part`: `tenant:requests`,
    `key:<key id>:tokens`, `day:2025-06-01`, `month:2025-06`); one slot per tenant."""
    return "agw:quota:{" + _tag_text(tenant) + "}:" + part


def stored_bytes_key(tenant: str, part: str) -> str:
    """What a tenant's conversations hold (gateway/state/stored_bytes.py); `part`:
    `expiry` or `bytes`. One slot per tenant: one script reads and writes both."""
    return "agw:stored:{" + _tag_text(tenant) + "}:" + part


# -- approvals (gateway/approvals/) ------------------------------------------------------


def approval_key(tenant: str, approval_id: str) -> str:
    return f"agw:approval:{hash_tag(tenant, approval_id)}"


def approvals_key(tenant: str, part: str) -> str:
    """A tenant's approvals index (`index`) or audit stream (`audit`)."""
    return "agw:approvals:{" + _tag_text(tenant) + "}:" + part


def feedback_key(tenant: str) -> str:
    """A tenant's feedback stream (gateway/feedback/store.py)."""
    return "agw:feedback:{" + _tag_text(tenant) + "}"


# -- routing shared between gateways (gateway/sharing/) ---------------------------------


def routing_key(pool: str, part: str) -> str:
    """A pool's placement stream (`placements`) or in-flight hash (`inflight`); both carry
    the pool's tag, so one pipeline reaches them on one node."""
    return "agw:routing:{" + _tag_text(pool) + "}:" + part
