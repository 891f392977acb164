"""The keep-alive wired into real models (engine/keepalive/keeper.py, engine/model.py): real
onnxruntime loads on the loader threads, and time on a clock the test moves (FakeClock), so a
model's hours of traffic take a fraction of a second. Each step waits for the load or unload
the clock's timers started (their tasks), never for time."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from fake_clock import FakeClock
from fake_probe import FakeProbe
from onnx_models import write_mlp

from snoozeml.config.settings import parse_config
from snoozeml.engine.events import EngineEvent, Evicting
from snoozeml.engine.keepalive.events import ColdStart, KeepAlivePlanned, Prewarm
from snoozeml.engine.keepalive.histogram import IdleHistogram
from snoozeml.engine.keepalive.keeper import PREWARM_BURST
from snoozeml.engine.keepalive.store import FILE_NAME
from snoozeml.engine.lifecycle import State
from snoozeml.engine.model import Model
from snoozeml.engine.registry import ModelManager

T = TypeVar("T")


def manager_for(
    tmp_path: Path, models: dict[str, dict[str, Any]], probe: FakeProbe | None = None,
    memory: dict[str, Any] | None = None,
) -> tuple[ModelManager, FakeClock, list[EngineEvent]]:
    for name in models:
        write_mlp(tmp_path / f"{name}.onnx", dims=models[name].pop("dims", (8, 16, 2)))
    config = parse_config({
        "server": {"cache_dir": str(tmp_path / "cache"), "memory": memory or {}},
        "models": [{"name": name, "path": f"{name}.onnx", **entry}
                   for name, entry in models.items()],
    }, source=tmp_path / "models.toml")
    clock = FakeClock()
    manager = ModelManager(config, clock=clock, probe=probe)
    seen: list[EngineEvent] = []
    manager.events.subscribe(seen.append)
    return manager, clock, seen


def run(manager: ModelManager, scenario: Callable[[], Awaitable[T]]) -> T:
    async def main() -> T:
        try:
            return await scenario()
        finally:
            await manager.shutdown()

    return asyncio.run(main())


async def use(model: Model) -> None:
    async with model.lease():
        pass


async def settle(*models: Model) -> None:
    """Until the loads and unloads the clock's timers started have finished."""
    for model in models:
        for task in (model._unload_task, model._load_task):
            if task is not None and not task.done():
                await asyncio.wait({task})


def colds(seen: list[EngineEvent], cause: str, model: str | None = None) -> int:
    return sum(1 for e in seen if isinstance(e, ColdStart) and e.cause == cause
               and model in (None, e.model))


def seed_histories(tmp_path: Path, gaps: dict[str, list[float]]) -> None:
    models = {}
    for name, each in gaps.items():
        history = IdleHistogram()
        for gap in each:
            history.add(gap)
        models[name] = history.to_json()
    (tmp_path / "cache").mkdir(exist_ok=True)
    (tmp_path / "cache" / FILE_NAME).write_text(json.dumps({"format": 1, "models": models}))


# --- learning ---------------------------------------------------------------------------------


def test_a_periodic_model_stops_cold_starting_once_it_has_ten_gaps(tmp_path: Path) -> None:
    manager, clock, seen = manager_for(
        tmp_path, {"m": {"idle_timeout": "1s", "keep_alive": "adaptive"}})
    model = manager.models["m"]
    by_request: list[int] = []

    async def scenario() -> None:
        for _ in range(16):  # a request every 2 s; the fixed window is 1 s
            await use(model)
            clock.advance(2.0)
            await settle(model)
            by_request.append(colds(seen, "request"))

    run(manager, scenario)
    assert by_request[0] == 1
    # Each gap under the fallback unloads the model, until ten gaps are learned: no more after.
    assert by_request[-1] <= 11
    assert by_request[-1] == by_request[-6]
    assert model.keep.plan is not None
    assert model.keep.plan.reason == "learned"
    planned = [e.reason for e in seen if isinstance(e, KeepAlivePlanned)]
    assert planned == ["fallback: young history", "learned"]


def test_a_model_with_long_regular_gaps_unloads_after_use_and_is_prewarmed_for_its_requests(
    tmp_path: Path,
) -> None:
    manager, clock, seen = manager_for(
        tmp_path, {"m": {"idle_timeout": "5s", "keep_alive": "adaptive"}})
    model = manager.models["m"]
    found: list[tuple[State, State]] = []  # (a second after the request, at the next request)

    async def scenario() -> None:
        for _ in range(16):  # a request every 20 s
            await use(model)
            clock.advance(1.0)
            await settle(model)
            after = model.state
            clock.advance(19.0)
            await settle(model)
            found.append((after, model.state))

    run(manager, scenario)
    learned = found[10:]  # ten gaps in: learned
    assert learned == [(State.UNLOADED, State.READY)] * len(learned)
    assert found[0] == (State.READY, State.UNLOADED)  # the fallback: 5 s of 20
    assert colds(seen, "request") <= 11
    assert colds(seen, "prewarm") >= len(learned)
    assert model.keep.prewarms["used"] >= len(learned) - 1  # the last one: no request came
    assert model.keep.prewarms["skipped"] == 0


def test_a_fixed_model_keeps_its_window_but_records_its_gaps(tmp_path: Path) -> None:
    manager, clock, seen = manager_for(tmp_path, {"m": {"idle_timeout": "5s"}})
    model = manager.models["m"]

    async def scenario() -> None:
        for _ in range(14):
            await use(model)
            clock.advance(20.0)
            await settle(model)

    run(manager, scenario)
    assert colds(seen, "request") == 14
    assert not [e for e in seen if isinstance(e, Prewarm | KeepAlivePlanned)]
    assert model.keep.plan is None
    assert model.keep.history.count == 13
    assert model._idle.timeout == 5.0
    assert manager.history_path is None  # no adaptive model: no file
    assert not (tmp_path / "cache" / FILE_NAME).exists()


def test_idle_memory_time_counts_the_seconds_a_loaded_model_sat_idle(tmp_path: Path) -> None:
    manager, clock, _ = manager_for(tmp_path, {"m": {"idle_timeout": "30s"}})
    model = manager.models["m"]

    async def scenario() -> tuple[float, float, int]:
        await use(model)
        clock.advance(10.0)
        ten = model.keep.idle_memory(clock.now())
        async with model.lease():
            clock.advance(100.0)  # busy: not idle
        clock.advance(30.0)
        await settle(model)
        return ten, model.keep.idle_memory(clock.now()), model.resident_bytes() or 0

    ten, total, resident = run(manager, scenario)
    size = model.replicas.measured_bytes or model.replicas.predicted_bytes or 0
    assert size > 0
    assert resident == 0  # unloaded by then
    assert ten == pytest.approx(10.0 * size)
    assert total == pytest.approx(40.0 * size)


# --- pre-warms: the budget, memory ------------------------------------------------------------


def test_many_models_that_share_one_period_are_not_all_prewarmed_at_once(tmp_path: Path) -> None:
    names = [f"m{i}" for i in range(12)]
    seed_histories(tmp_path, {name: [20.0] * 12 for name in names})
    manager, clock, seen = manager_for(
        tmp_path, {name: {"idle_timeout": "5s", "keep_alive": "adaptive"} for name in names})
    models = [manager.models[name] for name in names]

    async def scenario() -> list[State]:
        await asyncio.gather(*(use(model) for model in models))  # all at t=0
        clock.advance(1.0)
        await settle(*models)
        clock.advance(19.0)  # every pre-warm falls due at the same moment
        await settle(*models)
        return [model.state for model in models]

    states = run(manager, scenario)
    started = [e.model for e in seen if isinstance(e, Prewarm) and e.outcome == "started"]
    skipped = [e for e in seen if isinstance(e, Prewarm) and e.outcome == "skipped"]
    assert len(started) == PREWARM_BURST
    assert len(skipped) == len(names) - PREWARM_BURST
    assert {e.detail for e in skipped} == {"rate_limit"}
    assert states.count(State.READY) == PREWARM_BURST


def test_a_prewarm_never_evicts_a_busy_model_and_is_skipped_instead(tmp_path: Path) -> None:
    seed_histories(tmp_path, {"warm": [20.0] * 12})
    manager, clock, seen = manager_for(tmp_path, {
        "busy": {"idle_timeout": "1h", "dims": (64, 512, 512, 2)},
        "warm": {"idle_timeout": "5s", "keep_alive": "adaptive"},
    }, probe=FakeProbe(host_total=10 * 2**30))
    busy, warm = manager.models["busy"], manager.models["warm"]

    async def scenario() -> tuple[State, State]:
        await use(warm)  # t=0: the last request before the gap
        async with busy.lease():  # busy when the pre-warm falls due
            # Room for the busy model and half the other: the pre-warm needs an eviction.
            await busy.replicas.finish_background()  # its weights cache entry holds room
            held, other = busy.resident_bytes(), warm.replicas.predicted_bytes
            assert held
            assert other
            manager.memory.budgets["cpu"] = held + other // 2
            clock.advance(1.0)
            await settle(warm)
            clock.advance(19.0)
            await settle(warm)
            return busy.state, warm.state

    busy_state, warm_state = run(manager, scenario)
    assert (busy_state, warm_state) == (State.READY, State.UNLOADED)
    skipped = [e for e in seen if isinstance(e, Prewarm) and e.outcome == "skipped"]
    assert [(e.model, e.detail) for e in skipped] == [("warm", "memory")]
    assert warm.keep.prewarms == {"used": 0, "wasted": 0, "skipped": 1}


def test_a_prewarm_nobody_uses_is_wasted_once_its_window_ends(tmp_path: Path) -> None:
    seed_histories(tmp_path, {"m": [20.0] * 12})
    manager, clock, _ = manager_for(
        tmp_path, {"m": {"idle_timeout": "5s", "keep_alive": "adaptive"}})
    model = manager.models["m"]

    async def scenario() -> list[State]:
        await use(model)
        clock.advance(1.0)
        await settle(model)
        clock.advance(19.0)
        await settle(model)
        loaded = model.state
        clock.advance(60.0)  # no request comes
        await settle(model)
        return [loaded, model.state]

    assert run(manager, scenario) == [State.READY, State.UNLOADED]
    assert model.keep.prewarms == {"used": 0, "wasted": 1, "skipped": 0}
    assert model.keep.wasted == 0.25  # charged to its plans


def test_a_prewarm_unloaded_by_an_operator_is_wasted_but_not_charged(tmp_path: Path) -> None:
    seed_histories(tmp_path, {"m": [20.0] * 12})
    manager, clock, seen = manager_for(
        tmp_path, {"m": {"idle_timeout": "5s", "keep_alive": "adaptive"}})
    model = manager.models["m"]

    async def scenario() -> State:
        await use(model)
        clock.advance(1.0)
        await settle(model)
        clock.advance(19.0)
        await settle(model)
        loaded = model.state
        await model.unload("admin")
        return loaded

    assert run(manager, scenario) == State.READY
    assert model.keep.prewarms["wasted"] == 1
    assert model.keep.wasted == 0.0
    assert [e.detail for e in seen if isinstance(e, Prewarm) and e.outcome == "wasted"] \
        == ["admin"]


def test_prewarms_nobody_uses_turn_the_model_to_keeping_alive_until_the_evidence_fades(
    tmp_path: Path,
) -> None:
    seed_histories(tmp_path, {"m": [20.0] * 200})  # a 20 s timer, long learned
    manager, clock, _ = manager_for(
        tmp_path, {"m": {"idle_timeout": "5s", "keep_alive": "adaptive"}})
    model = manager.models["m"]

    async def step(seconds: float) -> State:
        clock.advance(seconds)
        await settle(model)
        return model.state

    async def scenario() -> tuple[list[State], list[State], bool]:
        missed = []
        for _ in range(2):  # pre-warmed on time, then no request until long after its window
            await use(model)
            missed += [await step(1.0), await step(19.0), await step(30.0)]
        await use(model)
        kept = [await step(1.0), await step(19.0)]  # the plan now keeps it, no pre-warm
        for _ in range(20):  # the timer again, each request warm; the evidence fades
            await use(model)
            await step(20.0)
        return missed, kept, model.keep.plan is not None \
            and model.keep.plan.prewarm_after_s is not None

    missed, kept, prewarms_again = run(manager, scenario)
    assert missed == [State.UNLOADED, State.READY, State.UNLOADED] * 2
    assert model.keep.prewarms["wasted"] == 2
    assert kept == [State.READY, State.READY]
    assert prewarms_again
    assert model.keep.wasted < 0.25


# --- histories across restarts ----------------------------------------------------------------


def test_histories_are_written_at_shutdown_and_read_at_the_next_start(tmp_path: Path) -> None:
    entry = {"m": {"idle_timeout": "5s", "keep_alive": "adaptive"}}
    manager, clock, _ = manager_for(tmp_path, dict(entry))
    model = manager.models["m"]

    async def scenario() -> None:
        for _ in range(4):
            await use(model)
            clock.advance(3.0)
            await settle(model)

    run(manager, scenario)
    assert (tmp_path / "cache" / FILE_NAME).exists()
    again, _, _ = manager_for(tmp_path, dict(entry))
    try:
        assert again.models["m"].keep.history.count == 3
        assert again.models["m"].keep.history.percentile(0.5) == \
            model.keep.history.percentile(0.5)
    finally:
        again.loader.shutdown()


def test_histories_are_saved_every_minute_while_the_daemon_runs(tmp_path: Path) -> None:
    manager, clock, _ = manager_for(
        tmp_path, {"m": {"idle_timeout": "5s", "keep_alive": "adaptive"}})
    model = manager.models["m"]
    path = tmp_path / "cache" / FILE_NAME

    async def scenario() -> dict[str, Any]:
        manager.start_preloads()
        for _ in range(3):
            await use(model)
            clock.advance(2.0)
            await settle(model)
        assert not path.exists()
        clock.advance(60.0)
        assert manager.saving is not None
        await manager.saving
        loaded: dict[str, Any] = json.loads(path.read_text())
        return loaded

    saved = run(manager, scenario)
    assert IdleHistogram.from_json(saved["models"]["m"]).count == 2


@pytest.mark.parametrize("text", ["{not json", '{"format": 99, "models": {}}',
                                  '{"format": 1, "models": {"m": {"bins": "x"}}}', "\xff"])
def test_a_corrupt_history_file_is_ignored_with_a_warning(
    tmp_path: Path, text: str, caplog: pytest.LogCaptureFixture,
) -> None:
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / FILE_NAME).write_text(text, encoding="latin-1")
    manager, _, _ = manager_for(tmp_path, {"m": {"keep_alive": "adaptive"}})
    try:
        assert manager.models["m"].keep.history.count == 0
    finally:
        manager.loader.shutdown()
    assert "keepalive_history_ignored" in caplog.text


# --- eviction by cost -------------------------------------------------------------------------


@pytest.mark.parametrize(("keep_alive", "eviction", "victim"), [
    pytest.param("adaptive", "auto", "later", id="adaptive-by-cost"),
    pytest.param("fixed", "auto", "soon", id="fixed-least-recently-used-as-before"),
    pytest.param("fixed", "cost", "later", id="fixed-by-cost-when-asked"),
    pytest.param("adaptive", "lru", "soon", id="adaptive-least-recently-used-when-asked"),
])
def test_eviction_by_cost_spares_the_model_expected_back_soon(
    tmp_path: Path, keep_alive: str, eviction: str, victim: str,
) -> None:
    seed_histories(tmp_path, {"soon": [5.0] * 12})  # called every 5 s
    big = (64, 512, 512, 2)
    manager, clock, seen = manager_for(tmp_path, {
        "soon": {"idle_timeout": "1h", "keep_alive": keep_alive, "dims": big},
        "later": {"idle_timeout": "1h", "dims": big},
        "new": {"idle_timeout": "1h"},
    }, probe=FakeProbe(host_total=10 * 2**30), memory={"eviction": eviction})
    soon, later, new = (manager.models[name] for name in ("soon", "later", "new"))

    async def scenario() -> None:
        await use(soon)  # t=0: least recently used of the two
        clock.advance(1.0)
        await use(later)  # t=1: no history, nothing known of its next request
        clock.advance(2.0)  # t=3: soon is due again in about 2 s
        for model in (soon, later):
            model.keep.load_s = 1.0  # both reload alike (a fake clock times loads as 0 s)
            await model.replicas.finish_background()  # its weights cache entry holds room
        await new.predict_size()
        held = (soon.resident_bytes() or 0) + (later.resident_bytes() or 0)
        assert new.replicas.predicted_bytes
        manager.memory.budgets["cpu"] = held + new.replicas.predicted_bytes // 2
        await use(new)  # needs one of them to go

    run(manager, scenario)
    assert manager.memory.cost_aware is (victim == "later")
    evicted = [e.victims for e in seen if isinstance(e, Evicting)]
    assert evicted == [(victim,)]


def test_an_explicit_load_keeps_the_fixed_window_until_a_request_comes(tmp_path: Path) -> None:
    seed_histories(tmp_path, {"m": [20.0] * 12})  # learned: unload right after a request
    manager, clock, _ = manager_for(
        tmp_path, {"m": {"idle_timeout": "5s", "keep_alive": "adaptive"}})
    model = manager.models["m"]

    async def scenario() -> list[object]:
        await model.load("preload")
        clock.advance(4.0)
        await settle(model)
        kept = (model.state, model.keep.loaded_by, model.keep.history.count)
        await use(model)  # t=4: the plan applies from this request's end
        clock.advance(0.5)
        await settle(model)
        return [*kept, model.state]

    assert run(manager, scenario) == [State.READY, "preload", 12, State.UNLOADED]
