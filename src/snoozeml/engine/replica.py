"""One loaded instance of a model with its own worker thread and batch queue, and the blocking
halves of building and closing one (they run on the loader threads)."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from snoozeml.config import ModelConfig
from snoozeml.datatypes import ModelMetadata
from snoozeml.engine.batcher import Batcher
from snoozeml.errors import describe_exception
from snoozeml.heap import release_memory_blocking
from snoozeml.logs import log_event
from snoozeml.runtime.base import Backend, Instance


@dataclass(eq=False, slots=True)
class Replica:
    """What a lease hands out: the instance (its `validate_inputs`) and the batch queue (its
    `submit`). `in_flight` counts the leases held on this replica."""

    index: int  # unique within its model, never reused
    device: str
    instance: Instance
    worker: ThreadPoolExecutor
    batcher: Batcher
    measured_bytes: int
    loaded_at: float  # epoch seconds
    in_flight: int = 0

    @property
    def metadata(self) -> ModelMetadata:
        return self.instance.metadata

    @property
    def load(self) -> int:
        """Requests on the replica: leased (queued or running) or queued without a lease."""
        return max(self.in_flight, self.batcher.queued)


def load_instance_blocking(backend: Backend, spec: ModelConfig) -> Instance:
    """Build the instance, then hand the load's transient memory back to the OS so the
    measurement that follows sees only what stays resident."""
    instance = backend.load_blocking(spec)
    release_memory_blocking()
    return instance


def close_replica_blocking(replica: Replica) -> None:
    """After the batch loop stopped: wait for a run still on the worker, close the instance
    and hand its memory back to the OS."""
    replica.worker.shutdown(wait=True)
    try:
        replica.instance.close()
    except Exception as exc:  # a failing close must not keep the model half-unloaded
        log_event("model_close_failed", logging.WARNING, error=describe_exception(exc))
    release_memory_blocking()
