"""`gateway` itself: what it prints before any subcommand runs."""

from __future__ import annotations

from importlib.metadata import version

import pytest

from gateway.cli import main


def test_version_prints_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"gateway {version('agent-gateway')}"


def test_no_subcommand_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main([])
    assert exited.value.code == 2
    assert "usage: gateway" in capsys.readouterr().err
