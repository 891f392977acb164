"""Where one replica's batch runs, and how it gets there: inline on the event loop, or handed to
the replica's worker thread.

The loop (engine/batching/loop.py) owns the queue and decides what runs next; `Handoff` runs it.
A batch runs inline while the pure policy (engine/batching/inline.py) allows it, else on the
worker thread. After a long run (CPU time at least a tenth of the GIL switch interval) the worker
goes on to the next due batch by itself, through the loop's `after_long_run`; and the loop,
handing such a model's batch to an idle worker while others wait, waits (at most `HANDOFF_WAIT`)
for the worker to begin, so a busy loop does not keep the GIL from it for a switch interval. Why,
and what it measured: docs/batching.md, "The hand-off to the worker thread".

Invariants:
- `runs_long` is written by the worker thread only, after each of its runs.
- The inline policy is fed every run, inline or on the worker: it sees what the runs cost.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future

from snoozeml.engine.batching.inline import InlinePolicy
from snoozeml.engine.batching.policy import Arrays
from snoozeml.engine.events import EventBus, InlineDisabled
from snoozeml.errors import describe_exception
from snoozeml.logs import log_event
from snoozeml.runtime.base import Instance, Unsplittable

# How long the loop waits for an idle worker to begin a batch it was handed: a thread wake-up
# (tens of microseconds) with room to spare; past it the loop goes on without.
HANDOFF_WAIT = 0.002
# A run is long from this fraction of the switch interval (a GIL wait's bound) in CPU time.
LONG_RUN = 0.1


Ran = tuple[list[Arrays], float]  # a run on the worker: each request's outputs, its seconds
Outcome = tuple[list[Arrays], bool, float]  # each request's outputs, whether inline, seconds


class Handoff:
    def __init__(
        self,
        model: str,
        instance: Instance,
        worker: Executor,
        events: EventBus,
        unsplittable: Callable[[str], None],  # the owner's: stop batching the model
        waiting: Callable[[], bool],  # whether requests are queued behind this batch
        after_long_run: Callable[[], None],  # on the worker: take the next due batch
        long_run: float | None = None,  # CPU seconds; None: LONG_RUN of the switch interval
    ) -> None:
        self.model = model
        self.inline = InlinePolicy()
        self.runs_long = False  # the last run on the worker was long; set by the worker
        self._instance = instance
        self._worker = worker
        self._events = events
        self._unsplittable = unsplittable
        self._waiting = waiting
        self._after_long_run = after_long_run
        self._long_run = long_run

    async def run(
        self, requests: list[Arrays], rows: int, outputs: Sequence[str] | None,
        job: Future[Ran] | None = None,
    ) -> Outcome:
        """Each request's outputs, whether it ran inline, its seconds; `job`: a run begun."""
        instance = self._instance
        started = time.perf_counter()
        try:
            if job is None and self.inline.allows(rows):
                try:
                    parts = instance.run_batch_blocking(requests, outputs)
                    return parts, True, time.perf_counter() - started
                finally:
                    if self.inline.observe_inline(time.perf_counter() - started, rows):
                        self._events.publish(InlineDisabled(
                            self.model, "a run on the event loop took over "
                            f"{self.inline.abort_run * 1000:g} ms"))
            if job is None and self.runs_long and (len(requests) > 1 or self._waiting()):
                begun = threading.Lock()
                begun.acquire()
                job = self._worker.submit(self._work, requests, outputs, begun)
                begun.acquire(timeout=HANDOFF_WAIT)  # lets the worker take the GIL; see above
            elif job is None:
                job = self._worker.submit(self._work, requests, outputs)
            parts, seconds = await asyncio.wrap_future(job)
            self.inline.observe(seconds, rows)
            return parts, False, seconds
        except Unsplittable:
            self._unsplittable(
                "an output's first dimension does not follow the batch's rows; "
                "running requests alone"
            )
            loop = asyncio.get_running_loop()
            alone = [
                await loop.run_in_executor(self._worker, instance.run_blocking, inputs, outputs)
                for inputs in requests
            ]
            return alone, False, time.perf_counter() - started

    def submit(self, requests: Sequence[Arrays], outputs: Sequence[str] | None) -> Future[Ran]:
        """The run of a batch on the worker thread, queued behind the one it runs now.
        RuntimeError when the worker is shutting down."""
        return self._worker.submit(self._work, requests, outputs)

    def _work(
        self, requests: Sequence[Arrays], outputs: Sequence[str] | None,
        begun: threading.Lock | None = None,
    ) -> Ran:
        """On the worker thread: one run, then, after a long one, on to the next due batch."""
        if begun is not None:
            begun.release()
        started = time.perf_counter()
        cpu = time.thread_time()
        parts = self._instance.run_batch_blocking(requests, outputs)
        seconds = time.perf_counter() - started
        long_run = self._long_run
        if long_run is None:
            long_run = sys.getswitchinterval() * LONG_RUN
        self.runs_long = time.thread_time() - cpu >= long_run
        if not self.runs_long:
            return parts, seconds
        try:
            self._after_long_run()
        except Exception as exc:  # the run is good; what is still queued waits for the loop
            log_event("batch_take_failed", logging.ERROR, model=self.model,
                      error=describe_exception(exc))
        return parts, seconds
