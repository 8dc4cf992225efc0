"""`gateway keys create|list|revoke`: run-time API keys in the Redis of the policy's
`state.redis_url` (gateway/tenants/stored_keys.py). A new key is printed once, on stdout alone,
so `KEY=$(gateway keys create --tenant t)` captures it; everything else goes to stderr."""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import sys

from gateway.policy import Policy
from gateway.policy.quota import RateLimitSpec
from gateway.untrusted.client_text import HUGE, ascii_number, control_character


class KeysCommandError(Exception):
    """Said to the operator on stderr; the command exits 1."""


def run_keys_command(policy: Policy, args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_run(policy, args))
    except KeysCommandError as exc:
        print(f"gateway keys: {exc}", file=sys.stderr)
        return 1


async def _run(policy: Policy, args: argparse.Namespace) -> int:
    # Imported here: `gateway --help` and the other commands do not load Redis clients.
    from gateway.state.store import StateStore
    from gateway.tenants.directory import Tenants
    from gateway.tenants.stored_keys import RedisKeys

    if not policy.state.redis_url:
        raise KeysCommandError(
            "the policy's state store is an embedded Redis (no state.redis_url): create keys "
            "through the running gateway's admin API (POST /admin/keys)"
        )
    tenants = Tenants(policy)
    tenant = getattr(args, "tenant", None)
    if tenant is not None and tenant not in tenants:
        raise KeysCommandError(
            f"no tenant {tenant!r} in the policy (tenants: {', '.join(tenants.names())})"
        )
    store = StateStore(policy.state)
    await store.open()
    try:
        assert store.redis is not None
        keys = RedisKeys(store.redis)
        if args.keys_command == "create":
            if not tenants.required:
                raise KeysCommandError(
                    "authentication is off in this policy (no auth.keys_file, no tenants): "
                    "the gateway would not check the key"
                )
            roles = ["user", *(args.role or [])]
            key, record = await keys.create(
                tenant or "", name=args.name, roles=roles, rate_limits=_rate_limits(args)
            )
            print(key)
            print(
                f"created key {record.key_id} for tenant {record.tenant} "
                f"(roles: {', '.join(record.roles)}); it is shown only now",
                file=sys.stderr,
            )
        elif args.keys_command == "list":
            for record in await keys.of_tenant(tenant or ""):
                created = dt.datetime.fromtimestamp(record.created_at, dt.UTC)
                print(
                    f"{record.key_id}  {record.tenant}  {','.join(record.roles)}  "
                    f"{created:%Y-%m-%dT%H:%M:%SZ}  {_limits_text(record.rate_limits)}  "
                    f"{record.name}"
                )
        else:
            revoked = await keys.revoke(args.key_id)
            if revoked is None:
                raise KeysCommandError(f"no key {args.key_id!r}")
            print(f"revoked key {revoked.key_id} of tenant {revoked.tenant}", file=sys.stderr)
    finally:
        await store.close()
    return 0


def _rate_limits(args: argparse.Namespace) -> RateLimitSpec | None:
    """The key's own limits from --rpm/--tpm (None: its tenant's key_rate_limits)."""
    if args.rpm is None and args.tpm is None:
        return None
    return RateLimitSpec(requests_per_minute=args.rpm, tokens_per_minute=args.tpm)


def _limits_text(limits: RateLimitSpec | None) -> str:
    if limits is None:
        return "tenant-limits"
    parts = [
        f"{value}{unit}"
        for value, unit in (
            (limits.requests_per_minute, "rpm"),
            (limits.tokens_per_minute, "tpm"),
        )
        if value is not None
    ]
    return ",".join(parts)


def _label(text: str) -> str:
    if (bad := control_character(text)) is not None:
        raise argparse.ArgumentTypeError(f"must not contain control characters (found {bad})")
    return text


def _positive(text: str) -> int:
    value = ascii_number(text)
    if value is None or not 1 <= value < HUGE:
        raise argparse.ArgumentTypeError(
            f"must be a whole number (digits 0-9) from 1 to {HUGE - 1}, not {text!r}"
        )
    return value


def add_keys_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], default_policy: str
) -> argparse.ArgumentParser:
    policy = argparse.ArgumentParser(add_help=False)
    policy.add_argument(
        "--policy", help=f"policy YAML (default: $GATEWAY_POLICY or {default_policy})"
    )
    keys = sub.add_parser("keys", help="API keys created at run time (kept hashed in Redis)")
    commands = keys.add_subparsers(dest="keys_command", required=True)
    create = commands.add_parser(
        "create", parents=[policy], help="create a key for a tenant; prints it once"
    )
    create.add_argument("--tenant", required=True)
    create.add_argument(
        "--name", default="", type=_label, help="a label: who holds the key (no control characters)"
    )
    create.add_argument(
        "--role", action="append", choices=["approver"], help="an extra role (repeatable)"
    )
    create.add_argument(
        "--rpm",
        type=_positive,
        help="this key's requests per minute (its own rate limits replace the tenant's "
        "key_rate_limits)",
    )
    create.add_argument("--tpm", type=_positive, help="this key's tokens per minute")
    listing = commands.add_parser("list", parents=[policy], help="a tenant's keys, no secrets")
    listing.add_argument("--tenant", required=True)
    revoke = commands.add_parser("revoke", parents=[policy], help="revoke a key by its id")
    revoke.add_argument("key_id")
    return keys
