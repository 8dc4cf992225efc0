"""deploy/k8s/engines: the committed engine pools are exactly what `engine manifests`
renders from the profiles, their vLLM arguments are the profile's `engine args` with only
the named container adaptations, and every pool is addressable pod by pod (headless
Service, StatefulSet) with GPUs, probes, cache volume and graceful drain in place.
vLLM's own parser accepts the rendered arguments: tests/engine/test_manifest_args.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from engine.cli import main as engine_main
from engine.manifests import (
    DEFAULT_OUT,
    HF_HOME,
    OTLP_TRACES_ENDPOINT,
    PRESTOP_SLEEP_S,
    container_args,
    default_profiles,
    render_files,
    stale_diffs,
)
from engine.profiles import Profile, ProfileError, load_profile

REGENERATE = "run `.venv/bin/engine manifests` and commit deploy/k8s/engines/"
# What the container changes in `engine args` output, and nothing else.
ADAPTED_OPTIONS = {"--host", "--otlp-traces-endpoint", "--shutdown-timeout"}
EXPECTED_POOLS = {"large": "gpu-llama70b-eagle3", "small": "gpu-llama8b-small"}


def committed_pool(pool: str) -> dict[str, dict[str, Any]]:
    """The committed file of one pool, its documents by kind."""
    text = (DEFAULT_OUT / f"{pool}.yaml").read_text(encoding="utf-8")
    return {doc["kind"]: doc for doc in yaml.safe_load_all(text)}


def engine_container(pool: str) -> dict[str, Any]:
    containers = committed_pool(pool)["StatefulSet"]["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    container: dict[str, Any] = containers[0]
    return container


def without_options(args: list[str], options: set[str]) -> list[str]:
    """`args` minus the given options and their values (every one here takes a value)."""
    kept: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in options:
            skip = True
        else:
            kept.append(arg)
    return kept


def option(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_committed_manifests_equal_a_fresh_render() -> None:
    diffs = stale_diffs(render_files(default_profiles()), DEFAULT_OUT)
    assert not diffs, f"deploy/k8s/engines is stale: {REGENERATE}\n" + "\n".join(diffs)


def test_one_pool_per_tier_by_default_and_the_draft_profile_only_on_request() -> None:
    assert {p.pool: p.name for p in default_profiles()} == EXPECTED_POOLS
    kustomization = yaml.safe_load((DEFAULT_OUT / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == ["large.yaml", "small.yaml"]
    on_request = render_files([load_profile("gpu-qwen32b-draft")])
    assert set(on_request) == {"large-qwen.yaml", "kustomization.yaml"}


@pytest.mark.parametrize(("pool", "profile_name"), sorted(EXPECTED_POOLS.items()))
def test_container_args_are_engine_args_plus_the_container_adaptations(
    pool: str, profile_name: str
) -> None:
    profile = load_profile(profile_name)
    args = engine_container(pool)["args"]
    engine_args = profile.serve_args(port=8000)  # what `engine args --profile` prints
    assert without_options(args, ADAPTED_OPTIONS) == without_options(
        engine_args, {"--otlp-traces-endpoint"}
    )
    assert option(args, "--host") == "0.0.0.0"
    assert option(args, "--port") == "8000"
    assert option(args, "--otlp-traces-endpoint") == OTLP_TRACES_ENDPOINT
    drain_s = int(option(args, "--shutdown-timeout"))
    assert drain_s > 0  # vLLM aborts in-flight requests on SIGTERM when it is 0
    assert args == container_args(profile)
    for flag in ("--enable-prefix-caching", "--enable-prompt-tokens-details"):
        assert flag in args
    assert '"method":"eagle3"' in option(args, "--speculative-config")


@pytest.mark.parametrize(("pool", "profile_name"), sorted(EXPECTED_POOLS.items()))
def test_gpus_match_tensor_parallel_and_the_pod_can_hold_the_model(
    pool: str, profile_name: str
) -> None:
    profile = load_profile(profile_name)
    docs = committed_pool(pool)
    container = engine_container(pool)
    resources = container["resources"]
    gpus = profile.tensor_parallel_size
    assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"] == gpus
    assert {"cpu", "memory"} <= set(resources["requests"])
    assert container["image"] == "vllm/vllm-openai:v0.32.0"

    pod = docs["StatefulSet"]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["shm"]["emptyDir"]["medium"] == "Memory"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["shm"] == "/dev/shm"
    claims = docs["StatefulSet"]["spec"]["volumeClaimTemplates"]
    assert [c["metadata"]["name"] for c in claims] == ["model-cache"]
    assert HF_HOME.startswith(mounts["model-cache"] + "/")

    env = {e["name"]: e for e in container["env"]}
    assert env["HF_HOME"]["value"] == HF_HOME
    token = env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert token == {"name": "hf-token", "key": "token", "optional": True}


@pytest.mark.parametrize("pool", sorted(EXPECTED_POOLS))
def test_probes_watch_health_and_termination_leaves_time_to_drain(pool: str) -> None:
    container = engine_container(pool)
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[kind]["httpGet"] == {"path": "/health", "port": "http"}, kind
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1200  # 70B load
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop == ["sleep", str(PRESTOP_SLEEP_S)]
    drain_s = int(option(container["args"], "--shutdown-timeout"))
    pod = committed_pool(pool)["StatefulSet"]["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > PRESTOP_SLEEP_S + drain_s


@pytest.mark.parametrize("pool", sorted(EXPECTED_POOLS))
def test_headless_service_addresses_each_pod_of_the_stateful_set(pool: str) -> None:
    docs = committed_pool(pool)
    service, stateful_set = docs["Service"], docs["StatefulSet"]
    name = f"vllm-{pool}"
    assert service["metadata"]["name"] == stateful_set["metadata"]["name"] == name
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}
    ]
    spec = stateful_set["spec"]
    assert spec["serviceName"] == name
    assert spec["podManagementPolicy"] == "Parallel"
    pod_labels = spec["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert spec["selector"]["matchLabels"].items() <= pod_labels.items()
    assert docs["PodDisruptionBudget"]["spec"]["selector"] == spec["selector"]
    container_ports = engine_container(pool)["ports"]
    assert container_ports[0] == {"name": "http", "containerPort": 8000, "protocol": "TCP"}
    # The KV-cache events and their replay socket, dialled by every gateway.
    assert {p["name"]: p["containerPort"] for p in container_ports[1:]} == {
        "kv-events": 7000,
        "kv-replay": 6000,
    }


@pytest.mark.parametrize("pool", sorted(EXPECTED_POOLS))
def test_every_object_carries_the_layout_labels(pool: str) -> None:
    for kind, doc in committed_pool(pool).items():
        for labels in (doc["metadata"]["labels"], *pod_labels_of(doc)):
            assert labels["app.kubernetes.io/part-of"] == "agent-gateway", kind
            assert labels["app.kubernetes.io/component"] == "engine", kind
            assert labels["agent-gateway.dev/pool"] == pool, kind
            assert labels["agent-gateway.dev/tier"] == pool, kind
        assert doc["metadata"]["namespace"] == "agent-gateway"


def pod_labels_of(doc: dict[str, Any]) -> list[dict[str, str]]:
    template = doc["spec"].get("template")
    return [template["metadata"]["labels"]] if template else []


def test_check_fails_with_a_diff_when_a_file_is_stale(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert engine_main(["manifests", "--out", str(tmp_path)]) == 0
    assert engine_main(["manifests", "--out", str(tmp_path), "--check"]) == 0
    small = tmp_path / "small.yaml"
    small.write_text(small.read_text().replace("replicas: 2", "replicas: 7"))
    capsys.readouterr()
    assert engine_main(["manifests", "--out", str(tmp_path), "--check"]) == 1
    out = capsys.readouterr().out
    assert "-  replicas: 7" in out and "+  replicas: 2" in out
    assert "run `engine manifests`" in out


def test_rendering_is_deterministic_and_says_it_is_generated() -> None:
    first, second = render_files(default_profiles()), render_files(default_profiles())
    assert first == second
    for text in first.values():
        assert text.startswith("# Generated by `engine manifests`")


def test_cpu_profiles_do_not_become_cluster_pools() -> None:
    with pytest.raises(ProfileError, match="only gpu profiles"):
        render_files([load_profile("cpu-tiny")])


def test_the_kubernetes_section_is_strict_and_gpu_only() -> None:
    gpu = load_profile("gpu-llama8b-small").model_dump()
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        Profile.model_validate({**gpu, "kubernetes": {"replica": 2}})
    with pytest.raises(ValidationError, match="model_cache_size"):
        Profile.model_validate({**gpu, "kubernetes": {"model_cache_size": "50 GB"}})
    with pytest.raises(ValidationError, match="value"):
        Profile.model_validate(
            {**gpu, "kubernetes": {"tolerations": [{"key": "k", "operator": "Equal"}]}}
        )
    cpu = load_profile("cpu-tiny").model_dump()
    with pytest.raises(ValidationError, match="only gpu profiles"):
        Profile.model_validate({**cpu, "kubernetes": {}})


def test_the_small_profile_is_a_one_gpu_eagle3_llama() -> None:
    small = load_profile("gpu-llama8b-small")
    assert (small.device, small.pool, small.tensor_parallel_size) == ("gpu", "small", 1)
    assert small.speculative is not None and small.speculative.method == "eagle3"
    assert small.speculative.model == "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
    assert small.tool_calling is not None and small.tool_calling.parser == "llama3_json"
