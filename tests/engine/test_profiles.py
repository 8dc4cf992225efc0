"""Engine profiles render the vLLM flags they promise, and reject contradictions."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from engine.profiles import Profile, available_profiles, load_profile


def test_required_profiles_ship() -> None:
    assert {"cpu-tiny", "cpu-tiny-embed", "gpu-llama70b-eagle3", "gpu-qwen32b-draft"} <= set(
        available_profiles()
    )


def test_cpu_tiny_renders_the_measured_working_flags() -> None:
    profile = load_profile("cpu-tiny")
    args = profile.serve_args(port=8001, host="127.0.0.1")
    assert args[args.index("--served-model-name") + 1] == "tiny"
    for flag in (
        "--enable-prefix-caching",
        "--enable-prompt-tokens-details",
        "--enforce-eager",
        "--enable-auto-tool-choice",
    ):
        assert flag in args
    assert args[args.index("--tool-call-parser") + 1] == "hermes"
    assert args[args.index("--block-size") + 1] == "32"  # small blocks: agent turns append
    spec = json.loads(args[args.index("--speculative-config") + 1])
    assert spec == {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_max": 4,
        "prompt_lookup_min": 2,
    }
    structured = json.loads(args[args.index("--structured-outputs-config") + 1])
    assert structured == {"backend": "xgrammar", "disable_any_whitespace": True}
    assert profile.serve_env() == {"VLLM_CPU_KVCACHE_SPACE": "1"}


def test_gpu_profiles_speculate_with_a_second_model() -> None:
    eagle = load_profile("gpu-llama70b-eagle3")
    draft = load_profile("gpu-qwen32b-draft")
    eagle_spec = json.loads(
        eagle.serve_args()[eagle.serve_args().index("--speculative-config") + 1]
    )
    draft_spec = json.loads(
        draft.serve_args()[draft.serve_args().index("--speculative-config") + 1]
    )
    assert eagle_spec["method"] == "eagle3" and "EAGLE3" in eagle_spec["model"]
    assert draft_spec["method"] == "draft_model" and draft_spec["model"].startswith("Qwen/Qwen2.5-")
    for profile in (eagle, draft):
        args = profile.serve_args()
        assert "--gpu-memory-utilization" in args
        assert "--enable-prefix-caching" in args
        assert profile.tensor_parallel_size > 1


def base(**overrides: object) -> dict[str, object]:
    return {
        "name": "x",
        "device": "cpu",
        "pool": "p",
        "model": "m",
        "served_model": "s",
        "max_model_len": 1024,
        **overrides,
    }


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"speculative": {"method": "eagle3", "num_speculative_tokens": 3}}, "needs `model`"),
        (
            {"speculative": {"method": "ngram", "num_speculative_tokens": 3, "model": "x"}},
            "takes no `model`",
        ),
        ({"kv_cache": {"gpu_memory_utilization": 0.9}}, "cpu_space_gib"),
        ({"device": "gpu", "kv_cache": {"cpu_space_gib": 1}}, "gpu_memory_utilization"),
        ({"runner": "pooling", "tool_calling": {"parser": "hermes"}}, "pooling"),
        (
            {"structured_outputs": {"backend": "outlines", "disable_any_whitespace": True}},
            "xgrammar or guidance",
        ),
        ({"flavour": "spicy"}, "Extra inputs are not permitted"),
    ],
)
def test_contradictory_profiles_are_rejected(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Profile.model_validate(base(**overrides))
