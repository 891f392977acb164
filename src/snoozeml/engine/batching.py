"""Dynamic micro-batching: a pure `collect_batch` policy inside a small per-replica loop.

Semantics follow Triton's dynamic batcher. The loop asks `collect_batch` what to do whenever the
worker is free or something arrives: a batch is dispatched when it is full, when its oldest
request has waited `max_delay`, or at once when `max_delay` is 0. While the worker runs a batch,
new requests queue up, so under load batches grow by themselves. Only requests with the same
batch key (input names, datatypes, trailing dimensions, requested outputs) share a batch; the
oldest request always decides which group goes next, so no group starves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from snoozeml.datatypes import ModelMetadata
from snoozeml.engine.inline import InlinePolicy
from snoozeml.errors import MemoryExhausted, QueueFull, QueueTimeout
from snoozeml.logs import log_event
from snoozeml.runtime.base import is_out_of_memory

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


def merge_inputs(batch: Sequence[Arrays]) -> Arrays:
    """One contiguous tensor per input, the requests' rows stacked along axis 0 in order."""
    if len(batch) == 1:
        return batch[0]
    return {name: np.concatenate([inputs[name] for inputs in batch]) for name in batch[0]}


def split_outputs(outputs: Arrays, rows: Sequence[int]) -> list[Arrays] | None:
    """Each request's rows of every output, or None if an output's first dimension is not the
    batch's row count (the model does not treat axis 0 as a batch)."""
    if len(rows) == 1:
        return [outputs]
    total = sum(rows)
    if any(value.ndim == 0 or value.shape[0] != total for value in outputs.values()):
        return None
    parts: list[Arrays] = []
    start = 0
    for count in rows:
        parts.append({name: value[start:start + count] for name, value in outputs.items()})
        start += count
    return parts


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


@dataclass(slots=True)
class BatchStats:
    """Counters for one model, shared by its replicas; read by /admin/status and metrics."""

    batches: int = 0
    requests: int = 0
    rows: int = 0
    queue_wait_s: float = 0.0
    run_s: float = 0.0
    queue_timeouts: int = 0
    queue_full: int = 0
    dropped: int = 0
    largest_batch: int = 0
    history: deque[int] = field(default_factory=lambda: deque(maxlen=256))

    def snapshot(self) -> dict[str, Any]:
        return {
            "batches": self.batches,
            "requests": self.requests,
            "rows": self.rows,
            "mean_requests_per_batch": _ratio(self.requests, self.batches),
            "mean_rows_per_batch": _ratio(self.rows, self.batches),
            "largest_batch": self.largest_batch,
            "mean_queue_wait_ms": _ratio(self.queue_wait_s * 1000, self.requests),
            "mean_run_ms": _ratio(self.run_s * 1000, self.batches),
            "queue_timeouts": self.queue_timeouts,
            "queue_full": self.queue_full,
            "dropped": self.dropped,
        }


def _ratio(a: float, b: int) -> float | None:
    return round(a / b, 3) if b else None


RunBlocking = Callable[[Arrays, Sequence[str] | None], Arrays]
RunManyBlocking = Callable[[Sequence[Arrays], Sequence[str] | None], list[Arrays]]
OomHook = Callable[[], Awaitable[object]]


class _Unsplittable(Exception):
    pass


def run_batch_blocking(
    run: RunBlocking,
    run_many: RunManyBlocking | None,
    batch: Sequence[Pending],
    outputs: Sequence[str] | None,
) -> list[Arrays]:
    """Merge, run once, split — or let a backend that batches itself (tokenizing text,
    trimming padding) do all three. Runs on the replica's worker thread."""
    if run_many is not None:
        return run_many([p.inputs for p in batch], outputs)
    merged = merge_inputs([p.inputs for p in batch])
    results = run(merged, outputs)
    parts = split_outputs(results, [p.rows for p in batch])
    if parts is None:
        raise _Unsplittable
    return parts


def _timed(
    run: RunBlocking,
    run_many: RunManyBlocking | None,
    batch: Sequence[Pending],
    outputs: Sequence[str] | None,
) -> tuple[list[Arrays], float]:
    started = time.perf_counter()
    parts = run_batch_blocking(run, run_many, batch, outputs)
    return parts, time.perf_counter() - started


class Batcher:
    """The queue and batch loop of one replica. `submit` is the only entry for requests."""

    def __init__(
        self,
        model: str,
        run: RunBlocking,
        worker: Executor,
        policy: BatchPolicy,
        stats: BatchStats,
        clock: Callable[[], float] = time.monotonic,
        on_oom: OomHook | None = None,
        run_many: RunManyBlocking | None = None,
    ) -> None:
        self.model = model
        self._on_oom = on_oom
        self._run_many = run_many
        self._inline = InlinePolicy()
        self.policy = policy
        self.stats = stats
        self._run = run
        self._worker = worker
        self._clock = clock
        self._queue: deque[Pending] = deque()
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def runs_inline(self) -> bool:
        """Whether single-row batches currently run on the event loop (see engine/inline.py)."""
        return self._inline.allows(1)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        for pending in self._queue:
            if not pending.future.done():
                pending.future.cancel()
        self._queue.clear()

    async def submit(
        self, inputs: Arrays, outputs: Sequence[str] | None, queue_timeout: float | None = None
    ) -> Arrays:
        """Queue one validated request and wait for its own rows of the outputs."""
        if len(self._queue) >= self.policy.max_queue:
            # Timed-out or abandoned requests wait for the loop to drop them; not here.
            self._queue = deque(p for p in self._queue if not p.future.done())
        if len(self._queue) >= self.policy.max_queue:
            self.stats.queue_full += 1
            mean_run = self.stats.run_s / self.stats.batches if self.stats.batches else 0.01
            raise QueueFull(
                f"model {self.model!r} has {len(self._queue)} requests queued "
                f"(max_queue {self.policy.max_queue}); retry later",
                retry_after=mean_run * len(self._queue),
            )
        wanted = tuple(outputs) if outputs else None
        key, rows = batch_key(inputs, wanted)
        if not self.policy.enabled:
            key = None  # runs alone; its rows still count in the stats
        now = self._clock()
        future: asyncio.Future[Arrays] = asyncio.get_running_loop().create_future()
        deadline = now + queue_timeout if queue_timeout is not None else None
        pending = Pending(key, rows, inputs, wanted, now, deadline, future)
        self._queue.append(pending)
        self._wakeup.set()
        if queue_timeout is None:
            return await future
        # Answer at the deadline even while the worker is busy with an earlier batch. The timer
        # holds the request (inputs, and outputs once answered): cancel it as soon as we're done.
        timer = asyncio.get_running_loop().call_later(queue_timeout, self._expire, pending)
        try:
            return await future
        finally:
            timer.cancel()

    def _expire(self, pending: Pending) -> None:
        if pending.dispatched or pending.future.done():
            return
        self.stats.queue_timeouts += 1
        pending.future.set_exception(self._timeout_error())
        self._wakeup.set()  # let the loop drop it from the queue

    def _timeout_error(self) -> QueueTimeout:
        return QueueTimeout(
            f"queue timeout: the request waited longer than its timeout for model "
            f"{self.model!r}", retry_after=1.0,
        )

    async def _loop(self) -> None:
        while True:
            try:
                await self._step()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # boundary of a background task: never die
                log_event("batch_loop_error", logging.ERROR, model=self.model, error=repr(exc))

    async def _step(self) -> None:
        decision = collect_batch(self._queue, self._clock(), self.policy)
        if decision.expired or decision.dropped or decision.batch:
            gone = {id(p) for p in (*decision.expired, *decision.dropped, *decision.batch)}
            self._queue = deque(p for p in self._queue if id(p) not in gone)
        # Futures answered by their timeout timer are done too; count only clients that left.
        self.stats.dropped += sum(1 for p in decision.dropped if p.future.cancelled())
        for pending in decision.expired:
            self.stats.queue_timeouts += 1
            pending.future.set_exception(self._timeout_error())
        for pending in decision.batch:
            pending.dispatched = True
        if decision.batch:
            await self._dispatch(decision.batch)
            return
        self._wakeup.clear()
        if decision.wait is None:
            await self._wakeup.wait()
        else:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), decision.wait)

    async def _dispatch(self, batch: list[Pending]) -> None:
        started = self._clock()
        try:
            parts = await self._run_batch(batch)
        except Exception as exc:
            if self._on_oom is None or not is_out_of_memory(exc):
                self._fail(batch, exc)
                return
            # Reactive protection: make room by evicting idle models, then retry once.
            try:
                await self._on_oom()
                parts = await self._run_batch(batch)
            except Exception as again:
                if is_out_of_memory(again):
                    again = MemoryExhausted(
                        f"model {self.model!r} ran out of memory, and again after idle models "
                        f"were evicted: {again}", retry_after=5.0,
                    )
                self._fail(batch, again)
                return
        finally:
            self._record(batch, started)
        for pending, part in zip(batch, parts, strict=True):
            if not pending.future.done():
                pending.future.set_result(part)

    async def _run_batch(self, batch: list[Pending]) -> list[Arrays]:
        loop = asyncio.get_running_loop()
        outputs = batch[0].outputs
        rows = sum(p.rows for p in batch)
        try:
            if self._inline.allows(rows):
                started = time.perf_counter()
                try:
                    return run_batch_blocking(self._run, self._run_many, batch, outputs)
                finally:
                    if self._inline.observe_inline(time.perf_counter() - started, rows):
                        log_event("inline_disabled", logging.INFO, model=self.model,
                                  reason="a run on the event loop took over "
                                  f"{self._inline.abort_run * 1000:g} ms")
            parts, seconds = await loop.run_in_executor(
                self._worker, _timed, self._run, self._run_many, batch, outputs
            )
            self._inline.observe(seconds, rows)
            return parts
        except _Unsplittable:
            self._disable(
                "an output's first dimension does not follow the batch's rows; "
                "running requests alone"
            )
            return [
                await loop.run_in_executor(self._worker, self._run, p.inputs, outputs)
                for p in batch
            ]

    @staticmethod
    def _fail(batch: Iterable[Pending], exc: BaseException) -> None:
        for pending in batch:
            if not pending.future.done():
                pending.future.set_exception(exc)

    def _record(self, batch: Iterable[Pending], started: float) -> None:
        stats = self.stats
        requests = rows = 0
        for pending in batch:
            requests += 1
            rows += pending.rows
            stats.queue_wait_s += started - pending.enqueued_at
        stats.batches += 1
        stats.requests += requests
        stats.rows += rows
        stats.largest_batch = max(stats.largest_batch, requests)
        stats.history.append(requests)
        stats.run_s += self._clock() - started

    def _disable(self, reason: str) -> None:
        if self.policy.enabled:
            self.policy = BatchPolicy(0, self.policy.max_delay, self.policy.max_queue)
            log_event("batching_disabled", logging.WARNING, model=self.model, reason=reason)
