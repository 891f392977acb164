"""Transport-neutral inference requests and responses (numpy tensors, OIP datatypes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

Parameters = dict[str, Any]


@dataclass(slots=True)
class InferInput:
    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray
    parameters: Parameters = field(default_factory=dict)


@dataclass(slots=True)
class RequestedOutput:
    name: str
    parameters: Parameters = field(default_factory=dict)
    # The classification extension's k (engine/requests/classification.py): the output comes back as
    # its k best classes; None: as it is.
    classification: int | None = None


@dataclass(slots=True)
class InferRequest:
    inputs: list[InferInput]
    outputs: list[RequestedOutput] | None = None
    id: str | None = None
    parameters: Parameters = field(default_factory=dict)


@dataclass(slots=True)
class InferOutput:
    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray
    parameters: Parameters = field(default_factory=dict)


@dataclass(slots=True)
class InferResponse:
    model_name: str
    model_version: str
    outputs: list[InferOutput]
    id: str | None = None
    parameters: Parameters = field(default_factory=dict)
