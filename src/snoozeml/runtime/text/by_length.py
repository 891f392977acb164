"""A batch of text rows in runs by length: sorted by token count, cut under a token budget.

A batch that the engine forms takes rows as they arrive, so one padded run pads every row to
the batch's longest: with sentences of 13 to 46 tokens, half the tokens a run computes are
padding. Here the rows of a tokenized batch (texts or pairs, padded on the right) are sorted
by their token counts and cut into runs whose padded tokens (rows times the longest row of the run)
stay within `max_batch_tokens`, as Text Embeddings Inference bounds its batches; each run is
trimmed to its own longest row, and the outputs go back into the batch's row order, so each
request's answer is what it would be alone (to float rounding, as any batching gives).

A batch that fits the budget whole runs as it is, unsorted. Outputs with a token axis
(`last_hidden_state`) are not sorted: the caller runs the batch whole when one is wanted, so
the padding positions a request gets back are the ones it would get alone.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from snoozeml.runtime.base import Arrays

# Padded tokens per run when the entry leaves `max_batch_tokens` out: on a CPU, runs of a few
# dozen rows of sorted sentences cost less per token than fewer, wider ones padded to the
# longest (bench/results.md, issue 32); on a GPU wider runs fill the device, as TEI's 16,384.
CPU_MAX_BATCH_TOKENS = 512
GPU_MAX_BATCH_TOKENS = 16384


def default_budget(device: str) -> int:
    """`max_batch_tokens` for a model on `device` ("cpu", "cuda", "cuda:1") when unset."""
    return GPU_MAX_BATCH_TOKENS if device.startswith("cuda") else CPU_MAX_BATCH_TOKENS


def runs_by_length(counts: np.ndarray, budget: int) -> list[np.ndarray]:
    """Row indices, shortest first (ties in row order), cut into runs whose rows times longest
    stays within `budget`; a row longer than the budget runs alone."""
    order = np.argsort(counts, kind="stable")
    runs: list[np.ndarray] = []
    start = 0
    for end in range(1, len(order) + 1):
        if end == len(order) or (end - start + 1) * max(int(counts[order[end]]), 1) > budget:
            runs.append(order[start:end])
            start = end
    return runs


def run_by_length(feeds: Arrays, counts: np.ndarray, budget: int | None,
                  run: Callable[[Arrays], Arrays]) -> Arrays:
    """`run` over the token `feeds` ([rows, width] each, padded on the right; `counts` the real
    tokens of each row): whole when `budget` is None or the batch fits it, else in runs by
    length, each trimmed to its longest row. The outputs, each [rows, ...] with no token axis,
    come back in the feeds' row order."""
    rows = int(counts.shape[0])
    width = int(next(iter(feeds.values())).shape[1]) if feeds else 0
    if budget is None or rows < 2 or rows * width <= budget:
        return run(feeds)
    results: Arrays = {}
    for indices in runs_by_length(counts, budget):
        longest = max(int(counts[indices].max()), 1)
        part = run({name: np.ascontiguousarray(value[indices, :longest])
                    for name, value in feeds.items()})
        for name, value in part.items():
            if name not in results:
                results[name] = np.empty((rows, *value.shape[1:]), dtype=value.dtype)
            results[name][indices] = value
    return results
