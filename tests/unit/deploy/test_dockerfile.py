"""deploy/Dockerfile: a multi-stage build on a base pinned by digest, wheels built in the
first stage and installed offline in the second, a non-root numeric user, a HEALTHCHECK
that works without curl, and an ENTRYPOINT/CMD the gateway's CLI accepts. No Docker
engine here: the file is parsed, and the health check's command is run against a real
HTTP server."""

from __future__ import annotations

import fnmatch
import re
import shlex
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import orjson
import pytest
import yaml

from tests.unit.deploy.gateway_cli import parse_serve_args

ROOT = Path(__file__).resolve().parents[3]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
# The policy path the Deployment and Compose mount (tests/unit/deploy/test_k8s_manifests.py).
POLICY_IN_CONTAINER = "/etc/gateway/policy.yaml"


@dataclass(frozen=True)
class Instruction:
    keyword: str
    value: str

    def exec_form(self) -> list[str]:
        """The JSON array of an exec-form instruction (ENTRYPOINT, CMD, HEALTHCHECK CMD)."""
        text = self.value
        if self.keyword == "HEALTHCHECK":  # options, then `CMD [...]`
            text = re.split(r"(?:^|\s)CMD\s", text, maxsplit=1)[-1]
        parsed = orjson.loads(text)
        assert isinstance(parsed, list), f"{self.keyword} is not in exec form: {self.value}"
        return [str(part) for part in parsed]


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def one(self, keyword: str) -> Instruction:
        (found,) = self.all(keyword)
        return found


def logical_lines(text: str) -> Iterator[str]:
    """Instructions with their `\\` continuations joined; comments and blanks dropped."""
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        yield pending + line
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARGs (before the first FROM) and the stages, with ${ARG} expanded in FROM."""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical_lines(text):
        keyword, _, value = line.partition(" ")
        keyword, value = keyword.upper(), value.strip()
        if keyword == "ARG" and not stages:
            arg, _, default = value.partition("=")
            args[arg] = default
        elif keyword == "FROM":
            words = [w for w in value.split() if not w.startswith("--platform")]
            base = re.sub(r"\$\{?(\w+)\}?", lambda m: args[m.group(1)], words[0])
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base, name))
        else:
            assert stages, f"{keyword} before the first FROM"
            stages[-1].instructions.append(Instruction(keyword, value))
    return args, stages


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse(DOCKERFILE.read_text(encoding="utf-8"))[1]


@pytest.fixture(scope="module")
def runtime(stages: list[Stage]) -> Stage:
    return stages[-1]


def test_stages_build_wheels_then_install_them_offline(stages: list[Stage]) -> None:
    assert len(stages) >= 2
    build, runtime = stages[0], stages[-1]
    assert build.name, "the wheel stage is named so the runtime stage can take from it"
    assert any("pip wheel" in run.value for run in build.all("RUN"))
    install = [run.value for run in runtime.all("RUN") if "pip install" in run.value]
    assert len(install) == 1
    assert "--no-index" in install[0], "nothing is downloaded in the runtime stage"
    assert f"from={build.name}" in install[0] or any(
        f"--from={build.name}" in c.value for c in runtime.all("COPY")
    )
    assert not runtime.all("ADD")


def test_every_base_is_pinned_by_digest_to_the_projects_python(stages: list[Stage]) -> None:
    python = PYPROJECT["tool"]["mypy"]["python_version"]
    named = {stage.name for stage in stages if stage.name}
    for stage in stages:
        if stage.base in named:
            continue
        assert DIGEST.search(stage.base), f"{stage.base}: pin the base by its sha256 digest"
        image, _, tag = stage.base.split("@")[0].rpartition(":")
        assert image == "python", stage.base
        assert re.fullmatch(rf"{re.escape(python)}\.\d+-slim-bookworm", tag), stage.base


def test_the_gateway_runs_as_a_numeric_non_root_user(runtime: Stage) -> None:
    user = runtime.all("USER")[-1].value
    assert re.fullmatch(r"\d+:\d+", user), f"USER {user}: numeric uid:gid (runAsNonRoot checks it)"
    uid, gid = (int(part) for part in user.split(":"))
    assert uid != 0 and gid != 0
    created = " ".join(run.value for run in runtime.all("RUN"))
    assert f"--uid {uid}" in created and f"--gid {gid}" in created


def test_the_deployment_runs_as_the_images_user(runtime: Stage) -> None:
    uid, gid = (int(part) for part in runtime.all("USER")[-1].value.split(":"))
    deployment = yaml.safe_load((ROOT / "deploy/k8s/gateway/deployment.yaml").read_text())
    pod = deployment["spec"]["template"]["spec"]["securityContext"]
    assert (pod["runAsUser"], pod["runAsGroup"], pod["fsGroup"]) == (uid, gid, gid)


def test_entrypoint_and_cmd_are_the_gateway_cli(runtime: Stage) -> None:
    (entrypoint,) = runtime.one("ENTRYPOINT").exec_form()
    assert PYPROJECT["project"]["scripts"][entrypoint] == "gateway.cli:main"
    cmd = runtime.one("CMD").exec_form()
    args = parse_serve_args(cmd)
    assert args.host == "0.0.0.0"
    exposed = [int(port.split("/")[0]) for port in runtime.one("EXPOSE").value.split()]
    assert exposed == [args.port]
    env = " ".join(instruction.value for instruction in runtime.all("ENV"))
    assert f"GATEWAY_POLICY={POLICY_IN_CONTAINER}" in env, "`serve` without --policy finds it"


class _Health(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status if self.path == "/healthz" else 404)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def run_healthcheck(command: list[str], status: int) -> int:
    """Exit code of the HEALTHCHECK command against a server answering /healthz `status`."""
    handler = type("Health", (_Health,), {"status": status})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = str(server.server_address[1])
        argv = [sys.executable if command[0] == "python" else command[0], *command[1:]]
        done = subprocess.run(
            argv, env={"GATEWAY_PORT": port}, capture_output=True, timeout=30, check=False
        )
        return done.returncode
    finally:
        server.shutdown()
        server.server_close()


def test_the_healthcheck_asks_healthz_without_curl(runtime: Stage) -> None:
    healthcheck = runtime.one("HEALTHCHECK")
    command = healthcheck.exec_form()
    assert command[0] == "python", "the slim image has no curl"
    assert "/healthz" in " ".join(command)
    assert re.search(r"--timeout=\d+s", healthcheck.value)
    assert run_healthcheck(command, 200) == 0
    assert run_healthcheck(command, 503) != 0


def dockerignore_patterns() -> list[str]:
    lines = DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
    patterns = [line.strip().lstrip("/") for line in lines if line.strip()]
    patterns = [p for p in patterns if not p.startswith("#")]
    assert not [p for p in patterns if p.startswith("!")], "exceptions are not checked here"
    return patterns


def ignored(path: str) -> bool:
    """Whether .dockerignore keeps `path` (relative to the context) out of the build."""
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in dockerignore_patterns():
        if pattern.startswith("**/"):
            tail = pattern[3:]
            if any(fnmatch.fnmatch(part, tail) for part in parts):
                return True
        elif any(fnmatch.fnmatch(prefix, pattern) for prefix in prefixes):
            return True
    return False


def test_the_context_keeps_out_local_state_and_keeps_what_the_build_copies(
    stages: list[Stage],
) -> None:
    for unwanted in (".venv", ".venv-engine", ".run", ".git", "tests", "deploy/compose/keys"):
        assert ignored(unwanted), f"{unwanted} would be sent to the Docker daemon"
    copied: list[str] = []
    for stage in stages:
        for copy in stage.all("COPY"):
            words = [w for w in shlex.split(copy.value) if not w.startswith("--")]
            if "--from=" not in copy.value:
                copied += words[:-1]
    assert PYPROJECT["project"]["readme"] in copied, "setuptools reads the readme to build"
    for source in copied:
        assert (ROOT / source).exists(), f"COPY {source}: no such file in the context"
        assert not ignored(source), f"COPY {source} is excluded by .dockerignore"
    for package in PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]:
        assert package.rstrip("*") in copied, f"the wheel needs {package}"
