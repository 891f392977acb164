"""A text model's task and a text classifier's settings, from its entry and files: the entry's
`task` first, else config.json's architectures (a torch folder's, or beside an ONNX export's
tokenizer); a classifier's max_length from tokenizer_config.json, its sentence-transformers
modules never refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from snoozeml.config.settings import ModelConfig
from snoozeml.runtime.text.settings import (
    DEFAULT_MAX_LENGTH,
    UnsupportedLayout,
    can_embed,
    can_score_pairs,
    text_settings,
    text_task,
    tokenizer_max_length,
)

CLASSIFIER = {"architectures": ["BertForSequenceClassification"]}
ENCODER = {"architectures": ["BertModel"]}
# What sentence-transformers 6 saves for a CrossEncoder: a Transformer module of its own.
ST6_MODULES = [{"idx": 0, "name": "0", "path": "",
                "type": "sentence_transformers.base.modules.transformer.Transformer"}]


def _folder(tmp_path: Path, config: dict[str, object] | None, **files: object) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    if config is not None:
        (folder / "config.json").write_text(json.dumps(config))
    for name, content in files.items():
        (folder / f"{name}.json").write_text(json.dumps(content))
    return folder


def _spec(path: Path, fmt: str, **keys: object) -> ModelConfig:
    return ModelConfig.model_validate({"name": "m", "path": path, "format": fmt,
                                       "tokenize": True, **keys})


@pytest.mark.parametrize(("config", "keys", "task"), [
    (CLASSIFIER, {}, "text-classification"),
    (ENCODER, {}, "feature-extraction"),
    (ENCODER, {"task": "text-classification"}, "text-classification"),
    (None, {}, None),
])
def test_the_task_is_the_entrys_else_config_jsons(tmp_path: Path, config: dict[str, object] | None,
                                                  keys: dict[str, object],
                                                  task: str | None) -> None:
    folder = _folder(tmp_path, config)
    torch_spec = _spec(folder, "torch", **keys)
    onnx_spec = _spec(folder / "model.onnx", "onnx", **keys)

    assert text_task(torch_spec) == task
    assert text_task(onnx_spec) == task
    assert can_score_pairs(onnx_spec) == (task == "text-classification")
    assert can_embed(onnx_spec) == (task in ("feature-extraction", None))
    assert can_embed(torch_spec) == (task == "feature-extraction")


def test_a_model_that_takes_no_text_scores_no_pairs(tmp_path: Path) -> None:
    folder = _folder(tmp_path, CLASSIFIER)
    assert not can_score_pairs(_spec(folder, "torch", tokenize=False))


@pytest.mark.parametrize(("value", "length"), [
    (256, 256), (1000000000000000019884624838656, None), ("512", None), (None, None)])
def test_the_tokenizers_max_length_unless_it_means_no_limit(tmp_path: Path, value: object,
                                                             length: int | None) -> None:
    folder = _folder(tmp_path, None, tokenizer_config={"model_max_length": value})
    assert tokenizer_max_length(folder) == length


def test_a_classifiers_max_length_is_its_tokenizers_and_its_modules_are_not_refused(
    tmp_path: Path,
) -> None:
    folder = _folder(tmp_path, CLASSIFIER, tokenizer_config={"model_max_length": 384},
                     modules=ST6_MODULES)
    spec = _spec(folder, "torch", truncate_query=False)

    settings = text_settings(spec, pooled=False)

    assert (settings.max_length, settings.truncate_query) == (384, False)
    assert text_settings(_spec(folder, "torch", max_length=64), pooled=False).max_length == 64
    with pytest.raises(UnsupportedLayout, match="Transformer"):
        text_settings(spec)  # an embedding model's modules are checked


def test_an_embedding_models_max_length_ignores_the_tokenizers(tmp_path: Path) -> None:
    folder = _folder(tmp_path, ENCODER, tokenizer_config={"model_max_length": 384})
    assert text_settings(_spec(folder, "torch")).max_length == DEFAULT_MAX_LENGTH
