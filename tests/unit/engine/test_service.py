"""The service facade (engine/service.py) without a transport: Triton statistics looked up by
model name and version, the extensions the server metadata lists, and what each model can do
(read from its entry and files once per model)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from onnx_models import write_mlp

from snoozeml.config.settings import parse_config
from snoozeml.engine.capabilities import Capabilities, EmbeddingSettings
from snoozeml.engine.events import BatchRun
from snoozeml.engine.registry import ModelManager
from snoozeml.engine.service import EXTENSIONS, InferenceService
from snoozeml.errors import BackendError, ModelNotFound


@pytest.fixture
def service(tmp_path: Path) -> Iterator[InferenceService]:
    for name in ("a", "b"):
        write_mlp(tmp_path / f"{name}.onnx", dims=(4, 2))
    config = parse_config({"models": [
        {"name": "a", "path": str(tmp_path / "a.onnx")},
        {"name": "b", "path": str(tmp_path / "b.onnx")},
    ]}, source=tmp_path / "models.toml")
    manager = ModelManager(config)
    yield InferenceService(manager)
    manager.loader.shutdown()


def test_the_service_answers_for_one_model_or_every_configured_one(
    service: InferenceService,
) -> None:
    service.events.publish(BatchRun("b", 0, 2, (0.001,), 0.002, False))
    assert [s.name for s in service.statistics()] == ["a", "b"]  # loaded or not
    assert [s.name for s in service.statistics("")] == ["a", "b"]
    (b,) = service.statistics("b")
    assert (b.name, b.version, b.inference_count, b.execution_count) == ("b", "1", 2, 1)
    assert service.statistics("b", "1") == (b,)


def test_an_unknown_model_or_version_is_not_found(service: InferenceService) -> None:
    with pytest.raises(ModelNotFound):
        service.statistics("missing")
    with pytest.raises(ModelNotFound):
        service.statistics("a", "7")


def test_server_metadata_lists_the_extension() -> None:
    assert "statistics" in EXTENSIONS


def sentence_transformers_folder(folder: Path, *modules: str) -> Path:
    """An ONNX model in a sentence-transformers folder: CLS pooling, 128 tokens, and the
    modules named (`Normalize`, `Dense`) after the pooling."""
    folder.mkdir()
    write_mlp(folder / "model.onnx", dims=(4, 2))
    kinds = ["Transformer", "Pooling", *modules]
    (folder / "modules.json").write_text(json.dumps([
        {"type": f"sentence_transformers.models.{kind}", "path": f"{i}_{kind}"}
        for i, kind in enumerate(kinds)]))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(
        {"pooling_mode_cls_token": True}))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128}))
    return folder / "model.onnx"


@pytest.fixture
def text_service(tmp_path: Path) -> Iterator[InferenceService]:
    write_mlp(tmp_path / "plain.onnx", dims=(4, 2))
    config = parse_config({"models": [
        {"name": "plain", "path": str(tmp_path / "plain.onnx"),
         "batching": {"max_batch_size": 1}},
        {"name": "minilm", "path": str(sentence_transformers_folder(
            tmp_path / "minilm", "Normalize")), "tokenize": True, "matryoshka": True,
         "batching": {"max_batch_size": 16}},
        {"name": "projected", "path": str(sentence_transformers_folder(
            tmp_path / "projected", "Dense")), "tokenize": True},
    ]}, source=tmp_path / "models.toml")
    manager = ModelManager(config)
    yield InferenceService(manager)
    manager.loader.shutdown()


def test_the_service_says_which_models_embed_and_how_from_their_files(
    text_service: InferenceService,
) -> None:
    service = text_service
    assert service.model_names() == ["plain", "minilm", "projected"]
    assert service.capabilities("plain") == Capabilities(embeddings=False, max_batch_size=1)
    assert service.capabilities("minilm") == Capabilities(embeddings=True, max_batch_size=16)
    assert service.embedding_settings("minilm") == EmbeddingSettings(
        normalize=True, max_length=128, truncate=True, matryoshka=True)
    with pytest.raises(BackendError, match="uses Dense"):  # a layout SnoozeML does not run
        service.embedding_settings("projected")
    with pytest.raises(ModelNotFound):
        service.capabilities("missing")
    with pytest.raises(ModelNotFound):
        service.embedding_settings("missing")


def test_a_models_files_are_read_once_not_per_request(
    text_service: InferenceService, tmp_path: Path,
) -> None:
    before = text_service.embedding_settings("minilm")
    (tmp_path / "minilm" / "sentence_bert_config.json").write_text('{"max_seq_length": 64}')
    assert text_service.embedding_settings("minilm") is before
    assert text_service.capabilities("minilm") is text_service.capabilities("minilm")


def classifier_folder(folder: Path, labels: int | None, architecture: str) -> Path:
    """An ONNX export in the Hub's layout (`onnx/model.onnx`) under a tokenizer and a Hugging
    Face config.json naming `architecture`, with `labels` labels in id2label (None: neither
    id2label nor num_labels)."""
    (folder / "onnx").mkdir(parents=True)
    write_mlp(folder / "onnx" / "model.onnx", dims=(4, 2))
    config: dict[str, object] = {"architectures": [architecture]}
    if labels is not None:
        config["id2label"] = {str(i): f"LABEL_{i}" for i in range(labels)}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer.json").write_text("{}")  # where the config is looked for; never read
    return folder / "onnx" / "model.onnx"


def test_the_service_says_which_models_score_text_pairs_and_with_how_many_labels(
    tmp_path: Path,
) -> None:
    sequence = "BertForSequenceClassification"
    config = parse_config({"models": [
        {"name": "reranker", "path": str(classifier_folder(tmp_path / "r", 1, sequence)),
         "tokenize": True, "batching": {"max_batch_size": 8}},
        {"name": "nli", "path": str(classifier_folder(tmp_path / "n", 3, sequence)),
         "tokenize": True},
        {"name": "default-labels", "path": str(classifier_folder(tmp_path / "d", None, sequence)),
         "tokenize": True},
        {"name": "untokenized", "path": str(classifier_folder(tmp_path / "u", 1, sequence))},
        {"name": "encoder", "path": str(classifier_folder(tmp_path / "e", None, "BertModel")),
         "tokenize": True},
    ]}, source=tmp_path / "models.toml")
    manager = ModelManager(config)
    service = InferenceService(manager)
    try:
        assert service.capabilities("reranker") == Capabilities(
            embeddings=False, max_batch_size=8, reranks=True, num_labels=1)
        assert service.capabilities("nli").num_labels == 3
        assert service.capabilities("default-labels").num_labels == 2  # transformers' default
        # A classifier that takes no text scores no pairs; an encoder embeds and does not.
        assert not service.capabilities("untokenized").reranks
        encoder = service.capabilities("encoder")
        assert (encoder.embeddings, encoder.reranks, encoder.num_labels) == (True, False, None)
    finally:
        manager.loader.shutdown()
