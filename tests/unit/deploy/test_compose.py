"""deploy/docker-compose.yml: one GPU host runs the same engines as the cluster (the
arguments `engine manifests` rendered), a gateway started with arguments its CLI accepts
and a policy its loader accepts, whose replica URLs, Redis and trace endpoints name
services and ports of this file. There is no Docker engine here: the file is parsed and
cross-checked."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from gateway.policy import Policy, load_policy
from tests.unit.deploy.gateway_cli import parse_serve_args

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"
ENGINES = DEPLOY / "k8s" / "engines"
POOLS = ("large", "small")
ENGINE_PORT = 8000
COMPOSE_TRACES_ENDPOINT = "http://otel-collector:4317"
# `${NAME}` or `${NAME:-default}`, as Compose and the policy loader both spell it.
ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(:-[^}]*)?\}")

Doc = dict[str, Any]


@pytest.fixture(scope="module")
def compose() -> Doc:
    data: Doc = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))  # resolves `<<: *engine`
    return data


def service(compose: Doc, name: str) -> Doc:
    found: Doc = compose["services"][name]
    return found


def k8s_engine(pool: str) -> Doc:
    docs = yaml.safe_load_all((ENGINES / f"{pool}.yaml").read_text(encoding="utf-8"))
    (statefulset,) = [d for d in docs if d and d["kind"] == "StatefulSet"]
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    result: Doc = container
    return result


def option(args: list[str], name: str, default: str | None = None) -> str:
    if name not in args:
        assert default is not None, f"{name} missing from {args}"
        return default
    return args[args.index(name) + 1]


def seconds(duration: str) -> float:
    match = re.fullmatch(r"(\d+)(s|m)", duration)
    assert match, f"unexpected duration {duration!r}"
    return int(match.group(1)) * (60 if match.group(2) == "m" else 1)


def host_mount(volumes: list[str], target: str) -> Path:
    """The host path (relative to deploy/) bind-mounted at `target`."""
    for volume in volumes:
        source, mounted, *_ = volume.split(":")
        if mounted == target:
            return (DEPLOY / source).resolve()
    raise AssertionError(f"nothing is mounted at {target}")


def gateway_args(compose: Doc) -> list[str]:
    command: list[str] = service(compose, "gateway")["command"]
    return command


def policy_path(compose: Doc) -> Path:
    """The host file the gateway reads as its --policy."""
    inside = Path(parse_serve_args(gateway_args(compose)).policy)
    mounted = host_mount(service(compose, "gateway")["volumes"], str(inside.parent))
    return mounted / inside.name


@pytest.fixture
def compose_policy(compose: Doc, monkeypatch: pytest.MonkeyPatch) -> Policy:
    """The policy as the gateway container loads it: with the service's environment,
    `${VAR:-default}` values interpolated the way Compose does with nothing set."""
    for name, value in service(compose, "gateway")["environment"].items():
        monkeypatch.setenv(name, ENV_REF.sub(lambda m: (m.group(2) or ":-")[2:], str(value)))
    monkeypatch.delenv("GATEWAY_REQUEST_LOG", raising=False)
    return load_policy(policy_path(compose))


def test_the_services_of_one_gpu_host(compose: Doc) -> None:
    assert set(compose["services"]) == {
        "vllm-large",
        "vllm-small",
        "gateway",
        "redis",
        "otel-collector",
        "jaeger",
    }


@pytest.mark.parametrize("pool", POOLS)
def test_engines_run_what_the_cluster_runs(compose: Doc, pool: str) -> None:
    engine, k8s = service(compose, f"vllm-{pool}"), k8s_engine(pool)
    assert engine["image"] == k8s["image"]
    assert engine["entrypoint"] == k8s["command"]
    cluster_args = list(k8s["args"])
    at = cluster_args.index("--otlp-traces-endpoint") + 1
    cluster_args[at] = COMPOSE_TRACES_ENDPOINT  # the only difference: this file's Collector
    assert engine["command"] == cluster_args, (
        f"vllm-{pool} drifted from deploy/k8s/engines/{pool}.yaml: copy its args"
    )
    assert option(engine["command"], "--port") == str(ENGINE_PORT)
    drain = float(option(engine["command"], "--shutdown-timeout"))
    assert seconds(engine["stop_grace_period"]) >= drain + 5


def test_each_engine_gets_its_own_gpus(compose: Doc) -> None:
    claimed: list[str] = []
    for pool in POOLS:
        engine = service(compose, f"vllm-{pool}")
        (device,) = engine["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
        ids = device["device_ids"]
        assert len(ids) == int(option(engine["command"], "--tensor-parallel-size", "1"))
        claimed += ids
        assert engine["shm_size"], "tensor-parallel workers need /dev/shm"
        assert "ports" not in engine, "engines are reached through the gateway only"
    assert len(claimed) == len(set(claimed)), f"GPUs given twice: {claimed}"


def test_the_gateway_command_is_what_the_cli_accepts(compose: Doc) -> None:
    gateway = service(compose, "gateway")
    args = parse_serve_args(gateway_args(compose))
    assert args.host == "0.0.0.0"
    assert gateway["ports"] == [f"127.0.0.1:{args.port}:{args.port}"]
    assert seconds(gateway["stop_grace_period"]) >= args.drain_s + 5
    assert policy_path(compose).is_file()


def test_the_gateway_container_is_locked_down(compose: Doc) -> None:
    gateway = service(compose, "gateway")
    assert gateway["read_only"] is True
    assert gateway["tmpfs"] == ["/tmp"]
    assert gateway["cap_drop"] == ["ALL"]
    assert "no-new-privileges:true" in gateway["security_opt"]
    uid = int(str(gateway["user"]).split(":")[0])
    dockerfile = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(rf"^USER {uid}(:\d+)?$", dockerfile, re.M), "the image's own user"
    assert all(mount.endswith(":ro") for mount in gateway["volumes"])


def test_the_gateway_is_built_from_the_dockerfile(compose: Doc) -> None:
    gateway = service(compose, "gateway")
    context = (DEPLOY / gateway["build"]["context"]).resolve()
    assert (context / gateway["build"]["dockerfile"]) == DEPLOY / "Dockerfile"
    assert (context / "pyproject.toml").is_file()
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert gateway["image"] == f"agent-gateway:{version}"


def test_every_variable_the_policy_needs_is_in_the_gateway_environment(compose: Doc) -> None:
    text = policy_path(compose).read_text(encoding="utf-8")
    environment = service(compose, "gateway")["environment"]
    for match in ENV_REF.finditer(text):
        if match.group(2) is None:  # no default: the container must set it
            assert match.group(1) in environment, f"${{{match.group(1)}}} is never set"
    for name in environment:
        assert f"${{{name}" in text, f"{name} is set but the policy never reads it"


def test_compose_variables_all_have_defaults(compose: Doc) -> None:
    """`docker compose up` works with nothing exported (HF_TOKEN only for gated models)."""
    for match in ENV_REF.finditer(COMPOSE.read_text(encoding="utf-8")):
        assert match.group(2) is not None, f"${{{match.group(1)}}} has no default"


def test_the_policy_loads_and_names_this_files_services(
    compose: Doc, compose_policy: Policy
) -> None:
    assert set(compose_policy.pools) == set(POOLS)
    for pool_name, pool in compose_policy.pools.items():
        (replica,) = pool.replicas
        url = urlsplit(replica.url)
        engine = service(compose, str(url.hostname))
        assert url.port == int(option(engine["command"], "--port"))
        assert pool.served_model == option(engine["command"], "--served-model-name")
        assert url.hostname == f"vllm-{pool_name}"
        assert pool.discover is None
    redis = urlsplit(compose_policy.state.redis_url)
    assert redis.hostname == "redis" and redis.port == 6379
    assert compose_policy.auth.keys_file == "", "no keys asked unless GATEWAY_API_KEYS_FILE is set"
    assert not compose_policy.telemetry.request_log


def test_traces_reach_jaeger_through_the_collector(compose: Doc, compose_policy: Policy) -> None:
    collector = service(compose, "otel-collector")
    (config_flag,) = collector["command"]
    inside = config_flag.removeprefix("--config=")
    config_file = host_mount(collector["volumes"], inside)
    assert config_file == DEPLOY / "k8s" / "observability" / "otel-collector-config.yaml"
    config = yaml.safe_load(config_file.read_text(encoding="utf-8"))
    protocols = config["receivers"]["otlp"]["protocols"]
    traces = urlsplit(str(compose_policy.telemetry.traces.endpoint))
    assert traces.hostname == "otel-collector"
    assert protocols["http"]["endpoint"].endswith(f":{traces.port}")
    engines = urlsplit(COMPOSE_TRACES_ENDPOINT)
    assert protocols["grpc"]["endpoint"].endswith(f":{engines.port}")
    (exporter,) = config["service"]["pipelines"]["traces"]["exporters"]
    host = config["exporters"][exporter]["endpoint"].split(":")[0]
    assert host in compose["services"]


def test_redis_persists_every_write(compose: Doc) -> None:
    redis = service(compose, "redis")
    command = redis["command"]
    assert option(command, "--appendonly") == "yes"
    assert option(command, "--appendfsync") == "everysec"
    assert option(command, "--maxmemory-policy") == "noeviction"
    assert any(volume.endswith(":/data") for volume in redis["volumes"])
    gateway = service(compose, "gateway")
    assert gateway["depends_on"]["redis"] == {"condition": "service_healthy"}
    assert "healthcheck" in redis


def test_every_image_is_pinned(compose: Doc) -> None:
    for name, spec in compose["services"].items():
        tag = spec["image"].rpartition(":")[2]
        assert re.fullmatch(r"v?\d+\.\d+\.\d+(-[a-z0-9.]+)?", tag), f"{name}: {spec['image']}"


def test_api_keys_for_compose_are_never_committed() -> None:
    ignored = (DEPLOY / "compose" / ".gitignore").read_text(encoding="utf-8").split()
    assert "keys/" in ignored
