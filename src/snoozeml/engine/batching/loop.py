"""The batch loop of one replica: a queue, the pure `collect_batch` policy, and the answers.

`submit` is the only way in. The loop asks `collect_batch` what to do whenever the worker is free
or something arrives, runs each batch through the hand-off (engine/batching/handoff.py: on the
replica's worker thread, or inline on the event loop), answers every request with its own rows,
and publishes what happened (`BatchRun`, `QueueFull`, `QueueTimedOut`, `RequestDropped`) instead
of counting it.
Time is the engine's injected `Clock` (engine/clock.py): requests' timestamps and deadlines are
its `now`, and the queue timeout and the wait for company are its timers, so a test moves them.

After a long run the worker asks `collect_batch` itself (`_take`, on the worker thread, under a
lock shared with the loop) and starts the due batch at once while the loop answers the one
before. Why, and what it measured: docs/batching.md, "The hand-off to the worker thread".

Invariants:
- A request is answered exactly once: with its outputs, its own error, or a queue timeout.
- A request that timed out or whose client left is never run.
- The batcher reads its policy; it never changes it. Its owner (engine/replicas/pool.py) does, when
  told that a model's outputs do not follow the batch.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from functools import partial

from snoozeml.engine.batching.handoff import Handoff, Ran
from snoozeml.engine.batching.hooks import BatcherHooks
from snoozeml.engine.batching.policy import Arrays, BatchPolicy, Pending, batch_key, collect_batch
from snoozeml.engine.clock import Clock
from snoozeml.engine.events import BatchRun, EventBus, QueueTimedOut, RequestDropped
from snoozeml.engine.events import (
    QueueFull as QueueFullEvent,
)
from snoozeml.errors import (
    BackendError,
    MemoryExhausted,
    QueueFull,
    QueueTimeout,
    SnoozeError,
    describe_exception,
)
from snoozeml.logs import log_event
from snoozeml.runtime.base import Instance


@dataclass(frozen=True, slots=True)
class Taken:
    """A batch the worker took after a good run, and its run, queued right behind that one."""

    batch: list[Pending]
    started: float  # when the worker took it (the clock's `now`)
    job: Future[Ran]


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
        clock: Clock,
        long_run: float | None = None,  # CPU seconds; None: handoff.py's LONG_RUN
    ) -> None:
        self.model = model
        self.replica = replica
        self.policy = policy  # set by the owner only
        self._events = events
        self._hooks = hooks
        self._clock = clock
        # Bound once: LoopClock's `now` is time.monotonic itself, so reading it per request
        # costs what it did before the clock was injected.
        self._now = clock.now
        self._handoff = Handoff(model, instance, worker, events, hooks.unsplittable,
                                self._waiting, self._take, long_run)
        self._queue: deque[Pending] = deque()
        # The queue, the batches the worker took and `_closed` are shared with the worker thread.
        self._lock = threading.Lock()
        self._taken: deque[Taken] = deque()  # taken by the worker, oldest first, not answered
        self._closed = False
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def runs_inline(self) -> bool:
        """Whether single-row batches currently run on the event loop (see
        engine/batching/inline.py)."""
        return self._handoff.inline.allows(1)

    def _waiting(self) -> bool:
        """Whether requests are queued: the hand-off waits for the worker to begin if so."""
        return bool(self._queue)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        with self._lock:
            self._closed = True  # the worker takes no more batches
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        with self._lock:
            left = [*self._queue, *(p for taken in self._taken for p in taken.batch)]
            self._queue.clear()
            self._taken.clear()
        for pending in left:
            if not pending.future.done():
                pending.future.cancel()

    async def submit(
        self, inputs: Arrays, outputs: Sequence[str] | None, queue_timeout: float | None = None
    ) -> Arrays:
        """Queue one validated request and wait for its own rows of the outputs."""
        if len(self._queue) >= self.policy.max_queue:
            # Timed-out or abandoned requests wait for the loop to drop them; not here.
            with self._lock:
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
        now = self._now()
        future: asyncio.Future[Arrays] = asyncio.get_running_loop().create_future()
        deadline = now + queue_timeout if queue_timeout is not None else None
        pending = Pending(key, rows, inputs, wanted, now, deadline, future)
        with self._lock:
            self._queue.append(pending)
        self._wakeup.set()
        if queue_timeout is None:
            return await future
        # Answer at the deadline even while the worker is busy with an earlier batch. The timer
        # holds the request (inputs, and outputs once answered): cancel it as soon as we're done.
        timer = self._clock.call_later(queue_timeout, partial(self._expire, pending))
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
        while self._taken:  # what the worker went on to after its last run, in order
            taken = self._taken[0]
            try:
                await self._dispatch(taken.batch, taken.started, taken.job)
            except asyncio.CancelledError:
                raise  # stopping: still listed, so stop() cancels what is left unanswered
            except Exception as exc:  # answered with it, then logged by _loop
                self._fail(taken.batch, exc)
                self._taken.popleft()
                raise
            self._taken.popleft()  # deque ends are thread-safe; the worker only appends
        with self._lock:
            now = self._now()
            decision = collect_batch(self._queue, now, self.policy)
            if decision.expired or decision.dropped or decision.batch:
                gone = {id(p) for p in (*decision.expired, *decision.dropped, *decision.batch)}
                self._queue = deque(p for p in self._queue if id(p) not in gone)
            for pending in decision.batch:
                pending.dispatched = True
        for pending in decision.dropped:
            # Futures answered by their timeout timer are done too; only clients that left.
            if pending.future.cancelled():
                self._events.publish(RequestDropped(self.model))
        for pending in decision.expired:
            self._time_out(pending)
        if decision.batch:
            await self._dispatch(decision.batch, now)
            return
        self._wakeup.clear()
        if decision.wait is None:
            await self._wakeup.wait()
            return
        # Woken by an arrival or, once `wait` has passed on the clock, by the clock's timer.
        timer = self._clock.call_later(decision.wait, self._wakeup.set)
        try:
            await self._wakeup.wait()
        finally:
            timer.cancel()

    async def _dispatch(
        self, batch: list[Pending], started: float, job: Future[Ran] | None = None
    ) -> None:
        """Run `batch` (or await `job`, its run the worker already started) and answer it."""
        rows = 0
        waits = []
        requests = []
        for pending in batch:  # one pass: this runs for every batch
            rows += pending.rows
            waits.append(started - pending.enqueued_at)
            requests.append(pending.inputs)
        outputs = batch[0].outputs
        inline = ok = False
        ran = 0.0
        try:
            parts, inline, ran = await self._handoff.run(requests, rows, outputs, job)
            ok = True
        except Exception as exc:
            if not self._hooks.is_out_of_memory(exc):
                self._fail(batch, exc)
                return
            # Reactive protection: make room by evicting idle models, then retry once.
            try:
                await self._hooks.relieve_oom(exc)
                parts, inline, ran = await self._handoff.run(requests, rows, outputs)
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
            # A good run counts its own time: a batch the worker took waited behind the run
            # before it, and its answer may reach the loop after the next one started.
            seconds = ran if ok else self._now() - started
            self._hooks.run_times.record(seconds)
            self._events.publish(BatchRun(self.model, self.replica, rows, tuple(waits),
                                          seconds, inline, ok))
        for pending, part in zip(batch, parts, strict=True):
            if not pending.future.done():
                pending.future.set_result(part)
        if rows > 1:
            self._hooks.batch_ran(self.replica, rows)

    def _take(self) -> None:
        """On the worker thread: take the batch `collect_batch` would dispatch now, if any, and
        submit its run. Expired, dropped, and batches waiting for company are left to the loop."""
        with self._lock:
            if self._closed:
                return
            now = self._now()
            batch = collect_batch(self._queue, now, self.policy).batch
            if not batch:
                return
            try:
                job = self._handoff.submit([p.inputs for p in batch], batch[0].outputs)
            except RuntimeError:  # the executor is shutting down: leave them to the loop
                return
            chosen = {id(p) for p in batch}
            self._queue = deque(p for p in self._queue if id(p) not in chosen)
            for pending in batch:
                pending.dispatched = True
            self._taken.append(Taken(batch, now, job))

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
