"""Writing scanned models as models.toml entries (hub/config_writer.py): rendered entries are a
valid models.toml, and merging into a user's file keeps its comments, edits, line endings
and taken names, adding only new models."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from hub_layouts import hf_folder
from onnx_models import write_classifier, write_fixed_shape_model, write_mlp

from snoozeml.cli import exit_codes
from snoozeml.cli.main import main
from snoozeml.config.settings import load_config
from snoozeml.errors import ConfigError
from snoozeml.hub import ScannedModel, merge_into, render_toml, scan_directory


def test_rendered_entries_are_a_valid_models_toml(tmp_path: Path) -> None:
    write_mlp(tmp_path / "models" / "mlp.onnx", dims=(4, 8, 3))
    write_fixed_shape_model(tmp_path / "models" / "fixed.onnx")
    hf_folder(tmp_path / "models" / "bert", ["BertForSequenceClassification"])
    (tmp_path / "models" / "plain.safetensors").write_bytes(b"stand-in")

    text = render_toml(scan_directory(tmp_path / "models"), relative_to=tmp_path)
    (tmp_path / "models.toml").write_text(text)
    config = load_config(tmp_path / "models.toml", environ={})

    models = {m.name: m for m in config.models}
    assert sorted(models) == ["bert", "fixed", "mlp", "plain"]
    assert models["mlp"].path == tmp_path / "models" / "mlp.onnx"
    assert models["mlp"].batching.max_batch_size == 32
    assert models["fixed"].batching.max_batch_size == 0
    assert (models["bert"].format, models["bert"].task, models["bert"].tokenize) == (
        "torch", "text-classification", True)
    assert models["plain"].format == "torch"
    assert 'path = "models/mlp.onnx"' in text


USER_CONFIG = """\
# Production models. Ask #ml-infra before changing idle timeouts!
[server]
http_port = 9000   # behind the proxy

[[models]]
name = "my-mlp"                  # renamed by hand
path = "models/mlp.onnx"
idle_timeout = "never"           # pinned: latency-critical
[models.batching]
max_batch_size = 8
"""


def test_scan_write_keeps_comments_and_edits_and_adds_only_new_models(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_mlp(tmp_path / "models" / "mlp.onnx", dims=(4, 8, 3))
    write_classifier(tmp_path / "models" / "classifier.onnx")
    config = tmp_path / "models.toml"
    config.write_text(USER_CONFIG)

    code = main(["scan", str(tmp_path / "models"), "--write", str(config)])

    assert code == exit_codes.OK
    text = config.read_text()
    assert text.startswith(USER_CONFIG)  # every byte the user wrote, in place
    added = tomllib.loads(text[len(USER_CONFIG):])["models"]
    assert [(m["name"], m["path"]) for m in added] == [("classifier", "models/classifier.onnx")]
    assert "added classifier (onnx)" in capsys.readouterr().out
    assert [m.name for m in load_config(config, environ={}).models] == ["my-mlp", "classifier"]

    again = main(["scan", str(tmp_path / "models"), "--write", str(config)])

    assert again == exit_codes.OK
    assert config.read_text() == text
    assert "nothing changed" in capsys.readouterr().out


def test_a_taken_name_is_never_overwritten(tmp_path: Path) -> None:
    write_mlp(tmp_path / "models" / "mlp.onnx", dims=(4, 8, 3))
    other = write_mlp(tmp_path / "elsewhere" / "other.onnx", dims=(4, 8, 3))
    config = tmp_path / "models.toml"
    original = f'[[models]]\nname = "mlp"\npath = "{other.relative_to(tmp_path)}"\n'
    config.write_text(original)

    result = merge_into(config, scan_directory(tmp_path / "models"))

    assert result.added == []
    assert "already has a model named 'mlp'" in result.skipped[0].reason
    assert config.read_text() == original


def test_merge_creates_a_missing_config_with_paths_relative_to_it(tmp_path: Path) -> None:
    write_mlp(tmp_path / "models" / "mlp.onnx", dims=(4, 8, 3))
    config = tmp_path / "deploy" / "models.toml"

    merge_into(config, scan_directory(tmp_path / "models"))

    [entry] = tomllib.loads(config.read_text())["models"]
    assert entry["path"] == "../models/mlp.onnx"
    loaded = load_config(config, environ={}).models[0].path
    assert loaded.resolve() == tmp_path / "models" / "mlp.onnx"


def test_merge_keeps_windows_line_endings(tmp_path: Path) -> None:
    write_mlp(tmp_path / "mlp.onnx", dims=(4, 8, 3))
    config = tmp_path / "models.toml"
    original = b"[server]\r\nhttp_port = 9000\r\n"
    config.write_bytes(original)

    merge_into(config, scan_directory(tmp_path))

    data = config.read_bytes()
    assert data.startswith(original + b"\r\n[[models]]\r\n")
    assert b"\n" not in data.replace(b"\r\n", b"")


def test_an_inline_models_array_is_refused_untouched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_mlp(tmp_path / "models" / "mlp.onnx", dims=(4, 8, 3))
    config = tmp_path / "models.toml"
    original = 'models = [{ name = "a", path = "models/mlp.onnx" }]\n'
    config.write_text(original)

    with pytest.raises(ConfigError):
        merge_into(config, scan_directory(tmp_path / "models"))
    code = main(["scan", str(tmp_path / "models"), "--write", str(config)])

    assert code == exit_codes.USAGE
    assert "[[models]]" in capsys.readouterr().err
    assert config.read_text() == original


def test_render_writes_strings_as_valid_toml(tmp_path: Path) -> None:
    path = write_mlp(tmp_path / 'quote"back\\slash' / "model.onnx", dims=(4, 8, 3))

    text = render_toml(scan_directory(tmp_path), relative_to=tmp_path)

    assert tomllib.loads(text)["models"][0]["path"] == path.relative_to(tmp_path).as_posix()


def test_rendered_notes_are_comments() -> None:
    text = render_toml([ScannedModel(name="m", path=Path("/x/m.onnx"), format="onnx",
                                     notes=("line one", "line two"))],
                       relative_to=Path("/x"), header="pulled from org/m")
    assert text.splitlines()[:4] == [
        "[[models]]", "# pulled from org/m", "# line one", "# line two"]
