"""Kubernetes manifests for the vLLM engine pools, rendered from the engine profiles.

Each GPU profile becomes one pool: a headless Service, a StatefulSet and a
PodDisruptionBudget, all named `vllm-<pool>`. The container runs the same server module
with the same arguments `engine up` uses (`Profile.serve_args`), adapted for the cluster by
`container_args` only: listen on all interfaces, export traces to the in-cluster collector,
drain in-flight requests on SIGTERM.

Why a StatefulSet behind a headless Service: the gateway's cache-affinity routing must
send a session to the pod that holds its prefix in KV cache, so it needs every pod's own
address (one DNS A record per ready pod), not a ClusterIP that balances behind its back.
Stable pod names (`vllm-large-0`, ...) and per-pod model-cache volumes keep a restarted
replica the same member of the gateway's consistent-hash ring, and warm on disk.

Shutdown timeline: preStop sleeps PRESTOP_SLEEP_S while the pod leaves the Service's DNS
records and the gateway's discovery refreshes; then SIGTERM makes vLLM stop admitting and
drain for `drain_s` (`--shutdown-timeout`); the grace period covers both with a margin.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from engine.profiles import (
    SERVER_MODULE,
    KubernetesPool,
    Profile,
    ProfileError,
    available_profiles,
    kv_events_ports,
    load_profile,
)

IMAGE = "vllm/vllm-openai:v0.32.0"  # the release engine/requirements-gpu.txt pins
NAMESPACE = "agent-gateway"
PORT = 8000
PORT_NAME = "http"
# Where a profile with `kv_events` publishes them, and its replay socket: named ports the
# gateway's DNS discovery finds by the same offsets from PORT (gateway/fleet/replicas.py).
KV_EVENTS_PORT_NAME = "kv-events"
KV_REPLAY_PORT_NAME = "kv-replay"
HOST = "0.0.0.0"
OTLP_TRACES_ENDPOINT = "http://otel-collector.agent-gateway.svc:4317"
# The tiers the in-cluster gateway routes between; a GPU profile whose tier is one of
# these is rendered by default, any other only when named with --profile.
CLUSTER_TIERS = ("small", "large")
MODEL_CACHE_MOUNT = "/models"
HF_HOME = f"{MODEL_CACHE_MOUNT}/huggingface"
HF_TOKEN_SECRET = "hf-token"
HF_TOKEN_KEY = "token"
PRESTOP_SLEEP_S = 10  # > the gateway's DNS discovery interval (5 s) plus DNS propagation
GRACE_MARGIN_S = 20  # engine-core and GPU teardown after the drain
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "deploy" / "k8s" / "engines"
KUSTOMIZATION = "kustomization.yaml"
REGENERATE = "engine manifests"

# Per-GPU sizing when a profile's `kubernetes` section leaves it unset.
CPU_PER_GPU = 8
MEMORY_GI_PER_GPU = 64
SHM_GI_PER_GPU = 2


@dataclass(frozen=True)
class EnginePool:
    """One profile as a cluster pool, with every default of its `kubernetes` section settled."""

    profile: Profile
    spec: KubernetesPool

    @classmethod
    def of(cls, profile: Profile) -> EnginePool:
        if profile.device != "gpu":
            raise ProfileError(f"{profile.name}: only gpu profiles run as Kubernetes pools")
        return cls(profile, profile.kubernetes or KubernetesPool())

    @property
    def name(self) -> str:
        return f"vllm-{self.profile.pool}"

    @property
    def tier(self) -> str:
        return self.spec.tier or self.profile.pool

    @property
    def gpus(self) -> int:
        return self.profile.tensor_parallel_size

    @property
    def file_name(self) -> str:
        return f"{self.profile.pool}.yaml"


def container_args(profile: Profile) -> list[str]:
    """The profile's `engine up` arguments, adapted for a container in the cluster."""
    pool = EnginePool.of(profile)
    in_cluster = profile.model_copy(update={"otlp_traces_endpoint": OTLP_TRACES_ENDPOINT})
    args = in_cluster.serve_args(host=HOST, port=PORT)
    # vLLM aborts in-flight requests on SIGTERM unless given a drain window.
    return [*args, "--shutdown-timeout", str(pool.spec.drain_s)]


def default_profiles() -> list[Profile]:
    """GPU profiles whose tier is one of the cluster's tiers, in tier order."""
    gpu_pools = [
        EnginePool.of(profile)
        for profile in map(load_profile, available_profiles())
        if profile.device == "gpu"
    ]
    chosen = sorted(
        (pool for pool in gpu_pools if pool.tier in CLUSTER_TIERS),
        key=lambda pool: CLUSTER_TIERS.index(pool.tier),
    )
    return [pool.profile for pool in chosen]


def labels(pool: EnginePool) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "vllm",
        "app.kubernetes.io/instance": pool.name,
        "app.kubernetes.io/part-of": "agent-gateway",
        "app.kubernetes.io/component": "engine",
        "agent-gateway.dev/pool": pool.profile.pool,
        "agent-gateway.dev/tier": pool.tier,
    }


def selector(pool: EnginePool) -> dict[str, str]:
    # Immutable on a StatefulSet: only labels that never change for the pool.
    return {"app.kubernetes.io/component": "engine", "agent-gateway.dev/pool": pool.profile.pool}


def metadata(pool: EnginePool) -> dict[str, Any]:
    return {"name": pool.name, "namespace": NAMESPACE, "labels": labels(pool)}


def service(pool: EnginePool) -> dict[str, Any]:
    """Headless: DNS answers with one A record per ready pod, so the gateway sees each."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(pool),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": False,  # a loading or draining pod gets no traffic
            "selector": selector(pool),
            "ports": [
                {"name": PORT_NAME, "port": PORT, "targetPort": PORT_NAME, "protocol": "TCP"}
            ],
        },
    }


def _quantity_gi(per_gpu: int, gpus: int) -> str:
    return f"{per_gpu * gpus}Gi"


def resources(pool: EnginePool) -> dict[str, Any]:
    spec, gpus = pool.spec, pool.gpus
    memory = spec.memory or _quantity_gi(MEMORY_GI_PER_GPU, gpus)
    gpu = {spec.gpu_resource: gpus}
    # No CPU limit: throttling stalls the scheduler loop and tokenisation between steps.
    # A memory limit equal to the request keeps a model load from starving its neighbours.
    return {
        "requests": {"cpu": spec.cpu or str(CPU_PER_GPU * gpus), "memory": memory, **gpu},
        "limits": {"memory": memory, **gpu},
    }


def env(pool: EnginePool) -> list[dict[str, Any]]:
    token = {"secretKeyRef": {"name": HF_TOKEN_SECRET, "key": HF_TOKEN_KEY, "optional": True}}
    profile_env = [{"name": k, "value": v} for k, v in sorted(pool.profile.serve_env().items())]
    return [
        {"name": "HF_HOME", "value": HF_HOME},  # downloads land on the pod's own volume
        {"name": "HF_TOKEN", "valueFrom": token},  # gated models (Llama) need it
        *profile_env,
    ]


def container_ports(profile: Profile) -> list[dict[str, Any]]:
    ports = [{"name": PORT_NAME, "containerPort": PORT, "protocol": "TCP"}]
    if profile.kv_events:
        events, replay = kv_events_ports(PORT)
        ports += [
            {"name": KV_EVENTS_PORT_NAME, "containerPort": events, "protocol": "TCP"},
            {"name": KV_REPLAY_PORT_NAME, "containerPort": replay, "protocol": "TCP"},
        ]
    return ports


def probe(period_s: int, failures: int, timeout_s: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": "/health", "port": PORT_NAME},
        "periodSeconds": period_s,
        "timeoutSeconds": timeout_s,
        "failureThreshold": failures,
    }


def container(pool: EnginePool) -> dict[str, Any]:
    startup_period_s = 10
    return {
        "name": "vllm",
        "image": IMAGE,
        # The server module `engine up` starts, whose parser `engine validate` checks.
        "command": ["python3", "-m", SERVER_MODULE],
        "args": container_args(pool.profile),
        "env": env(pool),
        "ports": container_ports(pool.profile),
        "resources": resources(pool),
        "volumeMounts": [
            {"name": "model-cache", "mountPath": MODEL_CACHE_MOUNT},
            {"name": "shm", "mountPath": "/dev/shm"},
        ],
        # vLLM listens only once the model is loaded; until then only this probe runs.
        "startupProbe": probe(
            startup_period_s, math.ceil(pool.spec.startup_timeout_s / startup_period_s), 5
        ),
        "readinessProbe": probe(5, 3, 5),
        # /health fails when the engine core dies; a busy engine still answers it.
        "livenessProbe": probe(15, 4, 10),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRESTOP_SLEEP_S)]}}},
    }


def pod_spec(pool: EnginePool) -> dict[str, Any]:
    spec = pool.spec
    tolerations = spec.tolerations
    if tolerations is None:
        default = {"key": spec.gpu_resource, "operator": "Exists", "effect": "NoSchedule"}
        rendered_tolerations: list[dict[str, Any]] = [default]
    else:
        rendered_tolerations = [t.model_dump(exclude_none=True) for t in tolerations]
    shm = spec.shm_size or _quantity_gi(SHM_GI_PER_GPU, pool.gpus)
    body: dict[str, Any] = {
        "terminationGracePeriodSeconds": PRESTOP_SLEEP_S + spec.drain_s + GRACE_MARGIN_S,
        "automountServiceAccountToken": False,  # engines never call the Kubernetes API
        # Service links would put `<SERVICE>_PORT`-style variables into the environment,
        # and vLLM reads every `VLLM_*` variable as its own setting.
        "enableServiceLinks": False,
    }
    if spec.node_selector:
        body["nodeSelector"] = dict(sorted(spec.node_selector.items()))
    body["tolerations"] = rendered_tolerations
    body["topologySpreadConstraints"] = [
        {  # replicas on different nodes when there is room: one node loss costs one replica
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": selector(pool)},
        }
    ]
    body["containers"] = [container(pool)]
    body["volumes"] = [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": shm}}]
    return body


def model_cache_claim(pool: EnginePool) -> dict[str, Any]:
    claim: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": pool.spec.model_cache_size}},
    }
    if pool.spec.storage_class:
        claim["storageClassName"] = pool.spec.storage_class
    # Claim templates are immutable: leave out the tier, which a profile may relabel.
    claim_labels = {k: v for k, v in labels(pool).items() if k != "agent-gateway.dev/tier"}
    return {"metadata": {"name": "model-cache", "labels": claim_labels}, "spec": claim}


def stateful_set(pool: EnginePool) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": metadata(pool),
        "spec": {
            "serviceName": pool.name,
            "replicas": pool.spec.replicas,
            # Replicas are independent: start (and load models) all at once.
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": selector(pool)},
            "template": {
                "metadata": {
                    "labels": labels(pool),
                    "annotations": {
                        "agent-gateway.dev/profile": pool.profile.name,
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(PORT),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": pod_spec(pool),
            },
            "volumeClaimTemplates": [model_cache_claim(pool)],
        },
    }


def disruption_budget(pool: EnginePool) -> dict[str, Any]:
    """Node drains take one replica of a pool at a time."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(pool),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector(pool)}},
    }


def _header(source: str) -> str:
    return (
        f"# Generated by `{REGENERATE}` (engine/manifests.py) from {source}.\n"
        f"# Do not edit: change the profile and run `.venv/bin/{REGENERATE}`;\n"
        f"# `.venv/bin/{REGENERATE} --check` fails when this file is stale.\n"
    )


def _dump(documents: list[dict[str, Any]]) -> str:
    # Insertion order is the fixed order of the builders above; wide lines keep the JSON
    # arguments on one line each.
    return yaml.safe_dump_all(documents, sort_keys=False, width=4096, explicit_start=True)


def render_pool(profile: Profile) -> str:
    pool = EnginePool.of(profile)
    documents = [service(pool), stateful_set(pool), disruption_budget(pool)]
    return _header(f"the engine profile {profile.name}") + _dump(documents)


def render_files(profiles: list[Profile]) -> dict[str, str]:
    """File name -> content: one file per pool plus the kustomization listing them."""
    files: dict[str, str] = {}
    for profile in profiles:
        name = EnginePool.of(profile).file_name
        if name in files:
            raise ProfileError(f"two profiles render pool {profile.pool!r}; pick one")
        files[name] = render_pool(profile)
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": list(files),
    }
    files[KUSTOMIZATION] = _header("the engine profiles") + yaml.safe_dump(
        kustomization, sort_keys=False
    )
    return files


def write_files(files: dict[str, str], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in files.items():
        path = out / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def stale_diffs(files: dict[str, str], out: Path) -> list[str]:
    """Unified diffs between the files on disk and a fresh render; empty when up to date."""
    diffs = []
    for name, fresh in files.items():
        path = out / name
        committed = path.read_text(encoding="utf-8") if path.is_file() else ""
        if committed != fresh:
            diff = difflib.unified_diff(
                committed.splitlines(keepends=True),
                fresh.splitlines(keepends=True),
                fromfile=f"{path} (on disk)",
                tofile=f"{path} (rendered)",
            )
            diffs.append("".join(diff))
    return diffs
