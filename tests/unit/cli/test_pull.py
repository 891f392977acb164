"""`snooze pull` as a command (cli/pull.py): usage errors exit 2."""

from __future__ import annotations

import pytest

from snoozeml.cli import exit_codes
from snoozeml.cli.main import main


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pull", "org/name@v1", "--revision", "v2"]) == exit_codes.USAGE
    assert "two revisions" in capsys.readouterr().err
