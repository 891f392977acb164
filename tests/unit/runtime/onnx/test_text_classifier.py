"""ONNX text classifiers on real onnxruntime: a tiny graph whose two logits are token
statistics (the sum of a row's token ids, and how many of its tokens are the second text's),
beside MiniLM's tokenizer, so every answer is checked against the tokenizers library's own
encoding. Which ONNX text models classify, their metadata, pairs and single texts and token
ids, a batch split back into its requests, and the loads that fail."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx_models import IR_VERSION, OPSET
from tokenizers import Tokenizer
from torch_models import MINILM

from snoozeml.config.settings import ModelConfig
from snoozeml.runtime.base import Arrays, Instance
from snoozeml.runtime.onnx.backend import OnnxBackend
from snoozeml.runtime.onnx.text_classifier import OnnxTextClassifier

MAX_LENGTH = 16
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
CLASSIFIER = {"architectures": ["BertForSequenceClassification"], "id2label": {"0": "A", "1": "B"},
              "max_position_embeddings": 512, "vocab_size": 30522, "type_vocab_size": 2}


def _write_statistics(path: Path, poisoned: bool = False) -> Path:
    """logits [rows, 2]: each row's sum of token ids and its count of type-1 tokens (masked);
    `poisoned`: times NaN."""
    nodes = []
    for name, column in (("input_ids", "ids_sum"), ("token_type_ids", "types_sum")):
        nodes += [helper.make_node("Mul", [name, "attention_mask"], [f"{name}_kept"]),
                  helper.make_node("Cast", [f"{name}_kept"], [f"{name}_float"],
                                   to=TensorProto.FLOAT),
                  helper.make_node("ReduceSum", [f"{name}_float", "axis"], [column],
                                   keepdims=1)]
    last = "logits_raw" if poisoned else "logits"
    nodes.append(helper.make_node("Concat", ["ids_sum", "types_sum"], [last], axis=1))
    initializers = [helper.make_tensor("axis", TensorProto.INT64, [1], [1])]
    if poisoned:
        nodes.append(helper.make_node("Mul", ["logits_raw", "nan"], ["logits"]))
        initializers.append(helper.make_tensor("nan", TensorProto.FLOAT, [1], [float("nan")]))
    graph = helper.make_graph(
        nodes, "statistics",
        [helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "sequence"])
         for name in INPUTS],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])],
        initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())
    shutil.copy(MINILM / "tokenizer.json", path.parent / "tokenizer.json")
    return path


def _spec(path: Path, **keys: object) -> ModelConfig:
    return ModelConfig.model_validate({"name": "classifier", "path": path, "format": "onnx",
                                       "device": "cpu", "tokenize": True,
                                       "max_length": MAX_LENGTH, "weights_cache": False, **keys})


@pytest.fixture
def load() -> Iterator[list[Instance]]:
    loaded: list[Instance] = []
    yield loaded
    for instance in loaded:
        instance.close()


def _load(loaded: list[Instance], tmp_path: Path, spec: ModelConfig) -> Instance:
    loaded.append(OnnxBackend(tmp_path / "cache").load_blocking(spec))
    return loaded[-1]


def _expected(firsts: list[str], seconds: list[str] | None = None) -> np.ndarray:
    library = Tokenizer.from_file(str(MINILM / "tokenizer.json"))
    library.no_padding()
    library.enable_truncation(max_length=MAX_LENGTH)
    encodings = [library.encode(*texts) for texts in
                 zip(firsts, seconds or [None] * len(firsts), strict=True)]
    return np.array([[sum(e.ids), sum(e.type_ids)] for e in encodings], dtype=np.float32)


def _pairs(firsts: list[str], seconds: list[str]) -> Arrays:
    return {"text": np.array(firsts, dtype=object), "text_pair": np.array(seconds, dtype=object)}


def test_an_entry_with_task_text_classification_takes_text_and_text_pair(
    load: list[Instance], tmp_path: Path
) -> None:
    instance = _load(load, tmp_path, _spec(_write_statistics(tmp_path / "m" / "model.onnx"),
                                           task="text-classification"))

    assert isinstance(instance, OnnxTextClassifier)
    metadata = instance.metadata
    assert [(s.name, s.datatype, s.shape, s.optional) for s in metadata.inputs] == [
        *((name, "INT64", (-1, -1), True) for name in INPUTS),
        ("text", "BYTES", (-1,), True), ("text_pair", "BYTES", (-1,), True)]
    assert [(s.name, s.datatype, s.shape) for s in metadata.outputs] == [
        ("logits", "FP32", (-1, 2)), ("token_count", "INT64", (-1,))]
    assert metadata.input_sets == (("text",), ("input_ids", "attention_mask"))


def test_a_config_json_naming_a_sequence_classifier_makes_one(
    load: list[Instance], tmp_path: Path
) -> None:
    graph = _write_statistics(tmp_path / "export" / "onnx" / "model.onnx")
    shutil.move(graph.parent / "tokenizer.json", graph.parent.parent / "tokenizer.json")
    (graph.parent.parent / "config.json").write_text(json.dumps(CLASSIFIER))

    assert isinstance(_load(load, tmp_path, _spec(graph)), OnnxTextClassifier)


def test_requests_of_pairs_run_as_one_batch_and_each_gets_its_own_rows(
    load: list[Instance], tmp_path: Path
) -> None:
    instance = _load(load, tmp_path, _spec(_write_statistics(tmp_path / "m" / "model.onnx"),
                                           task="text-classification"))
    long = "a long document with many words " * 5
    first = _pairs(["short query", "another query"], ["a document", long])
    second = _pairs(["a query that is long enough to be cut as well"], [long])
    for request in (first, second):
        instance.validate_inputs(request)

    together = instance.run_batch_blocking([first, second], None)

    assert [part["logits"].tolist() for part in together] == [
        _expected(["short query", "another query"], ["a document", long]).tolist(),
        _expected(["a query that is long enough to be cut as well"], [long]).tolist()]
    assert [instance.run_blocking(r, None)["logits"].tolist() for r in (first, second)] == \
        [part["logits"].tolist() for part in together]


def test_single_texts_and_token_ids_still_run(load: list[Instance], tmp_path: Path) -> None:
    instance = _load(load, tmp_path, _spec(_write_statistics(tmp_path / "m" / "model.onnx"),
                                           task="text-classification"))
    texts: Arrays = {"text": np.array(["one text", "and another, longer, text"], dtype=object)}
    ids: Arrays = {"input_ids": np.array([[101, 7592, 102]]),
                   "attention_mask": np.array([[1, 1, 1]])}
    instance.validate_inputs(texts)
    instance.validate_inputs(ids)

    assert instance.run_blocking(texts, None)["logits"].tolist() == \
        _expected(["one text", "and another, longer, text"]).tolist()
    assert instance.run_blocking(ids, None)["logits"].tolist() == [[101 + 7592 + 102, 0]]


def test_a_graph_whose_logits_are_nan_fails_its_load_saying_so(tmp_path: Path) -> None:
    spec = _spec(_write_statistics(tmp_path / "m" / "model.onnx", poisoned=True),
                 task="text-classification")

    with pytest.raises(RuntimeError, match=r"model 'classifier' answered NaN logits for 1 of 1 "
                                           r"rows: .* \(a short text pair, run at load\)"):
        OnnxBackend(tmp_path / "cache").load_blocking(spec)


def test_a_graph_without_logits_is_no_text_classifier(tmp_path: Path) -> None:
    path = tmp_path / "m" / "model.onnx"
    _write_statistics(path)
    spec = _spec(path, task="text-classification")
    graph = path.read_bytes().replace(b"logits", b"scores")  # the one output, renamed
    path.write_bytes(graph)

    with pytest.raises(RuntimeError, match=r"needs a graph output 'logits', a 2-D float tensor "
                                           r"\[rows, labels\]; the graph outputs scores FP32 "
                                           r"\[-1, 2\]"):
        OnnxBackend(tmp_path / "cache").load_blocking(spec)


def test_a_classifier_loaded_as_an_embedding_model_says_to_set_its_task(tmp_path: Path) -> None:
    spec = _spec(_write_statistics(tmp_path / "m" / "model.onnx"))

    with pytest.raises(RuntimeError, match=re.escape(
            'A text classifier? Set task = "text-classification" in the model\'s entry')):
        OnnxBackend(tmp_path / "cache").load_blocking(spec)


def _write_widths(path: Path) -> Path:
    """logits [rows, 2]: each row's sum of token ids (masked), and the width it was padded to."""
    nodes = [helper.make_node("Mul", ["input_ids", "attention_mask"], ["kept"]),
             helper.make_node("Cast", ["kept"], ["kept_float"], to=TensorProto.FLOAT),
             helper.make_node("ReduceSum", ["kept_float", "axis"], ["ids_sum"], keepdims=1),
             helper.make_node("GreaterOrEqual", ["input_ids", "zero"], ["every"]),
             helper.make_node("Cast", ["every"], ["ones"], to=TensorProto.FLOAT),
             helper.make_node("ReduceSum", ["ones", "axis"], ["width"], keepdims=1),
             helper.make_node("Concat", ["ids_sum", "width"], ["logits"], axis=1)]
    graph = helper.make_graph(
        nodes, "widths",
        [helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "sequence"])
         for name in INPUTS],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 2])],
        [helper.make_tensor("axis", TensorProto.INT64, [1], [1]),
         helper.make_tensor("zero", TensorProto.INT64, [], [0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())
    shutil.copy(MINILM / "tokenizer.json", path.parent / "tokenizer.json")
    return path


def test_a_batch_over_max_batch_tokens_runs_its_pairs_sorted_by_length(
    load: list[Instance], tmp_path: Path
) -> None:
    instance = _load(load, tmp_path, _spec(_write_widths(tmp_path / "m" / "model.onnx"),
                                           task="text-classification",
                                           batching={"max_batch_tokens": 24}))
    long = "a long document with many words " * 5
    first = _pairs(["query", "query", "query"], [long, "a", "two words"])
    second = _pairs(["another query"], ["three short words"])
    for request in (first, second):
        instance.validate_inputs(request)

    together = instance.run_batch_blocking([first, second], None)

    firsts, seconds = [*first["text"], *second["text"]], [*first["text_pair"], *second["text_pair"]]
    expected = _expected(firsts, seconds)[:, 0]
    answered = np.concatenate([part["logits"] for part in together])
    assert answered[:, 0].tolist() == expected.tolist()
    counts = [int(_count(a, b)) for a, b in zip(firsts, seconds, strict=True)]
    # Sorted: the three short pairs share a run of their longest (3 x 8 <= 24); the long one
    # runs alone at max_length, where one padded batch would have put every row.
    assert counts == [MAX_LENGTH, 5, 6, 8]
    assert answered[:, 1].tolist() == [MAX_LENGTH, 8, 8, 8]
    # Each row's tokens, as the rerank routes report them.
    assert np.concatenate([part["token_count"] for part in together]).tolist() == counts


def _count(first: str, second: str) -> int:
    library = Tokenizer.from_file(str(MINILM / "tokenizer.json"))
    library.no_padding()
    library.enable_truncation(max_length=MAX_LENGTH)
    return len(library.encode(first, second).ids)
