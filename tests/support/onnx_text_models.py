"""The real all-MiniLM-L6-v2 (from the offline package, see torch_models.MINILM) exported to
ONNX the way users export Hugging Face encoders, for the tests of ONNX text models.

The export takes seconds, so it is made once per test session (`minilm_onnx`) in the Hub's
layout: `onnx/model.onnx`, with tokenizer.json, config.json and the sentence-transformers files
(modules.json, 1_Pooling/config.json, sentence_bert_config.json) in the folder above it.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from torch_models import MINILM

ONNX_INPUTS = ["input_ids", "attention_mask", "token_type_ids"]
# What sentence-transformers' ONNX exports and optimum give: the encoder's token-level output,
# and here also a pooled one (mean-pooled and normalised inside the graph).
ONNX_OUTPUTS = ["last_hidden_state", "sentence_embedding"]

_exported: dict[str, Path] = {}


class _Encoder(torch.nn.Module):
    """The encoder's hidden states and their mean-pooled, normalised sentence embedding."""

    def __init__(self, encoder: Any) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state
        weights = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
        return hidden, torch.nn.functional.normalize(pooled, p=2, dim=1)


def export_minilm(folder: Path) -> Path:
    """Export MiniLM into `folder` (Hub layout); returns `folder/onnx/model.onnx`.

    The legacy TorchScript exporter (`dynamo=False`): the dynamo one needs onnxscript. The
    wrapper goes to eval mode itself: the exporter restores the module's training flag after
    tracing, and a module left in training mode would put every layer's dropout back on."""
    folder.mkdir(parents=True, exist_ok=True)
    for item in MINILM.iterdir():
        if item.suffix == ".safetensors":
            continue  # the weights go into the graph; without them this is no torch folder
        if item.is_dir():
            shutil.copytree(item, folder / item.name, dirs_exist_ok=True)
        else:
            shutil.copy(item, folder / item.name)
    encoder = transformers.AutoModel.from_pretrained(str(MINILM), local_files_only=True)
    wrapper = _Encoder(encoder).eval()
    # Rows of two lengths, so that padding is part of what is traced.
    ids = torch.tensor([[101, 7592, 2088, 102], [101, 7592, 102, 0]])
    mask = (ids != 0).to(torch.int64)
    target = folder / "onnx" / "model.onnx"
    target.parent.mkdir()
    axes = {name: {0: "batch", 1: "sequence"} for name in ONNX_INPUTS}
    axes["last_hidden_state"] = {0: "batch", 1: "sequence"}
    axes["sentence_embedding"] = {0: "batch"}
    with warnings.catch_warnings():
        # The legacy exporter's deprecation notice and its tracer's warnings about Python
        # branches on shapes, which do not change the graph for these inputs (the tests
        # compare its answers with sentence-transformers' for other lengths and paddings).
        warnings.simplefilter("ignore")
        torch.onnx.export(wrapper, (ids, mask, torch.zeros_like(ids)), str(target),
                          input_names=ONNX_INPUTS, output_names=ONNX_OUTPUTS,
                          dynamic_axes=axes, opset_version=17, dynamo=False)
    return target


def minilm_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`onnx/model.onnx` of the session's one export (made at the first call)."""
    if "minilm" not in _exported:
        _exported["minilm"] = export_minilm(tmp_path_factory.mktemp("minilm-onnx"))
    return _exported["minilm"]
