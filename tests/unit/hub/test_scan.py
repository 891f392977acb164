"""Finding models on disk (hub/scan.py): ONNX files, Hugging Face folders, loose safetensors and
ONNX text models, each with the entry it needs and a unique name. (Writing the entries:
test_config_writer.py; the command: tests/unit/cli/test_scan.py.)"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import onnx
import pytest
from hub_layouts import hf_folder
from onnx_models import write_corrupt_model, write_fixed_shape_model, write_mlp

from snoozeml.config.settings import load_config
from snoozeml.hub import ScannedModel, render_toml, scan, scan_directory
from snoozeml.runtime.text.settings import text_settings, tokenizer_folder


def by_name(models: list[ScannedModel]) -> dict[str, ScannedModel]:
    return {m.name: m for m in models}


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
