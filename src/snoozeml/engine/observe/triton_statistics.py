"""Triton's statistics extension, kept by one subscriber of the event bus.

Per configured model, since the daemon started (loads and unloads do not reset them), summed
from the events the engine already publishes (nothing here is measured in place):

- `success` / `fail`: inference requests answered (`RequestFinished` of an `infer` call), with
  their whole time in the server. A client that left is neither; neither is a call refused by
  auth or one for a version the model lacks (it never reached the model). A request for a model
  that is not configured is nobody's.
- `queue`, `compute_infer`: per request that ran, as Triton counts them: each request of a batch
  counts once, with its own wait in the queue and the whole run's time.
- `compute_input` / `compute_output`: not measured apart from the run (merging the requests'
  inputs and splitting the outputs are inside `compute_infer`), so always zero.
- `inference_count`: the rows inferred (the requests' batch sizes summed); `execution_count`:
  the runs of the model. Their ratio is the mean batch size.
- `last_inference`: milliseconds since the epoch at the end of the last run.
- per batch size (the rows of a run): runs of that size and their time.

Only runs that succeeded count towards the run figures, as in Triton.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from snoozeml.engine.events import BatchRun, EventBus, ModelAdded, ModelRemoved, RequestFinished
from snoozeml.operations import Operation

# Outcomes of an infer call that are not the model's failure ("not_found", for a model that
# exists: a version it lacks).
_NOT_FAILURES = frozenset({"ok", "cancelled", "unauthenticated", "forbidden", "not_found"})


@dataclass(frozen=True, slots=True)
class Duration:
    """How many, and their time summed in nanoseconds (Triton's StatisticDuration)."""

    count: int = 0
    ns: int = 0


@dataclass(frozen=True, slots=True)
class BatchStatistics:
    batch_size: int
    compute_input: Duration
    compute_infer: Duration
    compute_output: Duration


@dataclass(frozen=True, slots=True)
class ModelStatistics:
    name: str
    version: str
    last_inference_ms: int  # 0 before the first run
    inference_count: int
    execution_count: int
    success: Duration
    fail: Duration
    queue: Duration
    compute_input: Duration
    compute_infer: Duration
    compute_output: Duration
    batches: tuple[BatchStatistics, ...]  # by batch size, smallest first


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


@dataclass(slots=True)
class _Tally:
    success: int = 0
    success_ns: int = 0
    fail: int = 0
    fail_ns: int = 0
    queued: int = 0
    queue_ns: int = 0
    computed: int = 0  # requests that ran
    compute_ns: int = 0  # the run's time once per request
    inferences: int = 0
    executions: int = 0
    last_inference_ms: int = 0
    batches: dict[int, list[int]] = field(default_factory=dict)  # rows -> [runs, ns]


class Statistics:
    """`subscribe` it to the bus; read `model(name, version)`."""

    def __init__(self, models: Iterable[str], wall: Callable[[], float] = time.time) -> None:
        self._tallies = {name: _Tally() for name in models}
        self._wall = wall

    def subscribe(self, bus: EventBus) -> Callable[[], None]:
        return bus.subscribe_each({
            BatchRun: self._run,
            RequestFinished: self._finished,
            ModelAdded: self._added,
            ModelRemoved: self._removed,
        })

    def _added(self, event: ModelAdded) -> None:
        self._tallies[event.model] = _Tally()

    def _removed(self, event: ModelRemoved) -> None:
        self._tallies.pop(event.model, None)

    def model(self, name: str, version: str) -> ModelStatistics:
        tally = self._tallies.get(name) or _Tally()
        zero = Duration()
        return ModelStatistics(
            name=name,
            version=version,
            last_inference_ms=tally.last_inference_ms,
            inference_count=tally.inferences,
            execution_count=tally.executions,
            success=Duration(tally.success, tally.success_ns),
            fail=Duration(tally.fail, tally.fail_ns),
            queue=Duration(tally.queued, tally.queue_ns),
            compute_input=zero,
            compute_infer=Duration(tally.computed, tally.compute_ns),
            compute_output=zero,
            batches=tuple(
                BatchStatistics(size, zero, Duration(runs, ns), zero)
                for size, (runs, ns) in sorted(tally.batches.items())
            ),
        )

    def _run(self, event: BatchRun) -> None:
        tally = self._tallies.get(event.model)
        if tally is None or not event.ok:
            return
        requests = len(event.queue_seconds)
        run_ns = _ns(event.run_seconds)
        tally.queued += requests
        tally.queue_ns += sum(_ns(wait) for wait in event.queue_seconds)
        tally.computed += requests
        tally.compute_ns += run_ns * requests
        tally.inferences += event.rows
        tally.executions += 1
        tally.last_inference_ms = int(self._wall() * 1000)
        sized = tally.batches.get(event.rows)
        if sized is None:
            tally.batches[event.rows] = [1, run_ns]
        else:
            sized[0] += 1
            sized[1] += run_ns

    def _finished(self, event: RequestFinished) -> None:
        if event.operation is not Operation.INFER or event.model is None:
            return
        tally = self._tallies.get(event.model)
        if tally is None:
            return
        outcome = event.outcome
        if outcome == "ok":
            tally.success += 1
            tally.success_ns += _ns(event.seconds)
        elif outcome not in _NOT_FAILURES:
            tally.fail += 1
            tally.fail_ns += _ns(event.seconds)
