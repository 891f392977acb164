"""Triton's classification extension: a requested output's k best classes, as BYTES.

A requested output with the parameter `classification: k` comes back as strings
`"score:index:label"` (`"score:index"` where the class has no label) for its k highest scores,
best first, instead of its numbers. As in Triton (docs/protocol/extension_classification.md):

- a score prints as C++'s `std::to_string` prints it: `"%f"` for the float types
  (`0.984375`), the number itself for the integer types (`7`);
- an output of shape [N, C...] gives [N, k], each row's classes being its C... elements in
  row-major order; a [C] output (no batch dimension) gives [k];
- k larger than the number of classes gives every class.

Where Triton leaves it open, SnoozeML decides: equal scores keep the lower index first, NaN
ranks last, FP16 and BF16 scores are classified like the other floats (Triton refuses them).

Pure: the engine applies `classified` to each request's own outputs after the run, so that
requests asking for different k (or none) still share a batch. The labels are the output's
own, from its TensorSpec (runtime/labels.py finds them when the model loads).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from snoozeml.datatypes import ModelMetadata
from snoozeml.engine.requests.request import InferOutput, RequestedOutput
from snoozeml.errors import InvalidInput

PARAMETER = "classification"
# What has scores to rank: every datatype but BOOL and BYTES.
NUMERIC = frozenset({"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
                     "FP16", "FP32", "FP64", "BF16"})


def class_count(value: object, output: str) -> int:
    """The extension's k, as a transport decoded it (JSON, or an InferParameter's value):
    an integer of at least 1, else the request's 400."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInput(f"output {output!r}: parameter {PARAMETER!r} must be an integer of "
                           f"at least 1 (how many classes to return), got {value!r}")
    return value


def check_classifiable(output: str, datatype: str) -> None:
    """Only numbers can be ranked: classification on any other output is the request's 400."""
    if datatype not in NUMERIC:
        raise InvalidInput(f"output {output!r} is {datatype}: the classification extension "
                           "ranks numeric outputs only")


def top_classes(scores: np.ndarray, datatype: str, k: int,
                labels: Sequence[str] = ()) -> np.ndarray:
    """The BYTES tensor (an object array of bytes) of each row's k best classes."""
    values = _numbers(scores, datatype)
    batched = values.ndim >= 2
    rows = values.shape[0] if batched else 1
    shape: tuple[int, ...] = (rows,) if batched else ()
    classes = math.prod(values.shape[1:]) if batched else values.size
    table = values.reshape(rows, classes)
    keep = min(k, classes)
    order = _best_first(table)[:, :keep]
    picked = np.take_along_axis(table, order, axis=1).tolist()
    fmt = _float_text if table.dtype.kind == "f" else _int_text
    texts = [
        _class_text(fmt(score), index, labels)
        for row_scores, row_order in zip(picked, order.tolist(), strict=True)
        for score, index in zip(row_scores, row_order, strict=True)
    ]
    result = np.empty(rows * keep, dtype=object)
    result[:] = texts
    return result.reshape((*shape, keep))


def classified(
    requested: Sequence[RequestedOutput] | None,
    outputs: list[InferOutput],
    metadata: ModelMetadata,
) -> list[InferOutput]:
    """`outputs` with each one the request asked to classify replaced by its BYTES classes
    (labelled from the model's metadata); the others as they are."""
    wanted = {out.name: out.classification for out in requested or ()
              if out.classification is not None}
    if not wanted:
        return outputs
    result = []
    for output in outputs:
        k = wanted.get(output.name)
        if k is None:
            result.append(output)
            continue
        spec = metadata.output(output.name)
        data = top_classes(output.data, output.datatype, k, spec.labels if spec else ())
        result.append(InferOutput(output.name, "BYTES", tuple(data.shape), data,
                                  output.parameters))
    return result


# --- helpers ------------------------------------------------------------------------------


def _numbers(scores: np.ndarray, datatype: str) -> np.ndarray:
    """The scores as numpy numbers: BF16 travels as its 16-bit words, the upper half of a
    float32."""
    if datatype == "BF16":
        return (scores.astype(np.uint32) << 16).view(np.float32)
    return scores


def _best_first(table: np.ndarray) -> np.ndarray:
    """Each row's indices by descending score; equal scores keep the lower index first."""
    if table.dtype.kind == "f":
        # Negating is exact for floats, and the stable sort puts NaN last.
        return np.argsort(-table, axis=1, kind="stable")
    # Integers may not negate (unsigned, the most negative): sort the reversed row ascending,
    # stably, and read it backwards; ties then come out lower index first.
    backwards = np.argsort(table[:, ::-1], axis=1, kind="stable")[:, ::-1]
    order: np.ndarray = table.shape[1] - 1 - backwards
    return order


def _float_text(score: float) -> str:
    return "%f" % score  # noqa: UP031 - printf's %f is the format std::to_string(float) uses


def _int_text(score: int) -> str:
    return str(score)


def _class_text(score: str, index: int, labels: Sequence[str]) -> bytes:
    label = labels[index] if index < len(labels) else ""
    text = f"{score}:{index}:{label}" if label else f"{score}:{index}"
    return text.encode("utf-8")
