"""The vLLM arguments of the Kubernetes engine pools (deploy/k8s/engines, rendered by
`engine manifests`) pass vLLM's own argument parser and pre-start checks, in the real
engine environment, the way `engine validate` checks the profiles."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml

from engine.manifests import DEFAULT_OUT, render_files
from engine.profiles import load_profile
from engine.supervisor import ROOT, Paths

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def engine_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    python = Paths.under(tmp_path_factory.mktemp("engine-run")).python
    if not python.exists():
        pytest.fail(f"no engine environment at {python}: run `make engine-env` (make test does)")
    return str(python)


def committed_args(pool: str) -> list[str]:
    text = (DEFAULT_OUT / f"{pool}.yaml").read_text(encoding="utf-8")
    (stateful_set,) = [d for d in yaml.safe_load_all(text) if d["kind"] == "StatefulSet"]
    args: list[str] = stateful_set["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def vllm_parser_verdict(argv: list[str], engine_python: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [engine_python, "-m", "engine.validate_args"], input=json.dumps(argv), cwd=ROOT,
        env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("pool", ["large", "small"])
def test_committed_pool_arguments_pass_vllms_own_parser(pool: str, engine_python: str) -> None:
    result = vllm_parser_verdict(committed_args(pool), engine_python)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().splitlines()[-1] == "ok"


def test_the_draft_model_pool_rendered_on_request_passes_too(engine_python: str) -> None:
    text = render_files([load_profile("gpu-qwen32b-draft")])["large-qwen.yaml"]
    (stateful_set,) = [d for d in yaml.safe_load_all(text) if d["kind"] == "StatefulSet"]
    args = stateful_set["spec"]["template"]["spec"]["containers"][0]["args"]
    result = vllm_parser_verdict(args, engine_python)
    assert result.returncode == 0, result.stdout + result.stderr
