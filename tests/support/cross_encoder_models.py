"""A real MiniLM-sized cross-encoder for the tests of text pairs: the offline all-MiniLM-L6-v2
encoder (torch_models.MINILM) under a seeded one-label sequence-classification head, saved the
way a cross-encoder is published (a Hugging Face folder with its tokenizer), and its ONNX export
(the graph beside the tokenizer and config.json, as an export ships). Broken copies answer NaN:
everywhere (a NaN in the head's weights), or only for texts with one word (its embedding row).

Made once per test module that asks (a few seconds: MiniLM's weights, the export).
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
import transformers
from onnx import numpy_helper
from torch_models import MINILM

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                   "special_tokens_map.json")
ONNX_INPUTS = ["input_ids", "attention_mask", "token_type_ids"]
# A word whose embedding is NaN in the partly broken model (the load's probe avoids it).
POISONED_WORD = "zebra"


def build_cross_encoder(seed: int = 7) -> Any:
    """MiniLM under a one-label classification head: the pooler and classifier drawn from
    `seed`, wide enough that the logits spread over a few units rather than hundredths."""
    torch.manual_seed(seed)
    model = transformers.BertForSequenceClassification.from_pretrained(
        str(MINILM), num_labels=1, local_files_only=True)
    with torch.no_grad():
        model.classifier.weight.normal_(0.0, 0.3)
        model.classifier.bias.fill_(0.25)
    return model.eval()


def save_cross_encoder(folder: Path, model: Any) -> Path:
    """The model's folder (config.json, model.safetensors) with its tokenizer's files."""
    model.save_pretrained(str(folder), safe_serialization=True)
    for name in TOKENIZER_FILES:
        shutil.copy(MINILM / name, folder / name)
    return folder


def broken_everywhere(model: Any) -> Any:
    """The model with a NaN among its head's weights: every logit is NaN."""
    with torch.no_grad():
        model.classifier.weight[0, 0] = float("nan")
    return model


def broken_for_one_word(model: Any, tokenizer: Any) -> Any:
    """The model with POISONED_WORD's embedding NaN: a row with that word answers NaN."""
    token = tokenizer.convert_tokens_to_ids(POISONED_WORD)
    with torch.no_grad():
        model.bert.embeddings.word_embeddings.weight[token] = float("nan")
    return model


class _Logits(torch.nn.Module):
    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask,
                          token_type_ids=token_type_ids).logits


def export_cross_encoder(folder: Path, model: Any) -> Path:
    """`folder/model.onnx` (input_ids, attention_mask, token_type_ids -> logits, dynamic batch
    and sequence), with config.json and the tokenizer's files beside it. The legacy exporter,
    the wrapper in eval mode (see onnx_text_models.export_minilm)."""
    folder.mkdir(parents=True, exist_ok=True)
    model.config.to_json_file(str(folder / "config.json"))
    for name in TOKENIZER_FILES:
        shutil.copy(MINILM / name, folder / name)
    ids = torch.tensor([[101, 7592, 2088, 102, 2088, 102], [101, 7592, 102, 2088, 102, 0]])
    types = torch.tensor([[0, 0, 0, 0, 1, 1], [0, 0, 0, 1, 1, 0]])
    mask = (ids != 0).to(torch.int64)
    axes = {name: {0: "batch", 1: "sequence"} for name in ONNX_INPUTS}
    axes["logits"] = {0: "batch"}
    target = folder / "model.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's notices (onnx_text_models)
        torch.onnx.export(_Logits(model).eval(), (ids, mask, types), str(target),
                          input_names=ONNX_INPUTS, output_names=["logits"], dynamic_axes=axes,
                          opset_version=17, dynamo=False)
    return target


def poison_onnx_head(source: Path, target: Path) -> Path:
    """A copy of an exported graph (and the files beside it) whose classifier weights hold a
    NaN: every logit is NaN."""
    shutil.copytree(source.parent, target.parent, dirs_exist_ok=True)
    graph = onnx.load(str(source))
    weights = next(t for t in graph.graph.initializer if t.name == "model.classifier.weight")
    values = numpy_helper.to_array(weights).copy()
    values[0, 0] = np.nan
    weights.CopyFrom(numpy_helper.from_array(values, weights.name))
    onnx.save(graph, str(target))
    return target
