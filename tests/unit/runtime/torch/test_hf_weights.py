"""Hugging Face folders loaded by mapping their safetensors file (runtime/torch/hf_weights.py),
against
transformers' own `from_pretrained`: bit-identical outputs, the same failures for weights that
are missing or mis-shaped, `from_pretrained` itself for what the mapped path does not handle,
and weights that are really resident, survive their file's deletion and go with the model.

Real torch, transformers and the real all-MiniLM-L6-v2 weights; the path a load took is read
from its `weights_loaded` event.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import safetensors.torch
import torch
import transformers
from torch_models import MINILM, SENTENCES, TINY_BERT, save_bert, save_vit, token_rows

from snoozeml.config.settings import ModelConfig
from snoozeml.runtime.torch.env import dtype_key, transformers_version
from snoozeml.runtime.torch.hf_weights import NotMappable, load_mapped
from snoozeml.runtime.torch.huggingface import HuggingFaceInstance

LINUX = sys.platform.startswith("linux")
# transformers 4 loads everything through from_pretrained (runtime/torch/hf_weights.py says why).
maps = pytest.mark.skipif(transformers_version() < (5, 0), reason="maps with transformers 5")


@pytest.fixture
def loads(caplog: pytest.LogCaptureFixture) -> Iterator[Any]:
    """Load a spec into a HuggingFaceInstance; returns it and the path its weights took
    ("mmap" or "from_pretrained"). Every instance is closed at the end."""
    opened: list[HuggingFaceInstance] = []

    def load(spec: ModelConfig) -> tuple[HuggingFaceInstance, str]:
        mark = len(caplog.records)
        with caplog.at_level(logging.INFO, logger="snoozeml"):
            instance = HuggingFaceInstance(spec)
        opened.append(instance)
        return instance, _via(caplog, mark)

    yield load
    for instance in opened:
        instance.close()


def _via(caplog: pytest.LogCaptureFixture, mark: int) -> str:
    events = [r.getMessage() for r in caplog.records[mark:]
              if r.getMessage().startswith("weights_loaded ")]
    assert len(events) == 1, events
    match = re.search(r" via=(\S+)", events[0])
    assert match, events[0]
    return match.group(1)


def _spec(folder: Path, **fields: Any) -> ModelConfig:
    return ModelConfig(name=folder.name, path=folder, format="torch", device="cpu", **fields)


def _tokens(seed: int = 0) -> dict[str, np.ndarray]:
    ids, mask = token_rows([7, 4, 1], 7, seed)
    return {"input_ids": ids, "attention_mask": mask}


def _reference(folder: Path, cls: Any, tokens: dict[str, np.ndarray],
               dtype: Any = None) -> Any:
    """transformers' own answer: `from_pretrained` and a forward pass."""
    kwargs = {dtype_key(): dtype} if dtype is not None else {}
    model = cls.from_pretrained(str(folder), local_files_only=True, **kwargs).eval()
    with torch.inference_mode():
        return model(**{k: torch.from_numpy(v) for k, v in tokens.items()})


@pytest.fixture(scope="module")
def sharded_minilm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """MiniLM re-saved in shards with an index: the mapped path leaves it to from_pretrained."""
    folder = tmp_path_factory.mktemp("sharded") / "minilm-sharded"
    model = transformers.AutoModel.from_pretrained(str(MINILM), local_files_only=True)
    model.save_pretrained(str(folder), max_shard_size="30MB")
    shutil.copy(MINILM / "tokenizer.json", folder / "tokenizer.json")
    assert (folder / "model.safetensors.index.json").is_file()
    return folder


# --- the same answers -----------------------------------------------------------------------


@maps
def test_minilm_maps_its_weights_and_answers_bit_for_bit_like_from_pretrained(
    loads: Any, sharded_minilm: Path,
) -> None:
    mapped, via = loads(_spec(MINILM, tokenize=True))
    assert via == "mmap"
    reference, reference_via = loads(_spec(sharded_minilm, tokenize=True))
    assert reference_via == "from_pretrained"
    texts = np.array(SENTENCES, dtype=object)

    got = mapped.run_blocking({"text": texts.copy()}, None)
    expected = reference.run_blocking({"text": texts.copy()}, None)

    for name in ("last_hidden_state", "embedding"):
        np.testing.assert_array_equal(got[name], expected[name])
    tokens = _tokens()
    hidden = _reference(MINILM, transformers.AutoModel, tokens).last_hidden_state.numpy()
    np.testing.assert_array_equal(mapped.run_blocking(tokens, None)["last_hidden_state"],
                                  hidden)


@maps
def test_a_classifier_maps_its_weights_and_serves_from_pretrained_logits(
    loads: Any, tmp_path: Path,
) -> None:
    folder = tmp_path / "classifier"
    save_bert(folder, transformers.BertForSequenceClassification, seed=1, num_labels=3,
              **TINY_BERT)
    tokens = _tokens(1)

    instance, via = loads(_spec(folder))

    assert via == "mmap"
    expected = _reference(folder, transformers.BertForSequenceClassification, tokens).logits
    np.testing.assert_array_equal(instance.run_blocking(tokens, None)["logits"],
                                  expected.numpy())


@maps
def test_a_classifier_checkpoint_served_for_its_features_drops_the_head_with_a_warning(
    loads: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    folder = tmp_path / "classifier"
    save_bert(folder, transformers.BertForSequenceClassification, seed=2, num_labels=3,
              **TINY_BERT)
    tokens = _tokens(2)

    instance, via = loads(_spec(folder, task="feature-extraction"))

    assert via == "mmap"  # keys "bert.*" for a BertModel: the base_model_prefix comes off
    expected = _reference(folder, transformers.BertModel, tokens).last_hidden_state
    np.testing.assert_array_equal(instance.run_blocking(tokens, None)["last_hidden_state"],
                                  expected.numpy())
    assert re.search(r"weights_unused .*classifier\.bias, classifier\.weight", caplog.text)


@maps
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_model_served_below_float32_matches_from_pretrained_in_that_dtype(
    loads: Any, tmp_path: Path, dtype: str,
) -> None:
    folder = tmp_path / "bert"
    save_bert(folder, **TINY_BERT)
    tokens = _tokens(3)

    instance, via = loads(_spec(folder, dtype=dtype))

    assert via == "mmap"
    assert {p.dtype for p in instance.model.parameters()} == {getattr(torch, dtype)}
    expected = _reference(folder, transformers.BertModel, tokens, getattr(torch, dtype))
    np.testing.assert_array_equal(instance.run_blocking(tokens, None)["last_hidden_state"],
                                  expected.last_hidden_state.float().numpy())


@maps
def test_weights_saved_once_for_two_places_are_tied_again(tmp_path: Path) -> None:
    folder = tmp_path / "masked-lm"
    save_bert(folder, transformers.BertForMaskedLM, seed=4, **TINY_BERT)
    saved = safetensors.torch.load_file(str(folder / "model.safetensors"))
    assert "cls.predictions.decoder.weight" not in saved  # premise: written once
    config = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True)
    tokens = _tokens(4)

    model = load_mapped(folder, transformers.BertForMaskedLM, config, torch.float32).model

    decoder = model.cls.predictions.decoder.weight
    assert decoder is model.bert.embeddings.word_embeddings.weight
    with torch.inference_mode():
        logits = model.eval()(**{k: torch.from_numpy(v) for k, v in tokens.items()}).logits
    expected = _reference(folder, transformers.BertForMaskedLM, tokens).logits
    assert torch.equal(logits, expected)


def _save_resnet(folder: Path) -> None:
    """A tiny random ResNet classifier: BatchNorm running statistics are persistent buffers."""
    torch.manual_seed(7)
    config = transformers.ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1],
                                       num_labels=3)
    transformers.ResNetForImageClassification(config).eval().save_pretrained(str(folder))


def assert_logits_as_from_pretrained(instance: Any, cls: Any, folder: Path,
                                     pixels: np.ndarray) -> None:
    """The instance's logits for `pixels` are exactly those of `cls.from_pretrained`."""
    model = cls.from_pretrained(str(folder)).eval()
    with torch.inference_mode():
        expected = model(pixel_values=torch.from_numpy(pixels)).logits.numpy()
    np.testing.assert_array_equal(instance.run_blocking({"pixel_values": pixels}, None)["logits"],
                                  expected)


@maps
def test_buffers_saved_in_the_checkpoint_are_mapped_with_the_weights(
    loads: Any, tmp_path: Path,
) -> None:
    folder = tmp_path / "resnet"
    _save_resnet(folder)
    pixels = np.random.default_rng(7).standard_normal((2, 3, 32, 32)).astype(np.float32)

    instance, via = loads(_spec(folder))

    assert via == "mmap"
    assert_logits_as_from_pretrained(instance, transformers.ResNetForImageClassification, folder,
                                     pixels)


@maps
def test_modules_built_on_other_threads_during_a_mapped_load_keep_their_weights(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "bert"
    save_bert(folder, **TINY_BERT)
    config = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True)
    built: dict[str, Any] = {}

    def bert_with_a_neighbour(config: Any) -> Any:
        # Mid-build, another thread (another model's load) builds a module of its own.
        neighbour = threading.Thread(target=lambda: built.update(other=torch.nn.Linear(4, 4)))
        neighbour.start()
        neighbour.join()
        return transformers.BertModel(config)

    load_mapped(folder, bert_with_a_neighbour, config, torch.float32)

    assert not built["other"].weight.is_meta
    assert built["other"].weight.abs().sum() > 0  # initialised, as torch does it
    assert not torch.nn.Linear(4, 4).weight.is_meta  # and this thread is itself again


# --- failures stay failures ------------------------------------------------------------------


def test_a_checkpoint_missing_a_buffer_still_fails_naming_it(loads: Any, tmp_path: Path) -> None:
    folder = tmp_path / "resnet"
    _save_resnet(folder)
    weights = folder / "model.safetensors"
    state = safetensors.torch.load_file(str(weights))
    del state["resnet.embedder.embedder.normalization.running_mean"]
    safetensors.torch.save_file(state, str(weights), metadata={"format": "pt"})

    with pytest.raises(RuntimeError, match=r"missing resnet\.embedder\.embedder\."
                                           r"normalization\.running_mean"):
        loads(_spec(folder))


def test_a_checkpoint_missing_weights_still_fails_naming_them(
    loads: Any, tmp_path: Path,
) -> None:
    folder = tmp_path / "missing"
    save_bert(folder, **TINY_BERT)
    weights = folder / "model.safetensors"
    kept = {k: v for k, v in safetensors.torch.load_file(str(weights)).items()
            if not k.startswith("encoder.layer.1.")}
    safetensors.torch.save_file(kept, str(weights), metadata={"format": "pt"})

    with pytest.raises(RuntimeError, match=r"do not match its config.json: missing "
                                           r"encoder\.layer\.1\."):
        loads(_spec(folder))


def test_a_checkpoint_with_mis_shaped_weights_still_fails_naming_them(
    loads: Any, tmp_path: Path,
) -> None:
    folder = tmp_path / "shapes"
    save_bert(folder, **TINY_BERT)
    config = json.loads((folder / "config.json").read_text())
    config["intermediate_size"] += 8
    (folder / "config.json").write_text(json.dumps(config))

    with pytest.raises(RuntimeError, match=r"shapes differ \(weights vs config\) for "
                                           r"encoder\.layer\.0\.intermediate\.dense\.bias"):
        loads(_spec(folder))


@maps
def test_the_mapped_path_refuses_rather_than_guesses(tmp_path: Path) -> None:
    folder = tmp_path / "base"
    save_bert(folder, **TINY_BERT)
    config = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True)

    with pytest.raises(NotMappable, match=r"classifier\.bias, classifier\.weight"):
        load_mapped(folder, transformers.BertForSequenceClassification, config, torch.float32)


# --- what goes to from_pretrained -----------------------------------------------------------


def test_a_model_whose_weights_transformers_converts_on_load_takes_from_pretrained(
    loads: Any, tmp_path: Path,
) -> None:
    folder = tmp_path / "vit"
    save_vit(folder)
    pixels = np.random.default_rng(5).standard_normal((2, 3, 32, 32)).astype(np.float32)

    instance, via = loads(_spec(folder))

    assert via == "from_pretrained"
    assert_logits_as_from_pretrained(instance, transformers.ViTForImageClassification, folder,
                                     pixels)


# --- the weights in memory ------------------------------------------------------------------


def _mapped_bytes(path: Path) -> int | None:
    """Resident bytes of this process's mappings of `path`; None when it has none."""
    resident, found, current = 0, False, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            current = len(fields) >= 6 and fields[5] == str(path)
            found = found or current
        elif current and fields[0] == "Rss:":
            resident += int(fields[1]) * 1024
    return resident if found else None


@maps
@pytest.mark.skipif(not LINUX, reason="reads /proc/self/smaps")
def test_the_mapped_weights_are_resident_once_loaded_and_unmapped_once_closed(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "minilm"
    shutil.copytree(MINILM, folder)  # a file of its own: no other test maps it
    weights = folder / "model.safetensors"
    instance = HuggingFaceInstance(_spec(folder))
    try:
        resident = _mapped_bytes(weights)
        assert resident is not None
        # Every page of the weights (all but the file's JSON header) counts in the RSS.
        assert resident >= weights.stat().st_size - 64 * 1024
    finally:
        instance.close()
    assert _mapped_bytes(weights) is None


@maps
@pytest.mark.skipif(sys.platform == "win32", reason="an open file cannot be deleted there")
def test_a_model_keeps_answering_after_its_weights_file_is_deleted(
    loads: Any, tmp_path: Path,
) -> None:
    folder = tmp_path / "bert"
    save_bert(folder, **TINY_BERT)
    tokens = _tokens(6)
    instance, via = loads(_spec(folder))
    assert via == "mmap"
    before = instance.run_blocking(tokens, None)

    (folder / "model.safetensors").unlink()  # the mapping keeps the file's pages (Linux)

    after = instance.run_blocking(tokens, None)
    for name in ("last_hidden_state", "embedding"):
        np.testing.assert_array_equal(after[name], before[name])
