"""deploy/k8s: what `kubectl apply -k deploy/k8s` would receive is valid Kubernetes for
1.30 and 1.34 (kubernetes-validate, strict: unknown fields fail), the custom resources meet
their own schema, and the pieces fit together: Services, probes, network policies and
monitors point at ports and pods that exist, the gateway drains within its grace period,
runs locked down, and serves the policy the gateway's own loader accepts.

`kubectl kustomize` runs offline; without kubectl the tests on the rendered stack skip.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from gateway.policy import Policy, load_policy
from tests.unit.deploy.gateway_cli import parse_serve_args

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "deploy" / "k8s"
NAMESPACE = "agent-gateway"
KUBERNETES_VERSIONS = ("1.30.0", "1.34.0")
SERVICE_MONITOR_SCHEMA = (
    K8S / "observability" / "prometheus-operator" / "servicemonitor.schema.json"
)
# Custom resources, checked against the schema committed for the fields they use.
CUSTOM_SCHEMAS = {("monitoring.coreos.com/v1", "ServiceMonitor"): SERVICE_MONITOR_SCHEMA}
SECRETS_EXAMPLE = K8S / "secrets.example.yaml"
DASHBOARD_SOURCE = ROOT / "deploy" / "observability" / "grafana-dashboard.json"
WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet")
# The components this directory runs (engines are rendered and tested by the engines' tests).
PLATFORM_COMPONENTS = ("gateway", "redis", "otel-collector", "jaeger")
REDIS_URL = "redis://redis:6379/0"

Doc = dict[str, Any]


# ---- reading the manifests ---------------------------------------------------------------


def kustomizations() -> list[Path]:
    return sorted(K8S.rglob("kustomization.yaml"))


def generator_inputs() -> set[Path]:
    """Files kustomize turns into ConfigMaps (`key=path` or `path`): data, not manifests."""
    inputs: set[Path] = set()
    for path in kustomizations():
        spec = yaml.safe_load(path.read_text(encoding="utf-8"))
        for generator in spec.get("configMapGenerator", []) + spec.get("secretGenerator", []):
            for entry in generator.get("files", []):
                inputs.add((path.parent / str(entry).split("=", 1)[-1]).resolve())
    return inputs


def listed_resources() -> set[Path]:
    listed: set[Path] = set()
    for path in kustomizations():
        spec = yaml.safe_load(path.read_text(encoding="utf-8"))
        for entry in spec.get("resources", []):
            listed.add((path.parent / entry).resolve())
    return listed


def manifest_files() -> list[Path]:
    """Every YAML under deploy/k8s that holds Kubernetes objects."""
    skip = generator_inputs()
    return [
        path
        for path in sorted(K8S.rglob("*.yaml"))
        if path.name != "kustomization.yaml" and path.resolve() not in skip
    ]


def documents(path: Path) -> list[Doc]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]


def kustomize(directory: Path) -> list[Doc]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: `kubectl kustomize deploy/k8s` cannot run")
    done = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, f"kubectl kustomize {directory} failed:\n{done.stderr}"
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.fixture(scope="module")
def rendered() -> list[Doc]:
    return kustomize(K8S)


def find(docs: list[Doc], kind: str, name: str) -> Doc:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


@dataclass(frozen=True)
class PodTemplate:
    workload: str
    labels: dict[str, str]
    spec: Doc

    @property
    def component(self) -> str:
        return self.labels.get("app.kubernetes.io/component", "")

    def container_ports(self) -> list[Doc]:
        return [port for c in self.spec["containers"] for port in c.get("ports", [])]


def pod_templates(docs: list[Doc]) -> list[PodTemplate]:
    return [
        PodTemplate(
            f"{d['kind']}/{d['metadata']['name']}",
            d["spec"]["template"]["metadata"]["labels"],
            d["spec"]["template"]["spec"],
        )
        for d in docs
        if d["kind"] in WORKLOAD_KINDS
    ]


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def selected(docs: list[Doc], selector: Doc) -> list[PodTemplate]:
    assert "matchExpressions" not in selector, "only matchLabels selectors are cross-checked"
    match = selector.get("matchLabels", selector)
    return [pod for pod in pod_templates(docs) if selects(match, pod.labels)]


def has_port(ports: list[Doc], port: int | str) -> bool:
    return any(port in (p.get("name"), p.get("containerPort"), p.get("port")) for p in ports)


def gateway_pod(docs: list[Doc]) -> PodTemplate:
    (pod,) = [p for p in pod_templates(docs) if p.component == "gateway"]
    return pod


def gateway_container(docs: list[Doc]) -> Doc:
    (container,) = gateway_pod(docs).spec["containers"]
    result: Doc = container
    return result


@pytest.fixture
def cluster_policy(monkeypatch: pytest.MonkeyPatch) -> Policy:
    """The ConfigMap's policy as the gateway loads it in the pod (REDIS_URL from the env)."""
    monkeypatch.setenv("REDIS_URL", REDIS_URL)
    monkeypatch.delenv("GATEWAY_REQUEST_LOG", raising=False)
    return load_policy(K8S / "gateway" / "policy.yaml")


# ---- valid Kubernetes ----------------------------------------------------------------------


def schema_errors(doc: Doc, version: str) -> list[str]:
    where = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        schema_path = CUSTOM_SCHEMAS.get((doc["apiVersion"], doc["kind"]))
        if schema_path is None:
            return [f"{where}: no schema for {doc['apiVersion']} {doc['kind']}"]
        schema = json.loads(schema_path.read_text(encoding="utf-8"))
        validator = jsonschema.Draft202012Validator(schema)
        return [f"{where}: {e.json_path}: {e.message}" for e in validator.iter_errors(doc)]
    except kubernetes_validate.ValidationError as exc:
        path = ".".join(str(p) for p in exc.path)
        return [f"{where} (Kubernetes {exc.version}): {path}: {exc.message}"]
    return []


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_rendered_stack_is_valid_kubernetes(rendered: list[Doc], version: str) -> None:
    errors = [e for doc in rendered for e in schema_errors(doc, version)]
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: str(p.relative_to(K8S)))
def test_each_manifest_file_is_valid_kubernetes(path: Path, version: str) -> None:
    docs = documents(path)
    assert docs, f"{path} holds no objects"
    errors = [e for doc in docs for e in schema_errors(doc, version)]
    assert not errors, "\n".join(errors)


def test_strict_validation_refuses_an_unknown_field() -> None:
    """Guards the guard: a misspelt field must fail, not be dropped on apply."""
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "x"},
        "spec": {"ports": [{"port": 80}], "selectr": {"a": "b"}},
    }
    assert schema_errors(service, "1.34.0")
    monitor = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": "x"},
        "spec": {"selector": {}, "endpoints": [{"port": "http", "intervl": "5s"}]},
    }
    assert schema_errors(monitor, "1.34.0")


def test_every_manifest_is_applied_except_the_example_secrets() -> None:
    listed = listed_resources()
    for path in manifest_files():
        if path == SECRETS_EXAMPLE:
            assert path.resolve() not in listed, "an apply must never overwrite real Secrets"
        else:
            assert path.resolve() in listed, f"{path} is in no kustomization's resources"


def test_everything_lands_in_the_namespace_with_the_layout_labels(rendered: list[Doc]) -> None:
    find(rendered, "Namespace", NAMESPACE)
    for doc in rendered:
        meta = doc["metadata"]
        where = f"{doc['kind']}/{meta['name']}"
        if doc["kind"] != "Namespace":
            assert meta.get("namespace") == NAMESPACE, where
        assert meta["labels"]["app.kubernetes.io/part-of"] == "agent-gateway", where
    for pod in pod_templates(rendered):
        assert pod.labels["app.kubernetes.io/part-of"] == "agent-gateway", pod.workload
        assert pod.component, f"{pod.workload} has no app.kubernetes.io/component label"


# ---- the pieces fit ------------------------------------------------------------------------


def test_every_workload_selects_its_own_pods(rendered: list[Doc]) -> None:
    for doc in rendered:
        if doc["kind"] in WORKLOAD_KINDS:
            labels = doc["spec"]["template"]["metadata"]["labels"]
            assert selects(doc["spec"]["selector"]["matchLabels"], labels), doc["metadata"]["name"]


def test_every_service_selects_pods_that_serve_its_target_ports(rendered: list[Doc]) -> None:
    for service in (d for d in rendered if d["kind"] == "Service"):
        name = service["metadata"]["name"]
        pods = selected(rendered, service["spec"]["selector"])
        assert pods, f"Service {name} selects no pod template"
        for port in service["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            for pod in pods:
                assert has_port(pod.container_ports(), target), f"{name}:{target} on {pod.workload}"


def test_every_probe_names_a_port_of_its_container(rendered: list[Doc]) -> None:
    for pod in pod_templates(rendered):
        for container in pod.spec["containers"]:
            for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
                probe = container.get(kind)
                if probe is None:
                    continue
                action = probe.get("httpGet") or probe.get("tcpSocket")
                if action is not None:
                    assert has_port(container.get("ports", []), action["port"]), (
                        f"{pod.workload} {kind} port {action['port']}"
                    )


def test_every_platform_pod_has_probes_resources_and_a_pinned_image(
    rendered: list[Doc],
) -> None:
    for pod in pod_templates(rendered):
        for container in pod.spec["containers"]:
            where = f"{pod.workload}/{container['name']}"
            image = container["image"]
            name, _, tag = image.rpartition(":")
            assert name and tag and "/" not in tag and tag != "latest", f"{where}: {image}"
            resources = container.get("resources", {})
            assert {"cpu", "memory"} <= set(resources.get("requests", {})), where
            assert "memory" in resources.get("limits", {}), where
            if pod.component in PLATFORM_COMPONENTS:
                assert "readinessProbe" in container, where
                assert "livenessProbe" in container, where


def container_security(pod: PodTemplate, container: Doc) -> Doc:
    """The container's effective security settings: its own over the pod's."""
    return {**pod.spec.get("securityContext", {}), **container.get("securityContext", {})}


@pytest.mark.parametrize("component", PLATFORM_COMPONENTS)
def test_platform_pods_run_locked_down(rendered: list[Doc], component: str) -> None:
    (pod,) = [p for p in pod_templates(rendered) if p.component == component]
    assert pod.spec.get("automountServiceAccountToken") is False, pod.workload
    for container in pod.spec["containers"]:
        security = container_security(pod, container)
        where = f"{pod.workload}/{container['name']}"
        assert security.get("runAsNonRoot") is True, where
        assert security.get("runAsUser", 0) != 0, where
        assert container["securityContext"].get("allowPrivilegeEscalation") is False, where
        assert container["securityContext"].get("readOnlyRootFilesystem") is True, where
        assert container["securityContext"]["capabilities"]["drop"] == ["ALL"], where
        assert security["seccompProfile"]["type"] == "RuntimeDefault", where


# ---- the gateway ---------------------------------------------------------------------------


def test_the_gateway_command_is_what_the_cli_accepts(rendered: list[Doc]) -> None:
    container = gateway_container(rendered)
    assert "command" not in container, "the image's ENTRYPOINT is `gateway`"
    args = parse_serve_args(container["args"])
    assert args.policy == "/etc/gateway/policy.yaml"
    assert args.host == "0.0.0.0"
    assert has_port(container["ports"], args.port)
    service = find(rendered, "Service", "gateway")
    assert [(p["name"], p["port"]) for p in service["spec"]["ports"]] == [("http", 8080)]


def test_the_grace_period_covers_the_prestop_sleep_and_the_drain(rendered: list[Doc]) -> None:
    container = gateway_container(rendered)
    drain_s = parse_serve_args(container["args"]).drain_s
    sleep = container["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep[0] == "sleep"
    grace = gateway_pod(rendered).spec["terminationGracePeriodSeconds"]
    assert grace >= int(sleep[1]) + drain_s + 5, (grace, sleep, drain_s)


def test_the_gateway_is_highly_available(rendered: list[Doc]) -> None:
    deployment = find(rendered, "Deployment", "gateway")
    assert "replicas" not in deployment["spec"], (
        "the HPA owns the count; an apply must not reset it"
    )
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    hpa = find(rendered, "HorizontalPodAutoscaler", "gateway")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "gateway",
    }
    assert hpa["spec"]["minReplicas"] >= 2
    (metric,) = hpa["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu"
    pdb = find(rendered, "PodDisruptionBudget", "gateway")
    assert [p.workload for p in selected(rendered, pdb["spec"]["selector"])] == [
        "Deployment/gateway"
    ]
    spread = gateway_pod(rendered).spec["topologySpreadConstraints"]
    by_node = [s for s in spread if s["topologyKey"] == "kubernetes.io/hostname"]
    assert by_node and by_node[0]["whenUnsatisfiable"] == "DoNotSchedule"
    assert selects(by_node[0]["labelSelector"]["matchLabels"], gateway_pod(rendered).labels)


def test_the_gateway_probes_health_and_readiness(rendered: list[Doc]) -> None:
    container = gateway_container(rendered)
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"


def mounted_files(rendered: list[Doc]) -> dict[str, tuple[str, str, str]]:
    """Absolute path in the gateway container -> (source kind, source name, key)."""
    pod, container = gateway_pod(rendered), gateway_container(rendered)
    volumes = {v["name"]: v for v in pod.spec["volumes"]}
    files: dict[str, tuple[str, str, str]] = {}
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        for source in volume.get("projected", {}).get("sources", []):
            for kind in ("configMap", "secret"):
                if kind in source:
                    for item in source[kind]["items"]:
                        path = f"{mount['mountPath'].rstrip('/')}/{item['path']}"
                        files[path] = (kind, source[kind]["name"], item["key"])
        assert "subPath" not in mount, "a subPath mount never sees ConfigMap updates"
    return files


def test_the_policy_and_keys_reach_the_paths_the_gateway_reads(
    rendered: list[Doc], cluster_policy: Policy
) -> None:
    files = mounted_files(rendered)
    policy_arg = parse_serve_args(gateway_container(rendered)["args"]).policy
    assert files[policy_arg] == ("configMap", "gateway-policy", "policy.yaml")
    assert files[cluster_policy.auth.keys_file] == ("secret", "gateway-api-keys", "keys")


def test_the_policy_configmap_is_the_committed_file_under_a_fixed_name(
    rendered: list[Doc],
) -> None:
    config_map = find(rendered, "ConfigMap", "gateway-policy")  # no hash: updated in place
    committed = (K8S / "gateway" / "policy.yaml").read_text(encoding="utf-8")
    assert config_map["data"] == {"policy.yaml": committed}


def test_the_cluster_policy_loads_and_points_at_the_cluster(
    rendered: list[Doc], cluster_policy: Policy
) -> None:
    container = gateway_container(rendered)
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    assert env["REDIS_URL"] == REDIS_URL
    assert cluster_policy.state.redis_url == REDIS_URL
    redis = urlsplit(REDIS_URL)
    assert has_port(
        find(rendered, "Service", str(redis.hostname))["spec"]["ports"], redis.port or 0
    )
    assert not cluster_policy.telemetry.request_log, (
        "a per-pod log on an emptyDir is off by default"
    )
    writable = [m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")]
    assert writable == ["/tmp"]
    assert cluster_policy.state.embedded_dir.startswith("/tmp/")
    traces = urlsplit(str(cluster_policy.telemetry.traces.endpoint))
    collector = find(rendered, "Service", str(traces.hostname))
    assert has_port(collector["spec"]["ports"], traces.port or 0)
    assert traces.path == "/v1/traces" and traces.port == 4318


def test_every_pool_discovers_the_headless_service_of_its_engines(
    rendered: list[Doc], cluster_policy: Policy
) -> None:
    pools = cluster_policy.pools
    assert set(pools) == {"large", "small"}
    for name, pool in pools.items():
        discover = pool.discover
        assert discover is not None and not pool.replicas, f"pool {name}: discovered pods only"
        service_name, namespace, *_ = discover.dns.split(".")
        assert namespace == NAMESPACE, discover.dns
        service = find(rendered, "Service", service_name)
        assert service["spec"]["clusterIP"] == "None", "one DNS A record per pod, not a VIP"
        assert has_port(service["spec"]["ports"], discover.port)
        (pod,) = selected(rendered, service["spec"]["selector"])
        assert pod.labels["agent-gateway.dev/pool"] == name
        assert pod.labels["agent-gateway.dev/tier"] == pool.tier
        served = pod.spec["containers"][0]["args"]
        assert served[served.index("--served-model-name") + 1] == pool.served_model
    routable = [m for m in cluster_policy.models.values() if m.tiering]
    assert [cluster_policy.tiering[str(m.tiering)].tiers for m in routable] == [
        {"small": "small", "large": "large"}
    ]


def test_the_image_is_the_one_the_dockerfile_builds(rendered: list[Doc]) -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    image = gateway_container(rendered)["image"]
    assert image.endswith(f"/agent-gateway:{version}"), image


# ---- network policies ------------------------------------------------------------------------


def ingress_sources(rendered: list[Doc], component: str) -> tuple[set[str], set[int], bool]:
    """Components allowed in, ports opened, and whether anyone (no `from`) may connect."""
    pods: set[str] = set()
    ports: set[int] = set()
    anyone = False
    for policy in (d for d in rendered if d["kind"] == "NetworkPolicy"):
        target = policy["spec"]["podSelector"].get("matchLabels", {})
        if not target or target.get("app.kubernetes.io/component") != component:
            continue
        for rule in policy["spec"].get("ingress", []):
            ports |= {p["port"] for p in rule.get("ports", [])}
            if "from" not in rule:
                anyone = True
            for peer in rule.get("from", []):
                if "podSelector" in peer and "namespaceSelector" not in peer:
                    pods |= {p.component for p in selected(rendered, peer["podSelector"])}
    return pods, ports, anyone


def test_ingress_is_denied_unless_a_policy_opens_it(rendered: list[Doc]) -> None:
    deny = find(rendered, "NetworkPolicy", "default-deny-ingress")
    assert deny["spec"] == {"podSelector": {}, "policyTypes": ["Ingress"]}


def test_network_policies_select_real_pods_and_ports(rendered: list[Doc]) -> None:
    for policy in (d for d in rendered if d["kind"] == "NetworkPolicy"):
        name = policy["metadata"]["name"]
        if not policy["spec"]["podSelector"]:
            continue
        pods = selected(rendered, policy["spec"]["podSelector"])
        assert pods, f"{name} selects no pod"
        for rule in policy["spec"].get("ingress", []):
            for peer in rule.get("from", []):
                if "podSelector" in peer:
                    assert selected(rendered, peer["podSelector"]), f"{name}: a peer matches no pod"
            for port in rule.get("ports", []):
                for pod in pods:
                    assert has_port(pod.container_ports(), port["port"]), f"{name}: {port}"


def test_the_network_map(rendered: list[Doc]) -> None:
    assert ingress_sources(rendered, "gateway") == (set(), {8080}, True)
    assert ingress_sources(rendered, "engine") == ({"gateway"}, {8000, 7000, 6000}, False)
    assert ingress_sources(rendered, "redis") == ({"gateway"}, {6379}, False)
    assert ingress_sources(rendered, "otel-collector") == (
        {"gateway", "engine"},
        {4317, 4318},
        False,
    )
    assert ingress_sources(rendered, "jaeger") == ({"otel-collector"}, {4317}, False)
    for pod in pod_templates(rendered):
        assert any(ingress_sources(rendered, pod.component)), f"nothing reaches {pod.workload}"


def test_prometheus_may_scrape_the_engines_from_its_namespace(rendered: list[Doc]) -> None:
    policy = find(rendered, "NetworkPolicy", "engines-from-gateway")
    peers = [peer for rule in policy["spec"]["ingress"] for peer in rule["from"]]
    namespaces = [p["namespaceSelector"]["matchLabels"] for p in peers if "namespaceSelector" in p]
    assert namespaces == [{"kubernetes.io/metadata.name": "monitoring"}]


# ---- Redis ---------------------------------------------------------------------------------


def redis_settings() -> dict[str, str]:
    lines = (K8S / "redis" / "redis.conf").read_text(encoding="utf-8").splitlines()
    pairs = [line.split("#", 1)[0].split(None, 1) for line in lines]
    return {p[0]: p[1].strip() for p in pairs if len(p) == 2}


def quantity_mb(quantity: str) -> float:
    units = {"Mi": 1.048576, "Gi": 1073.741824, "M": 1.0, "G": 1000.0, "mb": 1.0, "gb": 1000.0}
    match = re.fullmatch(r"(\d+)([A-Za-z]+)", quantity)
    assert match, quantity
    return int(match.group(1)) * units[match.group(2)]


def test_redis_persists_every_write_to_its_own_volume(rendered: list[Doc]) -> None:
    settings = redis_settings()
    assert settings["appendonly"] == "yes"
    assert settings["appendfsync"] == "everysec"
    assert settings["dir"] == "/data"
    assert settings["maxmemory-policy"] == "noeviction", "evicting would drop sessions silently"
    statefulset = find(rendered, "StatefulSet", "redis")
    assert statefulset["spec"]["replicas"] == 1
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    (container,) = statefulset["spec"]["template"]["spec"]["containers"]
    assert {"name": "data", "mountPath": "/data"} in container["volumeMounts"]
    assert claim["metadata"]["name"] == "data"
    assert re.fullmatch(r"redis:7\.\d+\.\d+(-[a-z]+)?", container["image"]), container["image"]
    limit = quantity_mb(container["resources"]["limits"]["memory"])
    assert quantity_mb(settings["maxmemory"]) < 0.7 * limit, "room for the AOF rewrite's fork"


def test_redis_reads_the_committed_config(rendered: list[Doc]) -> None:
    statefulset = find(rendered, "StatefulSet", "redis")
    pod = statefulset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    config_map_name = next(v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v)
    config_map = find(rendered, "ConfigMap", config_map_name)
    committed = (K8S / "redis" / "redis.conf").read_text(encoding="utf-8")
    assert config_map["data"] == {"redis.conf": committed}
    assert container["command"] == ["redis-server", "/etc/redis/redis.conf"]


# ---- observability -------------------------------------------------------------------------


def collector_config() -> Doc:
    config: Doc = yaml.safe_load(
        (K8S / "observability" / "otel-collector-config.yaml").read_text(encoding="utf-8")
    )
    return config


def host_port(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    return host, int(port)


def test_the_collector_receives_otlp_and_exports_to_jaeger(rendered: list[Doc]) -> None:
    config = collector_config()
    protocols = config["receivers"]["otlp"]["protocols"]
    assert host_port(protocols["grpc"]["endpoint"]) == ("0.0.0.0", 4317)
    assert host_port(protocols["http"]["endpoint"]) == ("0.0.0.0", 4318)
    (pipeline,) = config["service"]["pipelines"].values()
    assert "batch" in pipeline["processors"]
    for kind in ("receivers", "processors", "exporters"):
        for name in pipeline[kind]:
            assert name in config[kind], f"pipeline names undefined {kind[:-1]} {name}"
    (exporter,) = pipeline["exporters"]
    assert exporter.split("/")[0] == "otlp_grpc"
    host, port = host_port(config["exporters"][exporter]["endpoint"])
    assert has_port(find(rendered, "Service", host)["spec"]["ports"], port)
    collector = find(rendered, "Service", "otel-collector")
    assert {p["port"] for p in collector["spec"]["ports"]} == {4317, 4318}
    (pod,) = [p for p in pod_templates(rendered) if p.component == "otel-collector"]
    health = host_port(config["extensions"]["health_check"]["endpoint"])[1]
    assert has_port(pod.container_ports(), health)


def test_engines_export_traces_to_the_collector(rendered: list[Doc]) -> None:
    for pod in (p for p in pod_templates(rendered) if p.component == "engine"):
        args = pod.spec["containers"][0]["args"]
        endpoint = urlsplit(args[args.index("--otlp-traces-endpoint") + 1])
        assert str(endpoint.hostname).split(".")[:2] == ["otel-collector", NAMESPACE]
        assert endpoint.port == 4317, "vLLM exports OTLP over gRPC"


def test_every_image_tag_of_the_stack_is_pinned(rendered: list[Doc]) -> None:
    images = {c["image"] for p in pod_templates(rendered) for c in p.spec["containers"]}
    for image in images:
        tag = image.rpartition(":")[2]
        assert re.fullmatch(r"v?\d+\.\d+\.\d+(-[a-z0-9.]+)?", tag), f"{image}: pin a release"


def test_the_service_monitors_scrape_real_service_ports(rendered: list[Doc]) -> None:
    monitors = {d["metadata"]["name"]: d for d in rendered if d["kind"] == "ServiceMonitor"}
    assert set(monitors) == {"gateway", "vllm"}
    services = [d for d in rendered if d["kind"] == "Service"]
    scraped: set[str] = set()
    for monitor in monitors.values():
        match = monitor["spec"]["selector"]["matchLabels"]
        chosen = [s for s in services if selects(match, s["metadata"]["labels"])]
        assert chosen, f"ServiceMonitor {monitor['metadata']['name']} selects no Service"
        for service in chosen:
            scraped.add(service["metadata"]["name"])
            for endpoint in monitor["spec"]["endpoints"]:
                assert endpoint["path"] == "/metrics"
                assert has_port(service["spec"]["ports"], endpoint["port"])
    assert scraped == {"gateway", "vllm-large", "vllm-small"}


def test_the_service_monitors_are_an_optional_component() -> None:
    top = yaml.safe_load((K8S / "kustomization.yaml").read_text(encoding="utf-8"))
    component = K8S / "observability" / "prometheus-operator"
    assert top["components"] == ["observability/prometheus-operator"]
    assert yaml.safe_load((component / "kustomization.yaml").read_text())["kind"] == "Component"
    for path in K8S.rglob("*.yaml"):
        if component not in path.parents:
            kinds = {d.get("kind") for d in yaml.safe_load_all(path.read_text()) if d}
            assert "ServiceMonitor" not in kinds, f"{path}: keep CRD objects in the component"


def test_the_grafana_dashboard_is_the_observability_dashboard(rendered: list[Doc]) -> None:
    config_map = find(rendered, "ConfigMap", "agent-gateway-dashboard")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    (text,) = config_map["data"].values()
    source = DASHBOARD_SOURCE.read_text(encoding="utf-8")
    assert text == source, (
        "deploy/k8s/observability/grafana-dashboard.json differs from "
        "deploy/observability/grafana-dashboard.json: copy it over"
    )
    json.loads(text)


# ---- secrets -------------------------------------------------------------------------------


def referenced_secrets(rendered: list[Doc]) -> Iterator[tuple[str, str]]:
    for pod in pod_templates(rendered):
        for volume in pod.spec.get("volumes", []):
            for source in volume.get("projected", {}).get("sources", []):
                if "secret" in source:
                    for item in source["secret"]["items"]:
                        yield source["secret"]["name"], item["key"]
        for container in pod.spec["containers"]:
            for env in container.get("env", []):
                ref = env.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    yield ref["name"], ref["key"]


def test_the_example_secrets_are_placeholders_for_every_secret_used(
    rendered: list[Doc],
) -> None:
    assert not [d for d in rendered if d["kind"] == "Secret"], "an apply must not ship Secrets"
    examples = {d["metadata"]["name"]: d for d in documents(SECRETS_EXAMPLE)}
    for name, key in set(referenced_secrets(rendered)):
        assert name in examples, f"Secret {name} has no example"
        value = examples[name]["stringData"][key]
        assert "REPLACE-ME" in value, f"{name}/{key} must stay a placeholder"
