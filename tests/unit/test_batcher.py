"""The Batcher loop in-process, on a real onnxruntime instance of a tiny MLP."""

from __future__ import annotations

import asyncio
import gc
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from onnx_models import write_mlp

from snoozeml.config import ModelConfig
from snoozeml.engine.batching import Batcher, BatchPolicy, BatchStats
from snoozeml.runtime.onnx import OnnxBackend


def test_a_request_with_a_timeout_is_released_once_answered(tmp_path: Path) -> None:
    # The timer that answers a queue timeout must not keep a finished request (its inputs and
    # outputs) alive until the timeout would have passed: at 5,000 req/s with a 60 s timeout
    # that would be 300,000 requests held in memory.
    path = write_mlp(tmp_path / "mlp.onnx", dims=(4, 8, 2))
    instance = OnnxBackend().load_blocking(
        ModelConfig(name="mlp", path=path, format="onnx", device="cpu")
    )

    async def scenario() -> bool:
        worker = ThreadPoolExecutor(1)
        batcher = Batcher("mlp", instance.run_blocking, worker, BatchPolicy(), BatchStats())
        batcher.start()
        try:
            x = np.ones((1, 4), dtype=np.float32)
            alive = weakref.ref(x)
            out = await batcher.submit({"x": x}, None, queue_timeout=3600.0)
            assert out["y"].shape == (1, 2)
            del x, out
            gc.collect()
            return alive() is None
        finally:
            await batcher.stop()
            worker.shutdown()

    assert asyncio.run(scenario()), "the answered request is still referenced"
