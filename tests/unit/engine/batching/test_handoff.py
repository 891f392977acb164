"""The hand-off alone, on a real onnxruntime instance: where a batch runs, and the worker going
on by itself after a long run."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from onnx_models import write_mlp

from snoozeml.config.settings import ModelConfig
from snoozeml.engine.batching.handoff import Handoff
from snoozeml.engine.events import EventBus
from snoozeml.runtime.base import Instance
from snoozeml.runtime.onnx.backend import OnnxBackend


def instance_of(path: Path) -> Instance:
    return OnnxBackend().load_blocking(
        ModelConfig(name=path.stem, path=path, format="onnx", device="cpu")
    )


def runs(tmp_path: Path, long_run: float) -> tuple[bool, bool, list[str], list[np.ndarray]]:
    """Two one-row batches through a Handoff: whether each ran inline, the threads its
    `after_long_run` was called on, and the outputs."""
    instance = instance_of(write_mlp(tmp_path / "mlp.onnx", dims=(4, 8, 2)))
    called_on: list[str] = []

    async def scenario() -> tuple[bool, bool, list[str], list[np.ndarray]]:
        with ThreadPoolExecutor(1, thread_name_prefix="worker") as worker:
            handoff = Handoff("m", instance, worker, EventBus(), lambda reason: None,
                              lambda: False,
                              lambda: called_on.append(threading.current_thread().name),
                              long_run)
            xs = [np.full((1, 4), i, np.float32) for i in range(2)]
            outputs = []
            inline = []
            for x in xs:
                parts, ran_inline, seconds = await handoff.run([{"x": x}], 1, None)
                assert seconds > 0
                outputs.append(parts[0]["y"])
                inline.append(ran_inline)
            return inline[0], handoff.runs_long, called_on, outputs

    return asyncio.run(scenario())


def test_after_a_long_run_the_worker_calls_the_loop_back_on_its_own_thread(
    tmp_path: Path,
) -> None:
    inline, runs_long, called_on, outputs = runs(tmp_path, long_run=0.0)  # every run is long
    assert not inline
    assert runs_long
    assert len(called_on) == 2
    assert all(name.startswith("worker") for name in called_on)
    instance = instance_of(tmp_path / "mlp.onnx")
    for i, y in enumerate(outputs):
        expected = instance.run_blocking({"x": np.full((1, 4), i, np.float32)}, None)["y"]
        np.testing.assert_array_equal(y, expected)


def test_after_a_short_run_the_worker_leaves_the_next_batch_to_the_loop(tmp_path: Path) -> None:
    _, runs_long, called_on, _ = runs(tmp_path, long_run=3600.0)  # no run is long
    assert not runs_long
    assert called_on == []
