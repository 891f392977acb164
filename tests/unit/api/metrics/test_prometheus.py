"""Prometheus metrics in process (api/metrics/prometheus.py): events published on a real bus,
the registry rendered and parsed back with prometheus_client's own parser, and exact values
read from it. (Gauges from the snapshot: test_gauges.py; histograms: test_sums.py; the
[server.metrics] keys: tests/unit/config/test_settings.py.)"""

from __future__ import annotations

import asyncio

import prometheus_client
import pytest
from metrics_samples import MODELS, Samples, metrics_on, samples, series, value

from snoozeml.api.metrics.prometheus import Metrics
from snoozeml.engine.events import (
    BatchRun,
    EventBus,
    Evicting,
    LoadDeferred,
    LoadFailed,
    LoadFinished,
    ModelAdded,
    ModelRemoved,
    OomRetry,
    QueueFull,
    QueueTimedOut,
    ReplicaAdded,
    ReplicaFailed,
    ReplicaRemoved,
    RequestDropped,
    RequestFinished,
    Unloaded,
)
from snoozeml.engine.keepalive.events import CAUSES, PREWARM_OUTCOMES, ColdStart, Prewarm
from snoozeml.engine.service import InferenceService
from snoozeml.operations import Operation


def finished(operation: Operation, model: str | None, status: int, seconds: float,
             protocol: str = "http", outcome: str = "ok") -> RequestFinished:
    return RequestFinished(operation, protocol, model, outcome, status, seconds)


# --- counted from events ----------------------------------------------------------------------


def test_requests_are_counted_by_model_protocol_operation_and_status(
    service: InferenceService,
) -> None:
    bus = EventBus()
    metrics = metrics_on(bus, service.snapshot)
    for seconds in (0.0004, 0.0005, 0.003):
        bus.publish(finished(Operation.INFER, "mlp", 200, seconds))
    bus.publish(finished(Operation.INFER, "mlp", 400, 0.0001, outcome="invalid_input"))
    bus.publish(finished(Operation.INFER, "mlp", 200, 0.02, protocol="grpc"))
    bus.publish(finished(Operation.SERVER_METADATA, None, 200, 0.001))

    found = samples(metrics.render())

    assert value(found, "snooze_requests_total", model="mlp", protocol="http",
                 operation="infer", code="200") == 3
    assert value(found, "snooze_requests_total", model="mlp", protocol="http",
                 operation="infer", code="400") == 1
    assert value(found, "snooze_requests_total", model="mlp", protocol="grpc",
                 operation="infer", code="200") == 1
    assert value(found, "snooze_requests_total", model="", protocol="http",
                 operation="server_metadata", code="200") == 1
    assert len(series(found, "snooze_requests_total")) == 4
    http = {"model": "mlp", "protocol": "http"}
    name = "snooze_request_duration_seconds"
    assert value(found, f"{name}_count", **http) == 4
    assert value(found, f"{name}_sum", **http) == pytest.approx(0.0040)
    # `le` holds the bound itself: 0.0005 s lands in the 0.0005 bucket.
    assert value(found, f"{name}_bucket", le="0.0005", **http) == 3
    assert value(found, f"{name}_bucket", le="0.0025", **http) == 3
    assert value(found, f"{name}_bucket", le="0.005", **http) == 4
    assert value(found, f"{name}_bucket", le="+Inf", **http) == 4
    assert value(found, f"{name}_count", model="mlp", protocol="grpc") == 1
    assert value(found, f"{name}_count", model="", protocol="http") == 1
    # A histogram shows from its first observation; counters from the start.
    assert series(found, f"{name}_count") == [
        {"model": "", "protocol": "http"}, {"model": "mlp", "protocol": "grpc"},
        {"model": "mlp", "protocol": "http"}]


def test_a_model_name_no_model_has_is_counted_under_the_empty_model(
    service: InferenceService,
) -> None:
    bus = EventBus()
    metrics = metrics_on(bus, service.snapshot)
    for i in range(50):  # what a client might send to blow up the series
        bus.publish(finished(Operation.MODEL_METADATA, f"nope-{i}", 404, 0.001,
                             outcome="not_found"))

    found = samples(metrics.render())

    models = {labels["model"] for labels in series(found, "snooze_requests_total")}
    assert models == {""}
    assert value(found, "snooze_requests_total", model="", protocol="http",
                 operation="model_metadata", code="404") == 50
    every_model = {labels.get("model") for (_, labelset) in found
                   for labels in [dict(labelset)] if "model" in labels}
    assert every_model <= {"", *MODELS}


def test_batches_give_queue_waits_per_request_and_run_time_and_rows_per_batch(
    service: InferenceService,
) -> None:
    bus = EventBus()
    metrics = metrics_on(bus, service.snapshot)
    bus.publish(BatchRun("mlp", 0, 5, (0.0001, 0.002, 0.02), 0.003, False))
    bus.publish(BatchRun("mlp", 0, 1, (0.0004,), 0.0002, True))

    found = samples(metrics.render())

    queue = "snooze_queue_duration_seconds"
    assert value(found, f"{queue}_count", model="mlp") == 4
    assert value(found, f"{queue}_sum", model="mlp") == pytest.approx(0.0225)
    assert value(found, f"{queue}_bucket", model="mlp", le="0.0005") == 2
    assert value(found, f"{queue}_bucket", model="mlp", le="0.0025") == 3
    assert value(found, f"{queue}_bucket", model="mlp", le="0.025") == 4
    run = "snooze_inference_duration_seconds"
    assert value(found, f"{run}_count", model="mlp") == 2
    assert value(found, f"{run}_sum", model="mlp") == pytest.approx(0.0032)
    assert value(found, f"{run}_bucket", model="mlp", le="0.0005") == 1
    rows = "snooze_batch_size"
    assert value(found, f"{rows}_count", model="mlp") == 2
    assert value(found, f"{rows}_sum", model="mlp") == 6
    assert value(found, f"{rows}_bucket", model="mlp", le="1.0") == 1
    assert value(found, f"{rows}_bucket", model="mlp", le="4.0") == 1
    assert value(found, f"{rows}_bucket", model="mlp", le="8.0") == 2
    assert series(found, f"{queue}_count") == [{"model": "mlp"}]


def test_loads_unloads_replicas_queue_drops_evictions_and_auth_refusals_are_counted(
    service: InferenceService,
) -> None:
    bus = EventBus()
    metrics = metrics_on(bus, service.snapshot)
    bus.publish(LoadFinished("mlp", 0, "cpu", 0.2, 1000))
    bus.publish(LoadFinished("mlp", 1, "cpu", 0.04, 1000))
    bus.publish(LoadFailed("other", "broken", 1.0, 0.01))
    bus.publish(LoadDeferred("other", "no memory"))
    bus.publish(Unloaded("mlp", "idle", 1000))
    bus.publish(Unloaded("mlp", "memory_pressure", 1000))
    bus.publish(Unloaded("other", "admin", 0))
    bus.publish(ReplicaAdded("mlp", 1, "cpu", 2))
    bus.publish(ReplicaRemoved("mlp", 1, "cpu", 1000, 1))
    bus.publish(ReplicaFailed("mlp", "no room", True, True))
    bus.publish(QueueFull("mlp", 2))
    bus.publish(QueueTimedOut("mlp"))
    bus.publish(RequestDropped("mlp"))
    bus.publish(Evicting("other", "cpu", 10, ("mlp", "x")))
    bus.publish(OomRetry("other", "cpu", "load", "oom", ("mlp",)))
    bus.publish(Evicting("other", "cpu", 10, ()))
    bus.publish(finished(Operation.INFER, "mlp", 401, 0.0001, outcome="unauthenticated"))
    bus.publish(finished(Operation.REPOSITORY_LOAD, "mlp", 403, 0.0001, protocol="grpc",
                         outcome="forbidden"))

    found = samples(metrics.render())

    loads = "snooze_model_loads_total"
    assert value(found, loads, model="mlp", result="ok") == 2
    assert value(found, loads, model="mlp", result="failed") == 0
    assert value(found, loads, model="other", result="failed") == 1
    assert value(found, loads, model="other", result="deferred") == 1
    load = "snooze_model_load_duration_seconds"
    assert value(found, f"{load}_count", model="mlp") == 2
    assert value(found, f"{load}_sum", model="mlp") == pytest.approx(0.24)
    assert value(found, f"{load}_bucket", model="mlp", le="0.05") == 1
    assert series(found, f"{load}_count") == [{"model": "mlp"}]  # a failed load: no start
    unloads = "snooze_model_unloads_total"
    assert value(found, unloads, model="mlp", reason="idle") == 1
    assert value(found, unloads, model="mlp", reason="memory_pressure") == 1
    assert value(found, unloads, model="mlp", reason="shutdown") == 0
    assert value(found, unloads, model="other", reason="admin") == 1
    replicas = "snooze_replica_events_total"
    assert [value(found, replicas, model="mlp", event=e) for e in ("added", "removed",
                                                                    "failed")] == [1, 1, 1]
    drops = "snooze_queue_dropped_total"
    assert [value(found, drops, model="mlp", reason=r) for r in ("full", "timeout",
                                                                 "client_gone")] == [1, 1, 1]
    assert value(found, "snooze_evictions_total", reason="memory_pressure") == 2
    assert value(found, "snooze_evictions_total", reason="oom") == 1
    auth = "snooze_auth_failures_total"
    assert value(found, auth, protocol="http", reason="unauthenticated") == 1
    assert value(found, auth, protocol="grpc", reason="forbidden") == 1
    assert value(found, auth, protocol="http", reason="forbidden") == 0


def test_cold_starts_by_cause_and_prewarms_by_outcome_are_counted(
    service: InferenceService,
) -> None:
    bus = EventBus()
    metrics = metrics_on(bus, service.snapshot)
    bus.publish(ColdStart("mlp", "request", 0.02))
    bus.publish(ColdStart("mlp", "request", 0.02))
    bus.publish(ColdStart("mlp", "prewarm", 0.02))
    bus.publish(ColdStart("other", "preload", 0.02))
    bus.publish(Prewarm("mlp", "started"))
    bus.publish(Prewarm("mlp", "used"))
    bus.publish(Prewarm("mlp", "wasted"))
    bus.publish(Prewarm("other", "skipped", "rate_limit"))

    found = samples(metrics.render())

    colds = "snooze_cold_starts_total"
    assert [value(found, colds, model="mlp", cause=c) for c in CAUSES] == [2, 1, 0, 0, 0]
    assert value(found, colds, model="other", cause="preload") == 1
    prewarms = "snooze_prewarms_total"
    assert [value(found, prewarms, model="mlp", outcome=o) for o in PREWARM_OUTCOMES] == \
        [1, 1, 0]
    assert value(found, prewarms, model="other", outcome="skipped") == 1
    # Nothing loaded, nothing held idle: the counter is there, at zero.
    assert value(found, "snooze_idle_memory_byte_seconds_total", model="mlp") == 0


def test_per_model_off_keeps_the_model_label_with_the_value_empty(
    service: InferenceService,
) -> None:
    bus = EventBus()
    metrics = metrics_on(bus, service.snapshot, per_model=False)
    bus.publish(finished(Operation.INFER, "mlp", 200, 0.001))
    bus.publish(finished(Operation.INFER, "other", 200, 0.001))
    bus.publish(BatchRun("mlp", 0, 1, (0.001,), 0.001, False))
    bus.publish(BatchRun("other", 0, 2, (0.001,), 0.001, False))
    bus.publish(Unloaded("other", "idle", 0))

    found = samples(metrics.render())

    models = {labels["model"] for (_, labelset) in found
              for labels in [dict(labelset)] if "model" in labels}
    assert models == {""}
    assert value(found, "snooze_requests_total", model="", protocol="http",
                 operation="infer", code="200") == 2
    assert value(found, "snooze_batch_size_count", model="") == 2
    assert value(found, "snooze_model_unloads_total", model="", reason="idle") == 1
    # Two models, both UNLOADED: the state gauge counts them.
    assert value(found, "snooze_model_state", model="", state="UNLOADED") == 2
    assert value(found, "snooze_model_state", model="", state="READY") == 0


@pytest.mark.parametrize("per_model", [True, False])
def test_a_model_added_at_run_time_gets_series_that_go_when_it_is_removed(
    service: InferenceService, per_model: bool,
) -> None:
    bus = EventBus()
    metrics = Metrics((), service.snapshot, per_model)  # no model in models.toml: ModelMesh's
    metrics.subscribe(bus)
    bus.publish(finished(Operation.SERVER_METADATA, None, 200, 0.001))
    bus.publish(ModelAdded("meshed", "modelmesh", "/models/meshed"))
    bus.publish(finished(Operation.INFER, "meshed", 200, 0.001, protocol="grpc"))
    bus.publish(BatchRun("meshed", 0, 1, (0.001,), 0.001, False))
    label = "meshed" if per_model else ""

    found = samples(metrics.render())
    assert value(found, "snooze_requests_total", model=label, protocol="grpc",
                 operation="infer", code="200") == 1
    assert value(found, "snooze_batch_size_count", model=label) == 1
    assert value(found, "snooze_model_unloads_total", model=label, reason="removed") == 0

    bus.publish(Unloaded("meshed", "removed", 0))
    bus.publish(ModelRemoved("meshed", "modelmesh"))
    bus.publish(finished(Operation.INFER, "meshed", 404, 0.001, outcome="not_found"))

    found = samples(metrics.render())
    models = {dict(labels).get("model") for _, labels in found}
    assert "meshed" not in models
    # The server's own series (model "") outlive every model, whatever per_model says.
    assert value(found, "snooze_requests_total", model="", protocol="http",
                 operation="server_metadata", code="200") == 1
    assert value(found, "snooze_requests_total", model="", protocol="http",
                 operation="infer", code="404") == 1
    if not per_model:  # folded: what the removed model did stays in the "" sums
        assert value(found, "snooze_requests_total", model="", protocol="grpc",
                     operation="infer", code="200") == 1


def test_after_unsubscribing_nothing_more_is_counted(service: InferenceService) -> None:
    bus = EventBus()
    metrics = Metrics(MODELS, service.snapshot)
    unsubscribe = metrics.subscribe(bus)
    bus.publish(finished(Operation.INFER, "mlp", 200, 0.001))
    unsubscribe()
    bus.publish(finished(Operation.INFER, "mlp", 200, 0.001))

    found = samples(metrics.render())

    assert value(found, "snooze_requests_total", model="mlp", protocol="http",
                 operation="infer", code="200") == 1


def test_a_scrape_formats_off_the_loop_what_render_gives_on_it(
    service: InferenceService,
) -> None:
    bus = EventBus()
    metrics = metrics_on(bus, service.snapshot)
    bus.publish(finished(Operation.INFER, "mlp", 200, 0.001))
    bus.publish(BatchRun("mlp", 0, 3, (0.001,), 0.002, False))

    async def both() -> tuple[Samples, Samples]:
        scraped = samples(await metrics.scrape())
        bus.publish(finished(Operation.INFER, "mlp", 200, 0.001))  # after: not in `scraped`
        return scraped, samples(metrics.render())

    scraped, rendered = asyncio.run(both())

    ours = {key: count for key, count in scraped.items() if key[0].startswith("snooze_")}
    assert value(ours, "snooze_requests_total", model="mlp", protocol="http",
                 operation="infer", code="200") == 1
    assert value(rendered, "snooze_requests_total", model="mlp", protocol="http",
                 operation="infer", code="200") == 2
    assert value(ours, "snooze_batch_size_sum", model="mlp") == 3
    assert {name for name, _ in scraped} == {name for name, _ in rendered}


# --- the registry -----------------------------------------------------------------------------


def test_the_registry_is_the_daemons_own_with_the_process_and_python_collectors(
    service: InferenceService,
) -> None:
    metrics = metrics_on(EventBus(), service.snapshot)

    found = samples(metrics.render())
    names = {name for name, _ in found}

    assert "process_resident_memory_bytes" in names
    assert "python_info" in names
    assert not any(name.endswith("_created") for name in names)
    globally = samples(prometheus_client.generate_latest(prometheus_client.REGISTRY))
    assert not any(name.startswith("snooze_") for name, _ in globally)
    assert metrics.content_type == prometheus_client.CONTENT_TYPE_LATEST
