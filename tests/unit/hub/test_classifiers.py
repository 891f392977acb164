"""Cross-encoders and other text classifiers found by the scan (hub/classifiers.py through
hub/scan.py): the entries written for a torch folder and for the Hub's ONNX layout take text
pairs once loaded (task and tokenize as the runtime reads them), and say whether they rerank.
(That such an entry really answers: tests/integration/test_scan_rerankers.py.)"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import onnx
import pytest
from hub_layouts import hf_folder

from snoozeml.config.settings import ModelConfig, load_config
from snoozeml.hub import ScannedModel, render_toml, scan_directory
from snoozeml.runtime.text.settings import can_embed, can_score_pairs, label_count, text_task

CROSS_ENCODER = {"architectures": ["BertForSequenceClassification"], "id2label": {"0": "LABEL_0"}}


def write_classifier_graph(path: Path, labels: int = 1, output: str = "logits") -> Path:
    """A graph shaped as a Hugging Face classifier export: token ids in, [batch, labels] out."""
    from onnx import TensorProto, helper, numpy_helper

    initializers = [
        numpy_helper.from_array(np.arange(40, dtype=np.float32).reshape(10, 4), "table"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "axes"),
        numpy_helper.from_array(np.ones((4, labels), dtype=np.float32), "head"),
    ]
    nodes = [helper.make_node("Gather", ["table", "input_ids"], ["hidden"]),
             helper.make_node("ReduceMean", ["hidden", "axes"], ["pooled"], keepdims=0),
             helper.make_node("MatMul", ["pooled", "head"], [output])]
    graph = helper.make_graph(
        nodes, "classifier",
        [helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "sequence"])
         for name in ("input_ids", "attention_mask", "token_type_ids")],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, ["batch", labels])],
        initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def written_spec(model: ScannedModel, tmp_path: Path) -> ModelConfig:
    """The entry the scan writes, through the config loader as the daemon reads it."""
    config = tmp_path / "models.toml"
    config.write_text(render_toml([model], relative_to=tmp_path))
    [spec] = load_config(config, environ={}).models
    return spec


def notes_of(model: ScannedModel) -> str:
    return "\n".join(model.notes)


def test_a_torch_cross_encoder_is_written_as_a_reranker(tmp_path: Path) -> None:
    folder = hf_folder(tmp_path / "ms-marco", CROSS_ENCODER["architectures"])
    (folder / "config.json").write_text(json.dumps(CROSS_ENCODER))

    [model] = scan_directory(tmp_path)

    assert (model.format, model.task, model.tokenize) == ("torch", "text-classification", True)
    assert model.role == "a reranker on /v1/rerank, /v2/rerank and /rerank"
    assert "a reranker on /v1/rerank, /v2/rerank and /rerank: a cross-encoder" in \
        render_toml([model], tmp_path)
    spec = written_spec(model, tmp_path)
    assert (spec.task, spec.tokenize) == ("text-classification", True)
    assert can_score_pairs(spec)
    assert not can_embed(spec)
    assert label_count(spec) == 1


def test_a_cross_encoder_in_the_hub_onnx_layout_is_written_with_its_task(tmp_path: Path) -> None:
    repo = tmp_path / "ms-marco"
    repo.mkdir()
    (repo / "config.json").write_text(json.dumps(CROSS_ENCODER))
    (repo / "tokenizer.json").write_text("{}")
    write_classifier_graph(repo / "onnx" / "model.onnx")

    [model] = scan_directory(repo)

    assert (model.format, model.task, model.tokenize, model.pooling) == (
        "onnx", "text-classification", True, None)
    assert model.role == "a reranker on /v1/rerank, /v2/rerank and /rerank"
    assert "config.json names BertForSequenceClassification" in notes_of(model)
    entry = tomllib.loads(render_toml([model], tmp_path))["models"][0]
    # A model that tokenizes gathers 128 rows a batch, sorted into runs by length.
    assert (entry["task"], entry["tokenize"], entry["batching"]) == (
        "text-classification", True, {"max_batch_size": 128})
    assert "pooling" not in entry
    assert "tokenizer" not in entry
    spec = written_spec(model, tmp_path)
    assert text_task(spec) == "text-classification"
    assert can_score_pairs(spec)
    assert not can_embed(spec)
    assert label_count(spec) == 1


def test_an_onnx_classifier_without_config_json_is_known_by_its_logits(tmp_path: Path) -> None:
    write_classifier_graph(tmp_path / "reranker" / "model.onnx")
    (tmp_path / "reranker" / "tokenizer.json").write_text("{}")
    write_classifier_graph(tmp_path / "nli" / "model.onnx", labels=3)
    (tmp_path / "nli" / "tokenizer.json").write_text("{}")

    models = {m.name: m for m in scan_directory(tmp_path)}

    assert models["reranker"].task == "text-classification"
    assert models["reranker"].role is not None
    assert "the graph outputs logits FP32 [-1, 1]" in notes_of(models["reranker"])
    assert (models["nli"].task, models["nli"].tokenize, models["nli"].role) == (
        "text-classification", True, None)
    assert "a text classifier with 3 labels" in notes_of(models["nli"])
    assert "rerank routes serve only a one-label model" in notes_of(models["nli"])


@pytest.mark.parametrize(("labels", "said"), [
    ({"id2label": {"0": "a", "1": "b", "2": "c"}}, "a text classifier with 3 labels"),
    ({}, "a text classifier with 2 labels"),  # transformers' default
])
def test_a_classifier_of_more_labels_takes_pairs_but_is_no_reranker(
    tmp_path: Path, labels: dict[str, object], said: str
) -> None:
    folder = hf_folder(tmp_path / "nli", ["BertForSequenceClassification"])
    (folder / "config.json").write_text(json.dumps(
        {"architectures": ["BertForSequenceClassification"], **labels}))

    [model] = scan_directory(tmp_path)

    assert (model.task, model.tokenize, model.role) == ("text-classification", True, None)
    assert said in notes_of(model)


def test_a_classifier_without_a_tokenizer_is_said_not_to_rerank(tmp_path: Path) -> None:
    hf_folder(tmp_path / "ids-only", ["BertForSequenceClassification"], tokenizer=False)

    [model] = scan_directory(tmp_path)

    assert (model.task, model.tokenize, model.role) == ("text-classification", False, None)
    assert "does not rerank" in notes_of(model)


def test_an_onnx_classifier_graph_the_daemon_cannot_feed_text_is_left_without_tokenize(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "odd"
    repo.mkdir()
    (repo / "config.json").write_text(json.dumps(CROSS_ENCODER))
    (repo / "tokenizer.json").write_text("{}")
    write_classifier_graph(repo / "onnx" / "model.onnx", output="scores")

    [model] = scan_directory(repo)

    assert (model.task, model.tokenize, model.role) == (None, False, None)
    assert "tokenize is off although tokenizer.json is in the folder above" in notes_of(model)
    assert "needs a graph output 'logits'" in notes_of(model)
