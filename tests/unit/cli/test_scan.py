"""`snooze scan` as a command (cli/scan.py): entries printed relative to the current directory,
and its exit codes for an empty and a missing folder."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from onnx_models import write_mlp

from snoozeml.cli import exit_codes
from snoozeml.cli.main import main


def test_scan_prints_entries_relative_to_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write_mlp(tmp_path / "models" / "mlp.onnx", dims=(4, 8, 3))
    monkeypatch.chdir(tmp_path)

    assert main(["scan", "models"]) == exit_codes.OK

    [entry] = tomllib.loads(capsys.readouterr().out)["models"]
    assert entry == {"name": "mlp", "path": "models/mlp.onnx", "format": "onnx",
                     "batching": {"max_batch_size": 32}}


def test_scan_exit_codes_for_an_empty_and_a_missing_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "README.md").write_text("no models here")

    assert main(["scan", str(tmp_path / "empty")]) == exit_codes.NOTHING_SERVABLE
    assert "no ONNX or safetensors model found" in capsys.readouterr().err
    assert main(["scan", str(tmp_path / "missing")]) == exit_codes.USAGE
    assert "no such file or folder" in capsys.readouterr().err
