"""The policy loader accepts valid files and rejects each kind of mistake with a message
that names the file, the key path, the line and what was expected."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from gateway.cli import main as gateway_main
from gateway.policy import PolicyError, load_policy, parse_policy
from tests.conftest import ROOT

VALID = """\
version: 1
pools:
  chat:
    tier: small
    served_model: tiny
    replicas:
      - url: http://127.0.0.1:8001
models:
  tiny:
    pool: chat
"""


def reject(text: str, tmp_path: Path) -> str:
    path = tmp_path / "policy.yaml"
    path.write_text(textwrap.dedent(text))
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    message = str(caught.value)
    assert str(path) in message
    return message


def test_valid_policy_loads_with_defaults() -> None:
    policy = parse_policy(VALID)
    assert policy.models["tiny"].pool == "chat"
    assert policy.pools["chat"].replicas[0].url == "http://127.0.0.1:8001"
    assert policy.limits.max_body_bytes == 8 * 1024 * 1024


def test_shipped_default_policy_is_valid() -> None:
    policy = load_policy(ROOT / "policies" / "default.yaml")
    assert {"tiny", "tiny-embed"} <= set(policy.models)


@pytest.mark.parametrize("path", sorted((ROOT / "policies").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_policy_is_valid(path: Path) -> None:
    assert load_policy(path).models


def test_unknown_key_is_rejected_with_path_and_line(tmp_path: Path) -> None:
    message = reject(
        VALID.replace("    tier: small\n", "    tier: small\n    replicaz: 3\n"), tmp_path
    )
    assert "pools.chat.replicaz" in message
    assert "unknown key" in message
    assert "policy.yaml:5:" in message


def test_wrong_type_is_rejected(tmp_path: Path) -> None:
    message = reject(VALID + "limits:\n  max_body_bytes: lots\n", tmp_path)
    assert "limits.max_body_bytes" in message
    assert "integer" in message
    assert "'lots'" in message


def test_out_of_range_value_is_rejected(tmp_path: Path) -> None:
    message = reject(VALID + "timeouts:\n  connect_s: -1\n", tmp_path)
    assert "timeouts.connect_s" in message
    assert "greater than 0" in message


def test_reference_to_undefined_pool_is_rejected(tmp_path: Path) -> None:
    message = reject(VALID.replace("    pool: chat", "    pool: chatt"), tmp_path)
    assert "models.tiny.pool" in message
    assert "'chatt' is not defined" in message
    assert "expected one of: chat" in message


def test_missing_required_key_is_rejected(tmp_path: Path) -> None:
    message = reject(VALID.replace("    served_model: tiny\n", ""), tmp_path)
    assert "pools.chat.served_model: required key is missing" in message


def test_bad_replica_url_is_rejected(tmp_path: Path) -> None:
    message = reject(VALID.replace("http://127.0.0.1:8001", "ftp://x"), tmp_path)
    assert "pools.chat.replicas[0].url" in message
    assert "http(s) base URL" in message


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("redis://:hunter2@cache:port", "not a URL: its port is not a number"),
        ("postgres://:hunter2@cache:6379", "must start with redis://, rediss:// or unix://"),
    ],
)
def test_a_bad_redis_url_is_rejected_without_its_password(
    tmp_path: Path, url: str, problem: str
) -> None:
    """Refused with its line rather than by redis-py at start-up; a problem is printed and
    may be logged, so the URL it quotes keeps no password."""
    message = reject(VALID + f"state: {{redis_url: '{url}'}}\n", tmp_path)
    assert f"policy.yaml:11: state.redis_url: {problem}" in message
    assert "hunter2" not in message and ":[REDACTED]@cache" in message


def test_redis_urls_redis_py_takes_are_accepted() -> None:
    for url in ("", "redis://r:6379/0", "rediss://u:p@r:6380", "unix:///run/redis.sock"):
        assert parse_policy(VALID + f"state: {{redis_url: '{url}'}}\n").state.redis_url == url


def test_unknown_endpoint_is_rejected(tmp_path: Path) -> None:
    message = reject(
        VALID.replace("    tier: small\n", "    tier: small\n    serves: [chat, audio]\n"), tmp_path
    )
    assert "pools.chat.serves[1]" in message
    assert "'chat', 'completions' or 'embeddings'" in message


def test_pool_without_any_replica_source_is_rejected(tmp_path: Path) -> None:
    text = VALID.replace("    replicas:\n      - url: http://127.0.0.1:8001\n", "")
    message = reject(text, tmp_path)
    assert "pools.chat: a pool needs `replicas`, `engine_state`, `discover`, or a mix" in message


def test_empty_models_are_rejected(tmp_path: Path) -> None:
    message = reject(VALID.split("models:")[0] + "models: {}\n", tmp_path)
    assert "models" in message
    assert "at least 1 item" in message


def test_unsupported_version_is_rejected(tmp_path: Path) -> None:
    message = reject(VALID.replace("version: 1", "version: 2"), tmp_path)
    assert "version" in message
    assert "policy.yaml:1:" in message


def test_invalid_yaml_is_rejected_with_line(tmp_path: Path) -> None:
    message = reject("pools:\n  chat: [unclosed\n", tmp_path)
    assert "not valid YAML" in message


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    assert "expected a mapping" in reject("- just\n- a list\n", tmp_path)


def test_empty_serves_is_rejected(tmp_path: Path) -> None:
    message = reject(
        VALID.replace("    tier: small\n", "    tier: small\n    serves: []\n"), tmp_path
    )
    assert "pools.chat.serves" in message
    assert "at least 1 item" in message


def test_bad_reference_is_reported_with_other_errors(tmp_path: Path) -> None:
    text = VALID.replace("pool: chat", "pool: nope") + "limits:\n  max_body_bytes: x\n"
    message = reject(text, tmp_path)
    assert "models.tiny.pool: pool 'nope' is not defined" in message
    assert "limits.max_body_bytes" in message
    assert message.index("models.tiny.pool") < message.index("limits.max_body_bytes")  # file order


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    text = (
        VALID.replace("    tier: small\n", "    tier: small\n    bogus: 1\n")
        + "limits:\n  max_body_bytes: x\n"
    )
    message = reject(text, tmp_path)
    assert "pools.chat.bogus" in message
    assert "limits.max_body_bytes" in message


def test_environment_variables_are_expanded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_ENGINE_URL", "http://10.0.0.5:9000")
    text = (
        VALID.replace("http://127.0.0.1:8001", "${TEST_ENGINE_URL}")
        + "state:\n  redis_url: ${NO_SUCH_VAR_X:-redis://h:1}\n"
    )
    policy = parse_policy(text)
    assert policy.pools["chat"].replicas[0].url == "http://10.0.0.5:9000"
    assert policy.state.redis_url == "redis://h:1"


def test_missing_environment_variable_is_rejected(tmp_path: Path) -> None:
    message = reject(VALID.replace("http://127.0.0.1:8001", "${NO_SUCH_VAR_Y}"), tmp_path)
    assert "pools.chat.replicas[0].url: environment variable NO_SUCH_VAR_Y is not set" in message


def test_relative_paths_are_relative_to_the_policy_file(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    text = VALID.replace("    tier: small\n", "    tier: small\n    engine_state: run/state.json\n")
    path.write_text(text + "state: {embedded_dir: data}\ntelemetry: {request_log: logs/r.jsonl}\n")
    policy = load_policy(path)
    assert policy.pools["chat"].engine_state == str(tmp_path / "run" / "state.json")
    assert policy.state.embedded_dir == str(tmp_path / "data")
    assert policy.telemetry.request_log == str(tmp_path / "logs" / "r.jsonl")


def test_unreadable_file_is_reported(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read the file"):
        load_policy(tmp_path / "missing.yaml")


def test_policy_check_command_exit_codes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(VALID)
    bad = tmp_path / "bad.yaml"
    bad.write_text(VALID.replace("pool: chat", "pool: nope"))
    assert gateway_main(["policy", "check", str(good)]) == 0
    assert "ok (1 models, 1 pools)" in capsys.readouterr().out
    assert gateway_main(["policy", "check", str(good), str(bad)]) == 1
    assert "models.tiny.pool" in capsys.readouterr().err


TIERED = (
    VALID
    + """\
  auto:
    tiering: default
tiering:
  default:
    tiers: {small: chat, large: chat}
    rules:
      - {name: cheap, when: {task: [classify]}, then: small}
"""
)


def test_a_tiered_policy_loads() -> None:
    policy = parse_policy(TIERED)
    spec = policy.tiering["default"]
    assert (spec.lowest, spec.highest) == ("small", "large")
    assert policy.models["auto"].pool is None


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            ("tiering: default", "tiering: nope"),
            "models.auto.tiering: tiering 'nope' is not defined",
        ),
        (
            ("{small: chat,", "{small: chatt,"),
            "tiering.default.tiers.small: pool 'chatt' is not defined",
        ),
        (("then: small", "then: medium"), "rule 'cheap' sends to unknown tier 'medium'"),
        (("when: {task: [classify]}", "when: {}"), "a rule needs at least one matcher"),
        (("when: {task: [classify]}", "when: {last_user_matches: '('}"), "not a valid regex"),
        (
            ("    tiering: default\n", "    tiering: default\n    pool: chat\n"),
            "give exactly one of `pool`",
        ),
        (("rules:", "guardrails: {regex: '['}\n    rules:"), "regex is not valid"),
        (("rules:", "learned: {threshold: 1.5}\n    rules:"), "less than or equal to 1"),
    ],
)
def test_tiering_mistakes_are_rejected(
    tmp_path: Path, change: tuple[str, str], expected: str
) -> None:
    assert change[0] in TIERED
    assert expected in reject(TIERED.replace(*change), tmp_path)
