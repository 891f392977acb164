"""Prometheus expositions read back with prometheus_client's own parser, and a Metrics
subscribed to a bus: what the tests of api/metrics/ share (their `service` fixture, two
models on a real ModelManager, is in tests/unit/api/metrics/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from snoozeml.api.metrics.prometheus import Metrics
from snoozeml.engine.events import EventBus
from snoozeml.engine.observe.snapshots import StatusSnapshot

MODELS = ("mlp", "other")
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(text: bytes | str) -> Samples:
    """Every sample of an exposition, keyed by (sample name, its labels)."""
    if isinstance(text, bytes):
        text = text.decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(found: Samples, name: str, **labels: str) -> float:
    return found[(name, frozenset(labels.items()))]


def series(found: Samples, name: str) -> list[dict[str, str]]:
    return [dict(labels) for sample, labels in found if sample == name]


def metrics_on(bus: EventBus, snapshot: Callable[[], StatusSnapshot],
               per_model: bool = True) -> Metrics:
    metrics = Metrics(MODELS, snapshot, per_model)
    metrics.subscribe(bus)
    return metrics
