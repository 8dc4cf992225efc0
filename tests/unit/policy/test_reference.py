"""docs/reference/policy.md is generated from the policy schema; it must not drift, and it
must say what the schema says (gateway/policy/reference.py)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from gateway.policy.base import Name, Strict
from gateway.policy.reference import NO_DESCRIPTION, REGENERATE, main, render, undescribed
from gateway.policy.schema import Policy
from tests.conftest import ROOT


def test_the_committed_reference_matches_the_schema() -> None:
    committed = (ROOT / "docs" / "reference" / "policy.md").read_text(encoding="utf-8")
    assert committed == render(), f"the policy changed: run `{REGENERATE}` and commit the page"


def test_every_field_of_every_policy_model_has_a_row() -> None:
    page = render()
    schema = Policy.model_json_schema()
    for key in schema["properties"]:
        anchor = key.replace("_", "-")  # as the page's anchors are written: `tool_calls`
        assert f"## `{key}` {{#{anchor}}}" in page, key  # one section per top-level key
    for definition in schema["$defs"].values():
        for key, prop in definition.get("properties", {}).items():
            assert f".{key}` |" in page, key
            if prop.get("description"):
                assert " ".join(prop["description"].split())[:40] in page.replace("\\*", "*")


def test_restart_only_fields_and_sections_are_marked() -> None:
    page = render()
    port_row = next(line for line in page.splitlines() if line.startswith("| `server.port` |"))
    assert "*Restart-only:*" in port_row
    interval_row = next(
        line for line in page.splitlines() if line.startswith("| `server.reload_interval_s` |")
    )
    assert "Restart-only" not in interval_row
    assert "*Restart-only*, the whole section: the state store's connection" in page


class _Weights(Strict):
    """How much each thing counts."""

    prefix: float = Field(1.0, ge=0, description="Per block to prefill.")
    queue: float = 0.25


class _Pool(Strict):
    served_model: Name = Field(description="What the engines serve.")
    tags: tuple[str, ...] = ()


class _Toy(Strict):
    weights: _Weights = _Weights()
    pools: dict[Name, _Pool] = Field(default_factory=dict, description="Pools | by name.")
    spare: _Weights | None = None


def test_a_model_renders_one_section_per_key_and_one_table_per_model() -> None:
    page = render(_Toy)
    assert "## `weights` {#weights}" in page
    assert "How much each thing counts." in page
    assert "| `weights.prefix` | number (≥ 0) | `1.0` | Per block to prefill. |" in page
    assert "### `pools.<name>` {#pools-name}" in page
    assert "| `pools.<name>.served_model` | name | required | What the engines serve. |" in page
    # A default_factory default is read from the model; a pipe in a description is escaped.
    assert "| `pools` | map of name to object: [`pools.<name>`](#pools-name) | `{}` |" in page
    assert "Pools \\| by name." in page
    # A model used twice has one table; the second use links to it.
    assert page.count("| `spare.prefix` |") == 0
    assert "| `spare` | object: [`weights`](#weights) or `null` | `null` |" in page


def test_a_field_without_a_description_says_so() -> None:
    page = render(_Toy)
    assert f"| `weights.queue` | number | `0.25` | {NO_DESCRIPTION} |" in page
    assert undescribed(_Toy) == ["weights.queue", "pools.<name>.tags", "spare"]


def test_the_output_is_the_same_every_time() -> None:
    assert render() == render()


def test_main_writes_the_page(tmp_path: Path) -> None:
    out = tmp_path / "policy.md"
    assert main(["--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == render()
