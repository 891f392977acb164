"""Batching by stacking: several requests' rows as one tensor per input along axis 0, one run,
and each request's rows of every output back. For backends whose models treat axis 0 as the
batch and need nothing else (no padding, no tokenizing).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from snoozeml.runtime.base import Arrays, Unsplittable

RunBlocking = Callable[[Arrays, Sequence[str] | None], Arrays]


def merge_inputs(batch: Sequence[Arrays]) -> Arrays:
    """One contiguous tensor per input, the requests' rows stacked along axis 0 in order.
    A batch of one is returned as it is, without a copy."""
    if len(batch) == 1:
        return batch[0]
    return {name: stack_rows([inputs[name] for inputs in batch]) for name in batch[0]}


def stack_rows(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """`np.concatenate(arrays)` along axis 0, copied without letting go of the GIL.

    numpy lets go of the GIL for each copy of over 500 elements: stacking 30 one-row requests of
    512 floats gives it up 30 times, and a worker thread that gives it up waits for the event
    loop to give it back, up to a switch interval (5 ms) while the loop is busy. Joining the
    rows' bytes copies them in one call that keeps the GIL (CPython's join lets go of it only
    past 1 MiB). Strings, non-native byte orders, and rows that are not contiguous alike, go
    through numpy."""
    first = arrays[0]
    dtype, tail = first.dtype, first.shape[1:]
    if dtype.hasobject or not dtype.isnative or first.ndim == 0 or any(
        a.dtype != dtype or a.ndim != first.ndim or a.shape[1:] != tail
        or not a.flags.c_contiguous for a in arrays
    ):  # numpy promotes, or refuses (a scalar among rows), as before
        return np.concatenate(arrays)
    try:
        joined = bytearray().join(arrays)  # type: ignore[arg-type]  # numpy arrays are buffers
        return np.frombuffer(joined, dtype).reshape(sum(a.shape[0] for a in arrays), *tail)
    except (BufferError, TypeError, ValueError):  # no buffer format (datetimes), zero itemsize
        return np.concatenate(arrays)


def split_outputs(outputs: Arrays, rows: Sequence[int]) -> list[Arrays]:
    """Each request's rows of every output (views, not copies). Raises Unsplittable if an
    output's first dimension is not the batch's row count. A single request owns every output
    whatever its shape."""
    if len(rows) == 1:
        return [outputs]
    total = sum(rows)
    for name, value in outputs.items():
        if value.ndim == 0 or value.shape[0] != total:
            raise Unsplittable(f"output {name!r} has shape {list(value.shape)}; a batch of "
                               f"{total} rows needs {total} as its first dimension")
    parts: list[Arrays] = []
    start = 0
    for count in rows:
        parts.append({name: value[start:start + count] for name, value in outputs.items()})
        start += count
    return parts


def run_stacked_blocking(
    run: RunBlocking, requests: Sequence[Arrays], outputs: Sequence[str] | None
) -> list[Arrays]:
    """Merge `requests`, run them once through `run`, and split the outputs back by each
    request's row count. A single request runs as it is (the common case at low load)."""
    if len(requests) == 1:
        return [run(requests[0], outputs)]
    rows = [_rows(inputs) for inputs in requests]
    return split_outputs(run(merge_inputs(requests), outputs), rows)


def _rows(inputs: Arrays) -> int:
    """A request's row count: the first dimension its inputs share (0 with no inputs)."""
    for name, array in inputs.items():
        if array.ndim == 0:
            raise Unsplittable(f"input {name!r} is a scalar, which has no rows to stack")
        return int(array.shape[0])
    return 0
