"""What a batcher needs from the replica set that owns it, and the model's run times it shares.

The owner (engine/replicas/pool.py) builds one `BatcherHooks` per model; its batchers
(engine/batching/loop.py)
call back through it and never reach into the owner.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

OomRelief = Callable[[BaseException], Awaitable[object]]


@dataclass(slots=True)
class RunTimes:
    """The model's batch run times over its life (all replicas, all loads): Retry-After's base."""

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
