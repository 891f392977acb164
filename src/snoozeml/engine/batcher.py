"""The batch loop of one replica: a queue, the pure `collect_batch` policy, and the worker thread.

`submit` is the only way in. The loop asks `collect_batch` what to do whenever the worker is free
or something arrives, runs each batch through the instance on the replica's worker thread (or
inline, see engine/inline.py), answers every request with its own rows, and publishes what
happened (`BatchRun`, `QueueFull`, `QueueTimedOut`, `RequestDropped`) instead of counting it.

Invariants:
- A request is answered exactly once: with its outputs, its own error, or a queue timeout.
- A request that timed out or whose client left is never run.
- The batcher reads its policy; it never changes it. Its owner (engine/replicas.py) does, when
  told that a model's outputs do not follow the batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

from snoozeml.engine.batching import Arrays, BatchPolicy, Pending, batch_key, collect_batch
from snoozeml.engine.events import (
    BatchRun,
    EventBus,
    InlineDisabled,
    QueueTimedOut,
    RequestDropped,
)
from snoozeml.engine.events import (
    QueueFull as QueueFullEvent,
)
from snoozeml.engine.inline import InlinePolicy
from snoozeml.errors import (
    BackendError,
    MemoryExhausted,
    QueueFull,
    QueueTimeout,
    SnoozeError,
    describe_exception,
)
from snoozeml.logs import log_event
from snoozeml.runtime.base import Instance, Unsplittable

OomRelief = Callable[[BaseException], Awaitable[object]]


@dataclass(slots=True)
class RunTimes:
    """How long the model's batches have taken, over its whole life (every replica, every
    load): what a full queue's Retry-After estimates from."""

    total: float = 0.0
    count: int = 0

    def record(self, seconds: float) -> None:
        self.total += seconds
        self.count += 1

    def mean(self, default: float = 0.01) -> float:
        return self.total / self.count if self.count else default


@dataclass(frozen=True, slots=True)
class BatcherHooks:
    """What a batcher needs from the replica set that owns it."""

    is_out_of_memory: Callable[[BaseException], bool]
    relieve_oom: OomRelief  # evict idle models after an out-of-memory error
    unsplittable: Callable[[str], None]  # outputs do not follow the batch: stop batching
    run_times: RunTimes  # the model's, shared by its batchers
    batch_ran: Callable[[int, int], None]  # (replica, rows) after a good run of rows > 1


class Batcher:
    def __init__(
        self,
        model: str,
        replica: int,
        instance: Instance,
        worker: Executor,
        policy: BatchPolicy,
        events: EventBus,
        hooks: BatcherHooks,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model = model
        self.replica = replica
        self.policy = policy  # set by the owner only
        self._instance = instance
        self._worker = worker
        self._events = events
        self._hooks = hooks
        self._clock = clock
        self._inline = InlinePolicy()
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
            queued = len(self._queue)
            self._events.publish(QueueFullEvent(self.model, queued))
            raise QueueFull(
                f"model {self.model!r} has {queued} requests queued "
                f"(max_queue {self.policy.max_queue}); retry later",
                retry_after=self._hooks.run_times.mean() * queued,
            )
        wanted = tuple(outputs) if outputs else None
        key, rows = batch_key(inputs, wanted)
        if not self.policy.enabled:
            key = None  # runs alone; its rows still count
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
        self._time_out(pending)
        self._wakeup.set()  # let the loop drop it from the queue

    def _time_out(self, pending: Pending) -> None:
        self._events.publish(QueueTimedOut(self.model))
        pending.future.set_exception(QueueTimeout(
            f"queue timeout: the request waited longer than its timeout for model "
            f"{self.model!r}", retry_after=1.0,
        ))

    async def _loop(self) -> None:
        while True:
            try:
                await self._step()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # boundary of a background task: never die
                log_event("batch_loop_error", logging.ERROR, model=self.model,
                          error=describe_exception(exc))

    async def _step(self) -> None:
        decision = collect_batch(self._queue, self._clock(), self.policy)
        if decision.expired or decision.dropped or decision.batch:
            gone = {id(p) for p in (*decision.expired, *decision.dropped, *decision.batch)}
            self._queue = deque(p for p in self._queue if id(p) not in gone)
        for pending in decision.dropped:
            # Futures answered by their timeout timer are done too; only clients that left.
            if pending.future.cancelled():
                self._events.publish(RequestDropped(self.model))
        for pending in decision.expired:
            self._time_out(pending)
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
        rows = 0
        waits = []
        requests = []
        for pending in batch:  # one pass: this runs for every batch
            rows += pending.rows
            waits.append(started - pending.enqueued_at)
            requests.append(pending.inputs)
        outputs = batch[0].outputs
        inline = ok = False
        try:
            parts, inline = await self._run(requests, rows, outputs)
            ok = True
        except Exception as exc:
            if not self._hooks.is_out_of_memory(exc):
                self._fail(batch, exc)
                return
            # Reactive protection: make room by evicting idle models, then retry once.
            try:
                await self._hooks.relieve_oom(exc)
                parts, inline = await self._run(requests, rows, outputs)
                ok = True
            except Exception as again:
                if self._hooks.is_out_of_memory(again):
                    again = MemoryExhausted(
                        f"model {self.model!r} ran out of memory, and again after idle models "
                        f"were evicted: {again}", retry_after=5.0,
                    )
                self._fail(batch, again)
                return
        finally:
            seconds = self._clock() - started
            self._hooks.run_times.record(seconds)
            self._events.publish(BatchRun(self.model, self.replica, rows, tuple(waits),
                                          seconds, inline, ok))
        for pending, part in zip(batch, parts, strict=True):
            if not pending.future.done():
                pending.future.set_result(part)
        if rows > 1:
            self._hooks.batch_ran(self.replica, rows)

    async def _run(
        self, requests: list[Arrays], rows: int, outputs: Sequence[str] | None
    ) -> tuple[list[Arrays], bool]:
        """Each request's outputs, and whether the run was inline."""
        instance = self._instance
        try:
            if self._inline.allows(rows):
                started = time.perf_counter()
                try:
                    return instance.run_batch_blocking(requests, outputs), True
                finally:
                    if self._inline.observe_inline(time.perf_counter() - started, rows):
                        self._events.publish(InlineDisabled(
                            self.model, "a run on the event loop took over "
                            f"{self._inline.abort_run * 1000:g} ms"))
            parts, seconds = await asyncio.get_running_loop().run_in_executor(
                self._worker, _timed, instance, requests, outputs
            )
            self._inline.observe(seconds, rows)
            return parts, False
        except Unsplittable:
            self._hooks.unsplittable(
                "an output's first dimension does not follow the batch's rows; "
                "running requests alone"
            )
            loop = asyncio.get_running_loop()
            return [
                await loop.run_in_executor(self._worker, instance.run_blocking, inputs, outputs)
                for inputs in requests
            ], False

    def _fail(self, batch: Iterable[Pending], exc: BaseException) -> None:
        for pending in batch:
            if not pending.future.done():
                pending.future.set_exception(self._as_domain_error(exc))

    def _as_domain_error(self, exc: BaseException) -> BaseException:
        if isinstance(exc, SnoozeError):
            return exc
        error = BackendError(f"model {self.model!r} failed to run: {describe_exception(exc)}")
        error.__cause__ = exc
        return error


def _timed(
    instance: Instance, requests: Sequence[Arrays], outputs: Sequence[str] | None
) -> tuple[list[Arrays], float]:
    started = time.perf_counter()
    parts = instance.run_batch_blocking(requests, outputs)
    return parts, time.perf_counter() - started
