"""One loaded instance of a model with its own worker thread and batch queue, and the blocking
halves of building and closing one (they run on the loader threads)."""

from __future__ import annotations

import asyncio
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum

from snoozeml.config.settings import ModelConfig
from snoozeml.datatypes import ModelMetadata
from snoozeml.engine.batching.loop import Batcher
from snoozeml.engine.memory.probes import MemoryProbe
from snoozeml.errors import describe_exception
from snoozeml.heap import release_memory_blocking
from snoozeml.logs import log_event
from snoozeml.runtime.base import Backend, Instance
from snoozeml.runtime.labels import with_labels_blocking


class ReplicaState(Enum):
    LOADING = "loading"  # admitted, the backend builds it: no requests yet
    READY = "ready"  # requests are routed to it
    DRAINING = "draining"  # finishing what it holds before it closes: no new requests


@dataclass(eq=False, slots=True)
class Replica:
    """What a lease hands out: the instance (its `validate_inputs`) and the batch queue (its
    `submit`). `in_flight` counts the leases held on this replica."""

    index: int  # unique within its model, never reused
    device: str  # whose memory budget it counts against ("cpu", "cuda:1")
    instance: Instance
    worker: ThreadPoolExecutor
    batcher: Batcher
    measured_bytes: int
    loaded_at: float  # epoch seconds
    in_flight: int = 0
    state: ReplicaState = ReplicaState.READY
    # Set while it drains: the lease that ends its last request sets it.
    drained: asyncio.Event | None = None

    @property
    def metadata(self) -> ModelMetadata:
        return self.instance.metadata

    @property
    def load(self) -> int:
        """Requests on the replica: leased (queued or running) or queued without a lease."""
        return max(self.in_flight, self.batcher.queued)


def load_instance_blocking(
    backend: Backend, spec: ModelConfig, probe: MemoryProbe, device: str
) -> tuple[Instance, int | None]:
    """Build the instance, then hand the load's transient memory back to the OS so the
    measurement that follows sees only what stays resident. Also returns the device's peak
    use during the load above its use before, when the probe knows it."""
    before = probe.used(device)
    probe.reset_peak(device)
    # Its outputs' class labels too: a `labels` file that fits no output fails the load.
    instance = with_labels_blocking(backend.load_blocking(spec), spec)
    peak = probe.peak(device)
    release_memory_blocking()
    return instance, (max(peak - before, 0) if peak is not None else None)


def close_abandoned_blocking(loaded: tuple[Instance, int | None]) -> None:
    """An instance whose load finished after it was abandoned (load_timeout): nobody will
    run it."""
    loaded[0].close()
    release_memory_blocking()


def close_replica_blocking(replica: Replica) -> None:
    """After the batch loop stopped: wait for a run still on the worker, close the instance
    and hand its memory back to the OS."""
    replica.worker.shutdown(wait=True)
    try:
        replica.instance.close()
    except Exception as exc:  # a failing close must not keep the model half-unloaded
        log_event("model_close_failed", logging.WARNING, error=describe_exception(exc))
    release_memory_blocking()


def cpu_replica_cap(spec: ModelConfig, cores: int) -> int | None:
    """How many of the model's replicas may run on the CPU at once: as many as there are
    cores, each with one intra-op thread (measured in docs/scaling.md: two one-thread sessions
    run 1.7-1.9x the requests of one, a two-thread session fewer than a one-thread one).
    None when the file sets `intra_op_threads`: the user's count wins, uncapped."""
    if "intra_op_threads" in spec.model_fields_set:
        return None
    return max(1, cores)


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        return os.cpu_count() or 1
