"""The gauges of `/metrics`: what is true at the moment of the scrape, read from the engine's
`StatusSnapshot` (state, queues, replicas, memory), never kept up to date by events.

With `per_model = false` every model's label is "", and the gauges of one label add up: the
queues, requests in flight, replicas and memory of all models, and `snooze_model_state` counts
the models in each state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from snoozeml.engine.lifecycle import State
from snoozeml.engine.observe.snapshots import StatusSnapshot

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

STATES = tuple(state.value for state in State)


class ModelLabels:
    """The `model` label of each configured model: its name, or "" when `per_model` is off.
    Anything else (None, or a name no model has) is ""."""

    def __init__(self, models: Iterable[str], per_model: bool = True) -> None:
        self._per_model = per_model
        self._labels: dict[str | None, str] = {
            name: name if per_model else "" for name in models
        }

    def add(self, name: str) -> str:
        """The label of a model added at run time (its name, or "")."""
        label = self._labels[name] = name if self._per_model else ""
        return label

    def remove(self, name: str) -> str | None:
        """Forget a model removed at run time; its label when no other model has it (never
        "", which the server's own requests and unknown names count under too)."""
        label = self._labels.pop(name, None)
        return None if not label or label in self._labels.values() else label

    def of(self, model: str | None) -> str:
        return self._labels.get(model, "")

    def values(self) -> list[str]:
        """Every label a configured model has, each once."""
        return sorted(set(self._labels.values()))


@dataclass
class _Sums:
    queued: int = 0
    in_flight: int = 0
    replicas: int = 0
    states: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STATES, 0))
    memory: dict[str, int] = field(default_factory=dict)  # device -> bytes
    idle_byte_seconds: float = 0.0


def gauge_families(snapshot: StatusSnapshot | None, labels: ModelLabels) -> list[Metric]:
    """The gauge families for `snapshot` (None: the families without samples)."""
    from prometheus_client.metrics_core import (  # by the first scrape
        CounterMetricFamily,
        GaugeMetricFamily,
    )

    queue = GaugeMetricFamily("snooze_queue_depth", "Requests waiting in the model's batch "
                              "queues, not running yet.", labels=("model",))
    in_flight = GaugeMetricFamily("snooze_inflight_requests", "Requests holding the loaded "
                                  "model: queued or running.", labels=("model",))
    state = GaugeMetricFamily("snooze_model_state", "1 for the model's lifecycle state, 0 for "
                              "the others.", labels=("model", "state"))
    replicas = GaugeMetricFamily("snooze_replicas", "Replicas serving or draining.",
                                 labels=("model",))
    memory = GaugeMetricFamily("snooze_model_memory_bytes", "Memory the model's replicas hold "
                               "on each device it may use (measured, or predicted until "
                               "measured).", labels=("model", "device"))
    budget = GaugeMetricFamily("snooze_device_memory_budget_bytes", "The models' memory "
                               "budget of the device.", labels=("device",))
    used = GaugeMetricFamily("snooze_device_memory_used_bytes", "Memory the models hold on the "
                             "device, loaded or unloading.", labels=("device",))
    idle = CounterMetricFamily("snooze_idle_memory_byte_seconds", "Memory-time the model held "
                               "loaded with no request: bytes times seconds, summed since "
                               "start (divide by 2^20 for MiB-seconds).", labels=("model",))
    families: list[Metric] = [queue, in_flight, state, replicas, memory, budget, used, idle]
    if snapshot is None:
        return families

    sums: dict[str, _Sums] = {}
    for model in snapshot.models:
        mine = sums.setdefault(labels.of(model.name), _Sums())
        mine.queued += model.queued
        mine.in_flight += model.in_flight
        mine.states[model.state] = mine.states.get(model.state, 0) + 1
        if model.keep_alive is not None:
            mine.idle_byte_seconds += model.keep_alive.idle_memory_byte_seconds
        for device in model.scaling.devices:
            mine.memory.setdefault(device, 0)
        fallback = model.predicted_bytes or 0
        for replica in model.replicas:
            if replica.state == "loading":
                continue
            mine.replicas += 1
            held = replica.measured_bytes or fallback
            mine.memory[replica.device] = mine.memory.get(replica.device, 0) + held
    for label, mine in sorted(sums.items()):
        queue.add_metric((label,), mine.queued)
        in_flight.add_metric((label,), mine.in_flight)
        replicas.add_metric((label,), mine.replicas)
        idle.add_metric((label,), mine.idle_byte_seconds)
        for name, count in mine.states.items():
            state.add_metric((label, name), count)
        for device, held in sorted(mine.memory.items()):
            memory.add_metric((label, device), held)
    for held_on in snapshot.devices:
        budget.add_metric((held_on.name,), held_on.budget_bytes)
        used.add_metric((held_on.name,), held_on.used_bytes)
    return families


class SnapshotGauges:
    """A Prometheus collector that takes one snapshot per scrape."""

    def __init__(self, snapshot: Callable[[], StatusSnapshot], labels: ModelLabels) -> None:
        self._snapshot = snapshot
        self._labels = labels

    def collect(self) -> list[Metric]:
        return gauge_families(self._snapshot(), self._labels)

    def describe(self) -> list[Metric]:
        return gauge_families(None, self._labels)
