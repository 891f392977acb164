"""The gauges read from the status snapshot at each scrape (api/metrics/gauges.py): each model's
state, replicas and memory, the devices' budgets, and queue and in-flight gauges that add up
when the model label is folded."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from metrics_samples import MODELS, Samples, metrics_on, samples, series, value

from snoozeml.api.metrics.gauges import ModelLabels, gauge_families
from snoozeml.engine.service import InferenceService


def test_gauges_show_each_models_state_replicas_memory_and_the_devices_budget(
    service: InferenceService,
) -> None:
    metrics = metrics_on(service.events, service.snapshot)

    async def load_mlp() -> bytes:
        await service.load("mlp", None)
        try:
            return metrics.render()
        finally:
            await service.manager.shutdown()

    found = samples(asyncio.run(load_mlp()))

    states = {labels["state"]: value(found, "snooze_model_state", **labels)
              for labels in series(found, "snooze_model_state") if labels["model"] == "mlp"}
    assert states == {"UNLOADED": 0, "LOADING": 0, "READY": 1, "UNLOADING": 0, "FAILED": 0}
    assert value(found, "snooze_model_state", model="other", state="UNLOADED") == 1
    assert value(found, "snooze_replicas", model="mlp") == 1
    assert value(found, "snooze_replicas", model="other") == 0
    held = value(found, "snooze_model_memory_bytes", model="mlp", device="cpu")
    assert held > 0
    assert value(found, "snooze_model_memory_bytes", model="other", device="cpu") == 0
    assert value(found, "snooze_device_memory_used_bytes", device="cpu") == held
    assert value(found, "snooze_device_memory_budget_bytes", device="cpu") > held
    assert value(found, "snooze_queue_depth", model="mlp") == 0
    assert value(found, "snooze_inflight_requests", model="mlp") == 0
    assert value(found, "snooze_model_loads_total", model="mlp", result="ok") == 1


def test_queue_and_in_flight_gauges_add_up_when_folded(service: InferenceService) -> None:
    snapshot = service.snapshot()
    busy = replace(snapshot, models=tuple(
        replace(model, queued=3 + i, in_flight=5 + i) for i, model in enumerate(snapshot.models)
    ))

    def gauges(per_model: bool) -> Samples:
        families = gauge_families(busy, ModelLabels(MODELS, per_model))
        return {(s.name, frozenset(s.labels.items())): s.value
                for family in families for s in family.samples}

    each, folded = gauges(True), gauges(False)

    assert value(each, "snooze_queue_depth", model="mlp") == 3
    assert value(each, "snooze_inflight_requests", model="other") == 6
    assert value(folded, "snooze_queue_depth", model="") == 7
    assert value(folded, "snooze_inflight_requests", model="") == 11
