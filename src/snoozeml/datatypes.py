"""Tensor datatypes: Open Inference Protocol names, numpy dtypes and ONNX type strings."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# OIP datatype -> numpy dtype. BYTES is an object array of `bytes`; BF16 has no numpy dtype
# and is carried as raw uint16 words.
OIP_TO_NUMPY: dict[str, np.dtype[np.generic]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BF16": np.dtype(np.uint16),
    "BYTES": np.dtype(np.object_),
}

# onnxruntime's type strings (NodeArg.type) -> OIP datatype.
ONNX_TO_OIP: dict[str, str] = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(bfloat16)": "BF16",
    "tensor(string)": "BYTES",
}


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One input or output of a model. -1 in `shape` is a dynamic dimension. `labels` names an
    output's classes by index, for the classification extension (runtime/labels.py)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    optional: bool = False
    labels: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    """What the model's session says about itself (and, once served, its `versions`).

    `input_sets`, when given, lists the alternative sets of inputs a request may send (e.g.
    `text` or `input_ids` + `attention_mask`); otherwise every non-optional input is required.
    """

    name: str
    platform: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    input_sets: tuple[tuple[str, ...], ...] = ()
    versions: tuple[str, ...] = ()  # filled by the engine: the repository's, not the file's

    def input(self, name: str) -> TensorSpec | None:
        return next((spec for spec in self.inputs if spec.name == name), None)

    def output(self, name: str) -> TensorSpec | None:
        return next((spec for spec in self.outputs if spec.name == name), None)
