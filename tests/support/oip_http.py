"""Small helpers for tests that talk the Open Inference Protocol to a daemon over HTTP."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np


def index_of(client: httpx.Client, ready: bool | None = None) -> dict[str, dict[str, Any]]:
    """The repository index keyed by model name."""
    body = {} if ready is None else {"ready": ready}
    response = client.post("/v2/repository/index", json=body)
    assert response.status_code == 200, response.text
    return {entry["name"]: entry for entry in response.json()}


def status_of(client: httpx.Client, name: str) -> dict[str, Any]:
    """One model's entry in /admin/status."""
    response = client.get("/admin/status")
    assert response.status_code == 200, response.text
    return next(m for m in response.json()["models"] if m["name"] == name)


def wait_for_status(client: httpx.Client, name: str, check: Callable[[dict[str, Any]], bool],
                    timeout: float = 30.0) -> dict[str, Any]:
    """Poll /admin/status (observing state, not sleeping) until `check` holds for `name`."""
    deadline = time.monotonic() + timeout
    while True:
        entry = status_of(client, name)
        if check(entry):
            return entry
        if time.monotonic() > deadline:
            raise AssertionError(f"/admin/status never satisfied the check: {entry}")
        time.sleep(0.01)  # poll interval only: the condition on the state is what we wait for


def output(body: dict[str, Any], name: str) -> np.ndarray:
    """One output of a JSON infer response as a numpy array of its shape."""
    entry = next(o for o in body["outputs"] if o["name"] == name)
    return np.asarray(entry["data"]).reshape(entry["shape"])


def loop_request(trips: int, rows: int = 1) -> dict[str, Any]:
    """An infer body for onnx_models.write_loop_model: ``rows`` rows of ones, ``trips`` trips."""
    return {"inputs": [
        {"name": "x", "shape": [rows, 4], "datatype": "FP32", "data": [[1.0] * 4] * rows},
        {"name": "trips", "shape": [], "datatype": "INT64", "data": trips},
    ]}
