"""Engine pieces checked inside the real engine environment: vLLM's own argument parser
on every profile (GPU ones included, without a GPU), the offline tiny model build, and the
`engine` command's up / status / down cycle on a real replica."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.profiles import available_profiles, load_profile
from engine.supervisor import ROOT, Paths, validate_args

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> Paths:
    found = Paths.under(tmp_path_factory.mktemp("engine-run"))
    if not found.python.exists():
        pytest.fail(
            f"no engine environment at {found.python}: run `make engine-env` (make test does)"
        )
    return found


@pytest.mark.parametrize("name", available_profiles())
def test_profile_arguments_pass_vllms_own_parser(name: str, paths: Paths) -> None:
    ok, message = validate_args(load_profile(name), paths)
    assert ok, message


@pytest.mark.parametrize(
    ("argv", "complaint"),
    [
        (
            [
                "--model",
                "m",
                "--speculative-config",
                '{"method": "eagle9", "num_speculative_tokens": 2}',
            ],
            "eagle9",
        ),
        (["--model", "m", "--enable-auto-tool-choice"], "requires --tool-call-parser"),
        (["--model", "m", "--no-such-flag"], "unrecognized arguments"),
    ],
)
def test_vllms_parser_catches_bad_arguments(argv: list[str], complaint: str, paths: Paths) -> None:
    result = subprocess.run(
        [str(paths.python), "-m", "engine.validate_args"], input=json.dumps(argv),
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 1
    assert complaint in result.stdout + result.stderr


def engine_cli(*args: str, run_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ENGINE_RUN_DIR": str(run_dir)}
    env.pop("ENGINE_STATE", None)
    return subprocess.run(
        [sys.executable, "-m", "engine", *args], cwd=ROOT, env=env,
        capture_output=True, text=True, check=False, timeout=900,
    )  # fmt: skip


def test_tiny_model_build_is_offline_and_deterministic(tmp_path: Path) -> None:
    first = engine_cli("build-tiny-model", str(tmp_path / "a"), run_dir=tmp_path)
    second = engine_cli("build-tiny-model", str(tmp_path / "b"), run_dir=tmp_path)
    other = engine_cli("build-tiny-model", str(tmp_path / "c"), "--seed", "1", run_dir=tmp_path)
    assert first.returncode == second.returncode == other.returncode == 0, first.stderr
    digest = [json.loads((tmp_path / d / "BUILD.json").read_text())["digest"] for d in "abc"]
    assert digest[0] == digest[1]
    assert digest[2] != digest[0]
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_key_value_heads"]) == (
        128,
        2,
        2,
    )


def test_tiny_model_template_renders_tools_calls_and_results(paths: Paths) -> None:
    model = ROOT / ".run" / "models" / "tiny"
    if not (model / "config.json").exists():
        assert engine_cli("build-tiny-model", str(model), run_dir=model.parent).returncode == 0
    script = """
import json, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1])
tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in ("b_tool", "a_tool")]
messages = [
    {"role": "system", "content": "SYS"},
    {"role": "user", "content": "go"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "a_tool", "arguments": {"x": 1}}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "RESULT"},
]
print(tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True))
"""
    result = subprocess.run(
        [str(paths.python), "-c", script, str(model)], capture_output=True, text=True, check=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    prompt = result.stdout
    assert prompt.startswith("<|im_start|>system\nSYS\n\n# Tools")
    assert prompt.index('"b_tool"') < prompt.index('"a_tool"')  # tool order reaches the prompt
    assert '<tool_call>\n{"name": "a_tool", "arguments": {"x": 1}}\n</tool_call>' in prompt
    assert "<tool_response>\nRESULT\n</tool_response>" in prompt
    assert prompt.rstrip().endswith("<|im_start|>assistant")


def test_engine_up_status_down_cycle(tmp_path: Path) -> None:
    up = engine_cli("up", "--profile", "cpu-tiny-embed", "--replicas", "1", run_dir=tmp_path)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "1 replica(s) of cpu-tiny-embed healthy" in up.stdout
    state = json.loads((tmp_path / "engine-state.json").read_text())
    (replica,) = state["replicas"]
    assert replica["pool"] == "tiny-embed" and replica["served_model"] == "tiny-embed"

    status = engine_cli("status", run_dir=tmp_path)
    assert status.returncode == 0
    assert replica["url"] in status.stdout and "healthy" in status.stdout

    down = engine_cli("down", run_dir=tmp_path)
    assert down.returncode == 0
    assert "1 replica(s) stopped" in down.stdout
    with pytest.raises(ProcessLookupError):
        os.kill(replica["pid"], 0)
    assert "no replicas running" in engine_cli("status", run_dir=tmp_path).stdout
