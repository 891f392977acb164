"""A loaded instance of a model with its worker thread and batch queue, and how one is built
and torn down. The blocking halves run on the loader threads."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from snoozeml.config import ModelConfig
from snoozeml.datatypes import ModelMetadata
from snoozeml.engine.batching import Batcher, BatchPolicy, BatchStats, OomHook
from snoozeml.engine.probes import release_memory_blocking
from snoozeml.logs import log_event
from snoozeml.runtime.base import Backend, Instance


def describe_exception(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@dataclass(eq=False, slots=True)
class Replica:
    """What a lease hands out: the instance, its worker thread and its batch queue."""

    instance: Instance
    worker: ThreadPoolExecutor
    batcher: Batcher

    @property
    def metadata(self) -> ModelMetadata:
        return self.instance.metadata


def load_instance_blocking(backend: Backend, spec: ModelConfig) -> Instance:
    """Build the instance, then hand the load's transient memory back to the OS so the
    measurement that follows sees only what stays resident."""
    instance = backend.load_blocking(spec)
    release_memory_blocking()
    return instance


def start_replica(
    name: str,
    instance: Instance,
    policy: BatchPolicy,
    stats: BatchStats,
    on_oom: OomHook | None,
) -> Replica:
    worker = ThreadPoolExecutor(1, thread_name_prefix=f"snooze-run-{name}")
    run_many = getattr(instance, "run_many_blocking", None)  # backends that batch themselves
    batcher = Batcher(
        name, instance.run_blocking, worker, policy, stats, on_oom=on_oom, run_many=run_many
    )
    batcher.start()
    return Replica(instance, worker, batcher)


async def stop_replica(replica: Replica) -> None:
    """Stop taking work; the caller then closes it with close_replica_blocking."""
    await replica.batcher.stop()


def close_replica_blocking(replica: Replica) -> None:
    replica.worker.shutdown(wait=True)
    try:
        replica.instance.close()
    except Exception as exc:  # a failing close must not keep the model half-unloaded
        log_event("model_close_failed", logging.WARNING, error=describe_exception(exc))
    release_memory_blocking()
