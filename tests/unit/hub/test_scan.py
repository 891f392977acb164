"""`snooze scan` and the pieces of `snooze pull` that need no Hub: finding models on disk,
writing their entries, merging into a user's models.toml, and choosing a repository's files."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx_models import write_classifier, write_corrupt_model, write_fixed_shape_model, write_mlp

from snoozeml.cli import exit_codes
from snoozeml.cli.main import main
from snoozeml.config.settings import load_config
from snoozeml.errors import ConfigError
from snoozeml.hub import (
    InvalidReference,
    ScannedModel,
    merge_into,
    parse_reference,
    render_toml,
    scan,
    scan_directory,
    select_files,
)
from snoozeml.runtime.text.settings import text_settings, tokenizer_folder


def by_name(models: list[ScannedModel]) -> dict[str, ScannedModel]:
    return {m.name: m for m in models}


def hf_folder(folder: Path, architectures: list[str], *, tokenizer: bool = True,
              weights: tuple[str, ...] = ("model.safetensors",)) -> Path:
    """A Hugging Face layout; the scan reads only names and JSON, so weights are stand-ins."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"architectures": architectures}))
    for name in weights:
        (folder / name).write_bytes(b"stand-in: the scan never reads weights")
    if tokenizer:
        (folder / "tokenizer.json").write_text("{}")
    return folder


# --- ONNX ------------------------------------------------------------------------------


def test_onnx_model_with_a_dynamic_first_dimension_gets_batching(tmp_path: Path) -> None:
    write_mlp(tmp_path / "mlp.onnx", dims=(4, 8, 3))

    [model] = scan_directory(tmp_path)

    assert (model.name, model.format, model.path) == ("mlp", "onnx", tmp_path / "mlp.onnx")
    assert [(t.name, t.datatype, t.shape) for t in model.inputs] == [("x", "FP32", (-1, 4))]
    assert [(t.name, t.datatype, t.shape) for t in model.outputs] == [("y", "FP32", (-1, 3))]
    assert model.max_batch_size == 32


def test_onnx_model_with_a_fixed_first_dimension_gets_batching_off(tmp_path: Path) -> None:
    write_fixed_shape_model(tmp_path / "fixed.onnx")

    [model] = scan_directory(tmp_path)

    assert model.max_batch_size == 0
    assert model.batching_note is not None
    assert "'x'" in model.batching_note
    assert "fixed to 2" in model.batching_note


@pytest.mark.parametrize("location", ["model.onnx_data", "weights.onnx"])
def test_external_data_files_are_not_models(tmp_path: Path, location: str) -> None:
    source = onnx.load(str(write_mlp(tmp_path / "src" / "mlp.onnx", dims=(4, 8, 3))))
    target = tmp_path / "models" / "model.onnx"
    target.parent.mkdir()
    onnx.save_model(source, str(target), save_as_external_data=True,
                    all_tensors_to_one_file=True, location=location, size_threshold=0)
    assert (target.parent / location).stat().st_size > 0

    [model] = scan_directory(tmp_path / "models")

    assert model.path == target
    assert [t.name for t in model.inputs] == ["x"]


def test_an_unreadable_onnx_file_is_skipped_with_its_reason(tmp_path: Path) -> None:
    write_corrupt_model(tmp_path / "broken.onnx")
    write_mlp(tmp_path / "good.onnx", dims=(4, 8, 3))

    result = scan(tmp_path)

    assert [m.name for m in result.models] == ["good"]
    [skipped] = result.skipped
    assert skipped.path == tmp_path / "broken.onnx"
    assert "not a readable ONNX model" in skipped.reason


def test_hidden_folders_are_not_scanned(tmp_path: Path) -> None:
    write_mlp(tmp_path / ".cache" / "huggingface" / "stray.onnx", dims=(4, 8, 3))
    write_mlp(tmp_path / "seen.onnx", dims=(4, 8, 3))

    assert [m.name for m in scan_directory(tmp_path)] == ["seen"]


# --- safetensors -----------------------------------------------------------------------


def test_a_hugging_face_folder_is_one_torch_model(tmp_path: Path) -> None:
    folder = hf_folder(tmp_path / "minilm", ["BertModel"])
    # sentence-transformers keeps a Dense layer as config.json + model.safetensors: part of
    # the model, not a model of its own.
    hf_folder(folder / "2_Dense", [], tokenizer=False)
    write_mlp(folder / "onnx" / "model.onnx", dims=(4, 8, 3))

    models = by_name(scan_directory(tmp_path))

    assert sorted(models) == ["minilm", "minilm-onnx"]
    torch_model = models["minilm"]
    assert (torch_model.format, torch_model.path) == ("torch", folder)
    assert torch_model.task == "feature-extraction"
    assert torch_model.tokenize is True
    assert models["minilm-onnx"].format == "onnx"


@pytest.mark.parametrize(("architectures", "task"), [
    (["BertModel"], "feature-extraction"),
    (["XLMRobertaModel"], "feature-extraction"),
    (["DistilBertForSequenceClassification"], "text-classification"),
    (["ViTForImageClassification"], "image-classification"),
    (["GPT2LMHeadModel"], None),
    (["BertForMaskedLM"], None),
    ([], None),
])
def test_the_task_comes_from_the_config_architectures(
    tmp_path: Path, architectures: list[str], task: str | None
) -> None:
    hf_folder(tmp_path / "m", architectures)

    [model] = scan_directory(tmp_path)

    assert model.task == task
    if task is None:
        assert any("set task by hand" in note for note in model.notes)


def test_a_sharded_checkpoint_is_one_model(tmp_path: Path) -> None:
    hf_folder(tmp_path / "big", ["BertModel"], tokenizer=False, weights=(
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
        "model.safetensors.index.json"))

    [model] = scan_directory(tmp_path)

    assert (model.name, model.format, model.tokenize) == ("big", "torch", False)


def test_a_loose_safetensors_file_asks_for_its_module_and_tensors(tmp_path: Path) -> None:
    (tmp_path / "regressor.safetensors").write_bytes(b"stand-in")

    [model] = scan_directory(tmp_path)

    assert (model.name, model.format, model.task) == ("regressor", "torch", None)
    notes = "\n".join(model.notes)
    for key in ("module", "inputs", "outputs"):
        assert key in notes


def test_sentence_transformers_settings_become_pooling_and_normalize(tmp_path: Path) -> None:
    folder = hf_folder(tmp_path / "st", ["BertModel"])
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize",
         "type": "sentence_transformers.models.Normalize"},
    ]))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 256}))

    [model] = scan_directory(tmp_path)

    assert (model.pooling, model.normalize, model.max_length) == ("cls", True, 256)


# --- names -----------------------------------------------------------------------------


def test_names_follow_the_config_rule_and_are_unique(tmp_path: Path) -> None:
    write_mlp(tmp_path / "my model (v2)!.onnx", dims=(4, 8, 3))
    write_mlp(tmp_path / "a" / "model.onnx", dims=(4, 8, 3))
    write_mlp(tmp_path / "a.onnx", dims=(4, 8, 3))
    write_mlp(tmp_path / "_hidden-ish.onnx", dims=(4, 8, 3))

    names = [m.name for m in scan_directory(tmp_path)]

    assert sorted(names) == ["a", "a-2", "hidden-ish", "my-model-v2"]


def test_a_model_at_the_top_is_named_after_the_folder(tmp_path: Path) -> None:
    write_mlp(tmp_path / "classifier-v1" / "model.onnx", dims=(4, 8, 3))

    assert [m.name for m in scan_directory(tmp_path / "classifier-v1")] == ["classifier-v1"]


def test_a_single_file_is_named_after_itself_unless_it_is_called_model(tmp_path: Path) -> None:
    write_mlp(tmp_path / "bert" / "classifier.onnx", dims=(4, 8, 3))
    write_mlp(tmp_path / "bert" / "model.onnx", dims=(4, 8, 3))

    assert [m.name for m in scan_directory(tmp_path / "bert" / "classifier.onnx")] == [
        "classifier"]
    assert [m.name for m in scan_directory(tmp_path / "bert" / "model.onnx")] == ["bert"]


def test_a_base_name_prefixes_every_model(tmp_path: Path) -> None:
    folder = hf_folder(tmp_path / "org--repo", ["BertModel"])
    write_mlp(folder / "onnx" / "model.onnx", dims=(4, 8, 3))

    assert [m.name for m in scan(folder, base_name="repo").models] == ["repo", "repo-onnx"]


# --- rendering and merging --------------------------------------------------------------


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


# --- choosing a repository's files ------------------------------------------------------

BERT_WITH_EXPORTS = [
    ".gitattributes", "README.md", "config.json", "model.safetensors", "pytorch_model.bin",
    "tokenizer.json", "tokenizer_config.json", "vocab.txt", "1_Pooling/config.json",
    "onnx/model.onnx", "onnx/model_quantized.onnx", "onnx/model_fp16.onnx",
    "openvino/openvino_model.xml", "openvino/openvino_model.bin",
]
SUPPORT = ["1_Pooling/config.json", "config.json", "tokenizer.json", "tokenizer_config.json",
           "vocab.txt"]


@pytest.mark.parametrize(("files", "kwargs", "expected"), [
    pytest.param(BERT_WITH_EXPORTS, {}, sorted([*SUPPORT, "model.safetensors"]),
                 id="safetensors by default, no exports or .bin"),
    pytest.param(BERT_WITH_EXPORTS, {"prefer": "onnx"}, sorted([*SUPPORT, "onnx/model.onnx"]),
                 id="--format onnx takes onnx/model.onnx"),
    pytest.param(BERT_WITH_EXPORTS, {"prefer": "onnx",
                                     "include": ["onnx/model_quantized.onnx"],
                                     "exclude": ["onnx/model.onnx"]},
                 sorted([*SUPPORT, "onnx/model_quantized.onnx"]),
                 id="--include adds, --exclude removes"),
    pytest.param(["model.onnx", "model.onnx_data", "README.md", "train.bin"], {},
                 ["model.onnx", "model.onnx_data"], id="top-level onnx with its external data"),
    pytest.param(["onnx/model_q4.onnx", "onnx/model_fp16.onnx", "config.json"], {},
                 ["config.json", "onnx/model_fp16.onnx", "onnx/model_q4.onnx"],
                 id="only onnx/ variants and no model.onnx: all of them"),
    pytest.param(["config.json", "model.safetensors", "onnx/model.onnx"], {"prefer": "torch"},
                 ["config.json", "model.safetensors"], id="--format torch"),
    pytest.param(["README.md", ".gitattributes"], {}, [], id="nothing servable"),
    pytest.param(["config.json", "model.safetensors"], {"exclude": ["*.safetensors"]},
                 ["config.json"], id="exclude applies last"),
    pytest.param(["m.onnx", "extra/notes.txt"], {"include": ["extra/"]},
                 ["extra/notes.txt", "m.onnx"], id="a folder pattern means its files"),
])
def test_select_files(files: list[str], kwargs: dict[str, object], expected: list[str]) -> None:
    assert select_files(files, **kwargs) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(("text", "revision", "expected"), [
    ("org/name", None, ("org/name", None)),
    ("org/name@v1.0", None, ("org/name", "v1.0")),
    ("org/name", "dev", ("org/name", "dev")),
    ("org/name@dev", "dev", ("org/name", "dev")),
    ("gpt2", None, ("gpt2", None)),
])
def test_parse_reference(text: str, revision: str | None,
                         expected: tuple[str, str | None]) -> None:
    assert parse_reference(text, revision) == expected


@pytest.mark.parametrize(("text", "revision"), [
    ("org/name@v1", "v2"), ("org/name@", None), ("a/b/c", None), ("org/na--me", None),
    ("org/name", ""), ("org/name", "  "),
])
def test_parse_reference_refuses(text: str, revision: str | None) -> None:
    with pytest.raises(InvalidReference):
        parse_reference(text, revision)


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pull", "org/name@v1", "--revision", "v2"]) == exit_codes.USAGE
    assert "two revisions" in capsys.readouterr().err


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


# --- ONNX text models -------------------------------------------------------------------


def write_encoder(path: Path, outputs: tuple[str, ...] = ("last_hidden_state",)) -> Path:
    """An encoder-shaped graph (token ids in; hidden states [batch, sequence, 4] and/or a
    pooled sentence_embedding [batch, 4] out): what a Hugging Face ONNX export declares."""
    from onnx import TensorProto, helper, numpy_helper

    table = numpy_helper.from_array(
        np.arange(40, dtype=np.float32).reshape(10, 4), "table")
    axes = numpy_helper.from_array(np.array([1], dtype=np.int64), "axes")
    nodes = [helper.make_node("Gather", ["table", "input_ids"], ["hidden"]),
             helper.make_node("Identity", ["hidden"], ["last_hidden_state"]),
             helper.make_node("ReduceMean", ["hidden", "axes"], ["sentence_embedding"],
                              keepdims=0)]
    shapes = {"last_hidden_state": ["batch", "sequence", 4], "sentence_embedding": ["batch", 4]}
    graph = helper.make_graph(
        nodes, "encoder",
        [helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "sequence"])
         for name in ("input_ids", "attention_mask", "token_type_ids")],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, shapes[name])
         for name in outputs],
        [table, axes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def sentence_transformers_files(folder: Path, mode: str = "pooling_mode_mean_tokens") -> None:
    """tokenizer.json and the sentence-transformers files of a normalised model."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text("{}")
    (folder / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize",
         "type": "sentence_transformers.models.Normalize"},
    ]))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({mode: True}))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 256}))


def test_onnx_model_of_the_hub_layout_takes_text_with_the_tokenizer_in_the_folder_above(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "minilm"
    sentence_transformers_files(repo, "pooling_mode_cls_token")
    write_encoder(repo / "onnx" / "model.onnx")

    [model] = scan_directory(repo)

    assert (model.format, model.tokenize) == ("onnx", True)
    assert (model.pooling, model.normalize, model.max_length) == ("cls", True, 256)
    assert any("tokenizer.json is in the folder above" in note for note in model.notes)
    # The written entry needs no `tokenizer` key: the runtime looks in the same place.
    text = render_toml([model], relative_to=tmp_path)
    assert "tokenizer" not in tomllib.loads(text)["models"][0]
    (tmp_path / "models.toml").write_text(text)
    [spec] = load_config(tmp_path / "models.toml", environ={}).models
    assert (spec.tokenize, spec.pooling, spec.normalize, spec.max_length) == (
        True, "cls", True, 256)
    assert tokenizer_folder(spec) == repo
    assert text_settings(spec).pooling == "cls"


def test_onnx_model_with_a_tokenizer_beside_it_takes_text_with_the_default_pooling(
    tmp_path: Path,
) -> None:
    write_encoder(tmp_path / "encoder" / "model.onnx")
    (tmp_path / "encoder" / "tokenizer.json").write_text("{}")

    [model] = scan_directory(tmp_path)

    assert model.tokenize is True
    assert (model.pooling, model.normalize, model.max_length) == (None, None, None)
    assert any("tokenizer.json is beside it" in note for note in model.notes)


def test_onnx_model_that_pools_itself_gets_model_pooling(tmp_path: Path) -> None:
    sentence_transformers_files(tmp_path / "st")
    write_encoder(tmp_path / "st" / "onnx" / "model.onnx", outputs=("sentence_embedding",))

    [model] = scan_directory(tmp_path / "st")

    assert (model.tokenize, model.pooling, model.normalize) == (True, "model", True)
    assert any("sentence_embedding is the embedding" in note for note in model.notes)


def test_onnx_model_without_token_inputs_does_not_tokenize_despite_a_tokenizer(
    tmp_path: Path,
) -> None:
    write_mlp(tmp_path / "mlp" / "model.onnx", dims=(4, 8, 3))
    (tmp_path / "mlp" / "tokenizer.json").write_text("{}")
    write_encoder(tmp_path / "bare" / "model.onnx")

    models = by_name(scan_directory(tmp_path))

    assert models["mlp"].tokenize is False
    assert models["mlp"].pooling is None
    assert any("tokenize is off although tokenizer.json is beside it" in note
               and "'input_ids'" in note for note in models["mlp"].notes)
    assert models["bare"].tokenize is False
    assert "tokenize" not in tomllib.loads(render_toml([models["bare"]], tmp_path))["models"][0]
