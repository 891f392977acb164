"""ONNX exports of the torch scenarios' models, for ``--snooze-format onnx`` (and infinity's
``--engine optimum``): MiniLM in the Hub's layout (as tests/support/onnx_text_models.py
export_minilm makes it) and a cross-encoder folder's graph (as
tests/support/cross_encoder_models.py export_cross_encoder makes it).

Exports are cached under ``/tmp/snooze-bench-onnx``, keyed by a digest of the weights and of the
torch and transformers versions, so reruns don't export again. ``infinity_copy`` gives infinity
its own hard-linked copy of a folder, the graph at its top (what its optimum engine can load).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from scenarios.minilm import MINILM

CACHE = Path(tempfile.gettempdir()) / "snooze-bench-onnx"
ONNX_INPUTS = ["input_ids", "attention_mask", "token_type_ids"]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                   "special_tokens_map.json")
EXPORT_VERSION = "1"  # bumped when an export below changes


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


class _Logits(torch.nn.Module):
    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor) -> Any:
        return self.model(input_ids=input_ids, attention_mask=attention_mask,
                          token_type_ids=token_type_ids).logits


def _digest(*files: Path) -> str:
    import transformers

    digest = hashlib.sha256(f"{EXPORT_VERSION} {torch.__version__} "
                            f"{transformers.__version__}".encode())
    for path in files:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _cached(name: str, key: str, make: Callable[[Path], None]) -> Path:
    """``CACHE/name-key``, made by ``make`` into a scratch folder then renamed into place."""
    target = CACHE / f"{name}-{key}"
    if target.exists():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=CACHE))
    try:
        make(scratch)
        scratch.rename(target)
    except OSError:
        if not target.exists():
            raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def _export(module: torch.nn.Module, ids: torch.Tensor, types: torch.Tensor, target: Path,
            outputs: list[str], axes: dict[str, dict[int, str]]) -> None:
    """The legacy (TorchScript) exporter, opset 17, the wrapper in eval mode."""
    mask = (ids != 0).to(torch.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's notices, the tracer's branches
        torch.onnx.export(module.eval(), (ids, mask, types), str(target),
                          input_names=ONNX_INPUTS, output_names=outputs, dynamic_axes=axes,
                          opset_version=17, dynamo=False)


def minilm_onnx() -> Path:
    """MiniLM's export in the Hub's layout: ``onnx/model.onnx`` (token inputs ->
    ``last_hidden_state``, ``sentence_embedding``), every other file of the folder (tokenizer,
    config.json, modules.json, 1_Pooling) beside ``onnx/``; returns the graph's path."""
    import transformers

    def make(folder: Path) -> None:
        for item in MINILM.iterdir():
            if item.suffix == ".safetensors":
                continue  # the weights go into the graph
            if item.is_dir():
                shutil.copytree(item, folder / item.name, dirs_exist_ok=True)
            else:
                shutil.copy(item, folder / item.name)
        encoder = transformers.AutoModel.from_pretrained(str(MINILM), local_files_only=True)
        ids = torch.tensor([[101, 7592, 2088, 102], [101, 7592, 102, 0]])
        axes = {name: {0: "batch", 1: "sequence"} for name in ONNX_INPUTS}
        axes["last_hidden_state"] = {0: "batch", 1: "sequence"}
        axes["sentence_embedding"] = {0: "batch"}
        (folder / "onnx").mkdir()
        _export(_Encoder(encoder), ids, torch.zeros_like(ids), folder / "onnx" / "model.onnx",
                ["last_hidden_state", "sentence_embedding"], axes)

    key = _digest(*sorted(MINILM.glob("*.safetensors")))
    return _cached("minilm", key, make) / "onnx" / "model.onnx"


def cross_encoder_onnx(source: Path) -> Path:
    """The cross-encoder folder ``source``'s export: ``model.onnx`` (input_ids, attention_mask,
    token_type_ids -> logits, dynamic batch and sequence) with config.json and the tokenizer's
    files beside it; returns the graph's path."""
    import transformers

    def make(folder: Path) -> None:
        model = transformers.BertForSequenceClassification.from_pretrained(
            str(source), local_files_only=True)
        model.config.to_json_file(str(folder / "config.json"))
        for name in TOKENIZER_FILES:
            shutil.copy(source / name, folder / name)
        ids = torch.tensor([[101, 7592, 2088, 102, 2088, 102], [101, 7592, 102, 2088, 102, 0]])
        types = torch.tensor([[0, 0, 0, 0, 1, 1], [0, 0, 0, 1, 1, 0]])
        axes = {name: {0: "batch", 1: "sequence"} for name in ONNX_INPUTS}
        axes["logits"] = {0: "batch"}
        _export(_Logits(model), ids, types, folder / "model.onnx", ["logits"], axes)

    key = _digest(source / "model.safetensors", source / "config.json")
    return _cached("cross-encoder", key, make) / "model.onnx"


def infinity_copy(graph: Path, folder: Path) -> Path:
    """A hard-linked copy of ``folder`` (``folder`` + ``-infinity``, made once) with ``graph``
    (inside it) as ``model.onnx`` at its top and no other graph: the layout infinity's optimum
    engine can load from a local folder (see embeddings/infinity.py)."""
    target = folder.with_name(folder.name + "-infinity")
    if not target.exists():
        scratch = Path(tempfile.mkdtemp(prefix="infinity-", dir=folder.parent))
        shutil.copytree(folder, scratch / "copy", copy_function=os.link,
                        ignore=shutil.ignore_patterns("*.onnx"))
        os.link(graph, scratch / "copy" / "model.onnx")
        try:
            (scratch / "copy").rename(target)
        except OSError:
            if not target.exists():
                raise
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return target
