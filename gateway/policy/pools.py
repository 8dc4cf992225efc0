"""The policy's engine pools: which replicas serve a model, listed, read from `engine up`'s
state file or found in DNS, and what their engines can do. gateway/fleet/ builds the live
pools from these records."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field

from gateway.policy.base import Name, Strict
from gateway.policy.telemetry import PriceSpec


class Endpoint(StrEnum):
    """The OpenAI endpoints a pool's engines serve."""

    chat = "chat"
    completions = "completions"
    embeddings = "embeddings"

    @property
    def path(self) -> str:
        """Its path in the OpenAI API: where clients call the gateway, and where the gateway
        calls an engine (vLLM serves the same paths)."""
        return "/v1/chat/completions" if self is Endpoint.chat else f"/v1/{self.value}"


def _http_base_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("expected an http(s) base URL such as http://127.0.0.1:8001")
    if parts.query or parts.fragment:
        raise ValueError("a replica URL takes no query or fragment")
    return value.rstrip("/")


BaseUrl = Annotated[str, AfterValidator(_http_base_url)]


class ReplicaSpec(Strict):
    url: BaseUrl


class DnsDiscoverySpec(Strict):
    """Replicas found in DNS: a Kubernetes headless Service answers one A/AAAA record per
    ready pod, and each address joins the pool as its own replica (gateway/fleet/discovery.py)."""

    dns: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:-]{1,253}$")] = Field(
        description="Name to resolve, e.g. vllm-large.agent-gateway.svc.cluster.local."
    )
    port: int = Field(8000, ge=1, le=65535, description="The engines' HTTP port.")
    scheme: Literal["http", "https"] = "http"
    interval_s: float = Field(5.0, gt=0, description="How often the name is resolved again.")
    timeout_s: float = Field(2.0, gt=0, description="A resolution taking longer has failed.")
    family: Literal["auto", "ipv4", "ipv6"] = Field(
        "auto",
        description="Addresses used: auto takes the IPv4 ones when there are any, else the "
        "IPv6 ones, so a dual-stack pod (A and AAAA) is one replica, not two.",
    )
    empty_after_rounds: int = Field(
        3,
        ge=1,
        description="Consecutive answers of no such name / no address before the pool's "
        "discovered replicas are dropped; a failed lookup (timeout, server error) never "
        "drops them.",
    )


class PoolSpec(Strict):
    """Engine replicas that serve the same model; the unit the gateway routes within."""

    tier: Name = Field("default", description="Tier label, e.g. small or large.")
    served_model: Name = Field(
        description="The model name the engines serve (vLLM --served-model-name)."
    )
    serves: tuple[Endpoint, ...] = Field((Endpoint.chat, Endpoint.completions), min_length=1)
    replicas: tuple[ReplicaSpec, ...] = ()
    engine_state: str | None = Field(
        None,
        description=(
            "Path of the state file `engine up` writes; its replicas labelled with this "
            "pool's name join the pool, and the file is re-read when it changes."
        ),
    )
    discover: DnsDiscoverySpec | None = Field(
        None,
        description="Find replicas by resolving a DNS name (a headless Service): the "
        "addresses found join the pool, and leave it when they leave the answer.",
    )
    structured_outputs: bool = Field(
        True, description="The engines constrain output to a schema, choice or regex (vLLM)."
    )
    kv_events: bool = Field(
        False,
        description="Follow the KV-cache events of the replicas listed in `replicas:` and "
        "found through `discover:` at their HTTP port - 1000 (replay socket: - 2000), the "
        "ports engine profiles and manifests give them. Replicas from `engine_state:` are "
        "followed wherever the state file says they publish, whatever this says.",
    )
    price: PriceSpec | None = Field(
        None, description="What this pool's model costs per million tokens (token economics)."
    )
