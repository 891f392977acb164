"""Dynamic micro-batching, the pure part: what goes into the next batch (`collect_batch`), which
requests may share one (`batch_key`), and whether a model can be batched at all.

Semantics follow Triton's dynamic batcher. The loop asks `collect_batch` what to do whenever the
worker is free or something arrives: a batch is dispatched when it is full, when its oldest
request has waited `max_delay`, or at once when `max_delay` is 0. While the worker runs a batch,
new requests queue up, so under load batches grow by themselves. Only requests with the same
batch key (input names, datatypes, trailing dimensions, requested outputs) share a batch; the
oldest request always decides which group goes next, so no group starves. The loop around it
is engine/batching/loop.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from snoozeml.datatypes import ModelMetadata

Arrays = dict[str, np.ndarray]
BatchKey = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class BatchPolicy:
    max_batch_size: int = 32  # rows; 0 or 1 disables batching
    max_delay: float = 0.0  # seconds the oldest request may wait for company
    max_queue: int = 1024  # requests waiting; beyond it QueueFull

    @property
    def enabled(self) -> bool:
        return self.max_batch_size > 1


@dataclass(eq=False, slots=True)
class Pending:
    """One queued request. `key` is None for a request that must run alone."""

    key: BatchKey | None
    rows: int
    inputs: Arrays
    outputs: tuple[str, ...] | None
    enqueued_at: float
    deadline: float | None
    future: asyncio.Future[Arrays]
    dispatched: bool = False

    @property
    def abandoned(self) -> bool:
        return self.future.done()


@dataclass(frozen=True, slots=True)
class Decision:
    batch: list[Pending]  # run these now, in this order (empty: nothing to run yet)
    expired: list[Pending]  # answer these with a queue timeout; never run them
    dropped: list[Pending]  # already answered or abandoned by their client
    wait: float | None  # when `batch` is empty: seconds until something is due; None = idle


def batch_key(inputs: Arrays, outputs: tuple[str, ...] | None) -> tuple[BatchKey | None, int]:
    """The key requests must share to be batched, and the request's row count.

    A request whose inputs disagree on their first dimension, or have no first dimension, gets
    key None and runs alone.
    """
    rows = -1
    parts = []
    for name in sorted(inputs):
        array = inputs[name]
        if array.ndim == 0 or (rows >= 0 and array.shape[0] != rows):
            return None, max(rows, 1)
        rows = array.shape[0]
        parts.append((name, array.dtype.str, array.shape[1:]))
    return (tuple(parts), outputs), max(rows, 0)


# A batch holding a request with a deadline is dispatched this long before that deadline
# instead of waiting out max_delay for company.
DEADLINE_MARGIN = 0.0005


def collect_batch(queue: Sequence[Pending], now: float, policy: BatchPolicy) -> Decision:
    """What to do next with `queue` (oldest first) at time `now`. Pure."""
    expired: list[Pending] = []
    dropped: list[Pending] = []
    live: list[Pending] = []
    for pending in queue:
        if pending.abandoned:
            dropped.append(pending)
        elif pending.deadline is not None and pending.deadline <= now:
            expired.append(pending)
        else:
            live.append(pending)
    if not live:
        return Decision([], expired, dropped, None)
    oldest = live[0]
    if not policy.enabled or oldest.key is None or oldest.rows >= policy.max_batch_size:
        return Decision([oldest], expired, dropped, None)
    batch = [oldest]
    rows = oldest.rows
    full = False
    for pending in live[1:]:
        if pending.key != oldest.key:
            continue
        if rows + pending.rows > policy.max_batch_size:
            full = True
            break
        batch.append(pending)
        rows += pending.rows
        if rows == policy.max_batch_size:
            full = True
            break
    waited = now - oldest.enqueued_at
    # Waiting for company must not make a member time out: its deadline dispatches early.
    due = min((p.deadline for p in batch if p.deadline is not None), default=None)
    urgent = due is not None and due - now <= DEADLINE_MARGIN
    if full or policy.max_delay <= 0 or waited >= policy.max_delay or urgent:
        return Decision(batch, expired, dropped, None)
    wait = policy.max_delay - waited
    if due is not None:
        wait = min(wait, due - now - DEADLINE_MARGIN)
    deadlines = [p.deadline - now for p in live if p.deadline is not None]
    if deadlines:
        wait = min(wait, *deadlines)
    return Decision([], expired, dropped, max(wait, 0.0))


def batching_blocker(metadata: ModelMetadata) -> str | None:
    """Why this model cannot be batched, or None if it can: every input and output needs a
    dynamic first dimension, or outputs could not be split back."""
    for kind, specs in (("input", metadata.inputs), ("output", metadata.outputs)):
        for spec in specs:
            if not spec.shape:
                return f"{kind} {spec.name!r} is a scalar"
            if spec.shape[0] >= 0:
                return f"{kind} {spec.name!r} has a fixed first dimension ({spec.shape[0]})"
    return None
