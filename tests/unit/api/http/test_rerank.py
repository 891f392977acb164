"""The rerank routes' handlers (api/http/rerank.py) on a real service, before any model runs:
which model a request gets (named, or the daemon's one reranker), what is refused, and what the
loaded model's metadata must say. The requests themselves run against the daemon
(tests/integration/test_rerank.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from onnx_models import write_mlp

from snoozeml.api.http.rerank import Reranking, _check_model, _pair_request, reranks
from snoozeml.api.http.rerank_shapes import BadField, NotAReranker
from snoozeml.config.settings import parse_config
from snoozeml.datatypes import ModelMetadata, TensorSpec
from snoozeml.engine.capabilities import Capabilities
from snoozeml.engine.registry import ModelManager
from snoozeml.engine.service import InferenceService
from snoozeml.errors import ModelNotFound


def classifier(folder: Path, labels: int) -> str:
    """An ONNX export under a config.json of a `labels`-label sequence classifier (only the
    files are read here; nothing loads)."""
    (folder / "onnx").mkdir(parents=True)
    write_mlp(folder / "onnx" / "model.onnx", dims=(4, 2))
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["BertForSequenceClassification"],
        "id2label": {str(i): f"LABEL_{i}" for i in range(labels)}}))
    (folder / "tokenizer.json").write_text("{}")
    return str(folder / "onnx" / "model.onnx")


def reranking(tmp_path: Path, *entries: tuple[str, int | None]) -> Iterator[Reranking]:
    """The handlers over models named with their labels (None: an ONNX MLP, no text)."""
    models = []
    for name, labels in entries:
        if labels is None:
            write_mlp(tmp_path / f"{name}.onnx", dims=(4, 2))
            models.append({"name": name, "path": str(tmp_path / f"{name}.onnx")})
        else:
            models.append({"name": name, "path": classifier(tmp_path / name, labels),
                           "tokenize": True})
    manager = ModelManager(parse_config({"models": models}, source=tmp_path / "models.toml"))
    yield Reranking(InferenceService(manager), 1024, 10)
    manager.loader.shutdown()


@pytest.fixture
def one(tmp_path: Path) -> Iterator[Reranking]:
    yield from reranking(tmp_path, ("mlp", None), ("nli", 3), ("ms-marco", 1))


@pytest.fixture
def two(tmp_path: Path) -> Iterator[Reranking]:
    yield from reranking(tmp_path, ("a", 1), ("nli", 3), ("b", 1))


def test_a_request_without_a_model_gets_the_one_reranker(one: Reranking) -> None:
    assert one._reranker(None) == "ms-marco"  # the three-label classifier does not count
    assert one._reranker("ms-marco") == "ms-marco"


def test_with_several_rerankers_a_request_must_name_one(two: Reranking) -> None:
    with pytest.raises(BadField, match="2 rerankers, 'a', 'b'") as raised:
        two._reranker(None)
    assert raised.value.param == "model"
    assert two._reranker("b") == "b"


def test_no_reranker_at_all_is_not_found(tmp_path: Path) -> None:
    for handlers in reranking(tmp_path, ("mlp", None)):
        with pytest.raises(ModelNotFound, match="no model on this server reranks"):
            handlers._reranker(None)


def test_unknown_models_and_models_that_do_not_rerank_are_refused(one: Reranking) -> None:
    with pytest.raises(ModelNotFound):
        one._reranker("nope")
    with pytest.raises(NotAReranker, match="'mlp' does not rerank"):
        one._reranker("mlp")
    with pytest.raises(NotAReranker, match="'nli' has 3 labels"):
        one._reranker("nli")


def test_a_reranker_has_one_label_or_labels_not_yet_known() -> None:
    assert reranks(Capabilities(False, 8, reranks=True, num_labels=1))
    assert reranks(Capabilities(False, 8, reranks=True, num_labels=None))
    assert not reranks(Capabilities(False, 8, reranks=True, num_labels=2))
    assert not reranks(Capabilities(True, 8))


def _metadata(inputs: tuple[str, ...], logits: tuple[int, ...],
              counts: bool = False) -> ModelMetadata:
    outputs = [TensorSpec("logits", "FP32", logits)]
    if counts:
        outputs.append(TensorSpec("token_count", "INT64", (-1,)))
    return ModelMetadata("m", "pytorch_safetensors",
                         tuple(TensorSpec(name, "BYTES", (-1,)) for name in inputs),
                         tuple(outputs))


def test_the_loaded_models_metadata_has_the_last_word() -> None:
    assert _check_model(_metadata(("text", "text_pair"), (-1, 1), counts=True), "m")
    assert not _check_model(_metadata(("text", "text_pair"), (-1, -1)), "m")
    with pytest.raises(NotAReranker, match="does not take text pairs"):
        _check_model(_metadata(("text",), (-1, 1)), "m")
    with pytest.raises(NotAReranker, match="has 2 labels"):
        _check_model(_metadata(("text", "text_pair"), (-1, 2)), "m")


def test_a_piece_carries_max_tokens_per_doc_as_text_pairs_parameter() -> None:
    capped = _pair_request("q", ["a", "b"], counts=True, max_tokens=7)
    whole = _pair_request("q", ["a", "b"], counts=False)

    assert [(i.name, i.data.tolist(), i.parameters) for i in capped.inputs] == [
        ("text", ["q", "q"], {}), ("text_pair", ["a", "b"], {"max_tokens": 7})]
    assert [o.name for o in capped.outputs or []] == ["logits", "token_count"]
    assert [i.parameters for i in whole.inputs] == [{}, {}]
