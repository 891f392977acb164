"""The soak test's models: their files and entries, and the requests each is sent, with
onnxruntime's answers computed in this process."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from harness.config import write_config as write_toml
from harness.oip import binary_request, grpc_request, json_request, new_session
from models import write_bench_mlp, write_embedding, write_mlp

RTOL, ATOL = 1e-5, 1e-6
CASES_PER_MODEL = 12
MAX_ROWS = 4
BLINK_IDLE_S = 2.0
CHURN_IDLE_S = 3.0


@dataclass(frozen=True)
class Case:
    """One request, pre-encoded three ways, and onnxruntime's answer to it."""

    model_input: np.ndarray
    expected: np.ndarray
    json_body: bytes
    binary_body: bytes
    header_length: int
    grpc: Any  # ModelInferRequest


@dataclass
class ServedModel:
    name: str
    role: str  # hot, blink or churn
    file: str
    width: int  # of input x
    settings: dict[str, Any]  # the entry's keys after name and path
    cases: list[Case] = field(default_factory=list)

    @property
    def pinned(self) -> bool:
        return self.role == "hot"


def write_models(folder: Path, churn: int, seed: int) -> list[ServedModel]:
    """The models' files, their entries, and CASES_PER_MODEL requests each with onnxruntime's
    answers (seeded)."""
    blink_idle = {"idle_timeout": f"{BLINK_IDLE_S:g}s"}
    served = [
        ServedModel("hot", "hot", "hot.onnx", 64, {"idle_timeout": "never", "preload": True}),
        ServedModel("blink", "blink", "blink.onnx", 16, blink_idle),
        ServedModel("blink-nb", "blink", "blink_nb.onnx", 96,
                    {**blink_idle, "batching": {"max_batch_size": 1}}),
    ]
    write_bench_mlp(folder / "hot.onnx")
    write_mlp(folder / "blink.onnx", (16, 32, 8), seed=1)
    write_embedding(folder / "blink_nb.onnx", width=96, seed=2)
    for i in range(churn):
        write_mlp(folder / f"churn_{i}.onnx", (128, 1024, 1024, 128), seed=10 + i)
        served.append(ServedModel(
            f"churn-{i}", "churn", f"churn_{i}.onnx", 128,
            {"idle_timeout": f"{CHURN_IDLE_S:g}s",
             "batching": {"max_delay": "1ms" if i % 2 else "0ms"}}))
    rng = np.random.default_rng(seed)
    for model in served:
        session = new_session(folder / model.file)
        for _ in range(CASES_PER_MODEL):
            rows = int(rng.integers(1, MAX_ROWS + 1))
            x = rng.uniform(-1, 1, size=(rows, model.width)).astype(np.float32)
            expected = np.asarray(session.run(["y"], {"x": x})[0])
            body, header_length = binary_request(x)
            model.cases.append(Case(x, expected, json_request(x), body, header_length,
                                    grpc_request(model.name, x)))
    return served


def write_config(folder: Path, models: list[ServedModel], budget: str) -> Path:
    entries = [{"name": m.name, "path": m.file, **m.settings} for m in models]
    return write_toml(folder / "models.toml", entries, server={
        "idle_timeout": "30s", "cache_dir": "cache", "drain_timeout": "10s",
        "memory": {"host_budget": budget}})


def answer_matches(got: np.ndarray, expected: np.ndarray) -> bool:
    """Same shape and dtype, and each value within rtol 1e-5 / atol 1e-6 of onnxruntime's, or
    else each row within 1e-5 of that row's largest value: a 1024-wide layer summed in another
    order (pre-packed weights, rows batched with other requests') moves a near-zero output by
    about 1e-6, while a wrong answer (another row, model or garbage) misses by the row's scale."""
    if got.shape != expected.shape or got.dtype != expected.dtype:
        return False
    if np.allclose(got, expected, rtol=RTOL, atol=ATOL):
        return True
    rows = max(1, expected.shape[0]) if expected.ndim else 1
    diff = np.abs(got - expected).reshape(rows, -1)
    scale = np.maximum(np.abs(expected).reshape(rows, -1).max(axis=1), 1.0)
    return bool(np.all(diff.max(axis=1) <= RTOL * scale))
