"""What the daemon says about itself: readiness, a model's state, ``/admin/status`` and the
repository calls that unload a model, over an httpx client."""

from __future__ import annotations

import sys
import time
from typing import Any

import httpx
import numpy as np

from harness.oip import check_output, infer_body


def wait_ready(client: httpx.Client, path: str = "/health/ready", timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        try:
            response = client.get(path)
            if response.status_code == 200:
                return
            last = f"{response.status_code} {response.text[:200]}"
        except httpx.TransportError as exc:
            last = repr(exc)
        time.sleep(0.05)
    raise RuntimeError(f"GET {path} not 200 after {timeout_s}s (last: {last})")


def model_state(client: httpx.Client, name: str) -> str:
    """The model's repository-index state (READY, UNLOADED, LOADING, ...).

    Not ``/v2/models/{name}/ready``: SnoozeML reports a cold model as ready, since the next
    request loads it.
    """
    response = client.post("/v2/repository/index", json={})
    response.raise_for_status()
    for entry in response.json():
        if entry["name"] == name:
            return str(entry["state"])
    raise RuntimeError(f"{name} is not in the repository index")


def wait_loaded(client: httpx.Client, name: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while (state := model_state(client, name)) != "READY":
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} not loaded after {timeout_s}s (state {state})")
        time.sleep(0.05)


def unload(client: httpx.Client, name: str, timeout_s: float = 60.0) -> None:
    """Unload through the repository API, and wait until the index no longer says READY."""
    client.post(f"/v2/repository/models/{name}/unload").raise_for_status()
    deadline = time.monotonic() + timeout_s
    while model_state(client, name) == "READY":
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} still READY {timeout_s}s after its unload")
        time.sleep(0.02)


def admin_status(client: httpx.Client) -> dict[str, Any]:
    response = client.get("/admin/status")
    response.raise_for_status()
    return dict(response.json())


def model_status(client: httpx.Client, name: str) -> dict[str, Any]:
    """The model's entry in ``GET /admin/status``."""
    for entry in admin_status(client)["models"]:
        if entry["name"] == name:
            return dict(entry)
    raise RuntimeError(f"{name} is not in /admin/status")


def wait_idle(client: httpx.Client, name: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """Poll ``/admin/status`` until the model has nothing in flight or queued; return the
    entry (so counters read after a load run include the requests it left in flight)."""
    deadline = time.monotonic() + timeout_s
    while True:
        entry = model_status(client, name)
        if not entry.get("in_flight") and not entry.get("queued"):
            return entry
        if time.monotonic() > deadline:
            print(f"warning: {name} still busy after {timeout_s}s: {entry}", file=sys.stderr)
            return entry
        time.sleep(0.02)


def batch_counters(entry: dict[str, Any]) -> tuple[int, int, float]:
    """(batches, rows, worker seconds) from a model's ``/admin/status`` entry; the worker
    seconds are ``mean_run_ms`` times the batches."""
    stats = entry["batching"]
    batches = int(stats["batches"])
    return batches, int(stats["rows"]), float(stats["mean_run_ms"] or 0.0) * batches / 1e3


def inline(client: httpx.Client, name: str) -> bool:
    """Whether the model runs its short batches on the event loop (docs/batching.md)."""
    return bool(model_status(client, name)["batching"].get("inline", False))


def check_infer(
    client: httpx.Client,
    name: str,
    model_input: np.ndarray,
    expected: np.ndarray,
    rtol: float = 1e-4,
    atol: float = 1e-5,
) -> None:
    """One JSON request, checked against in-process onnxruntime, so nothing wrong is timed."""
    response = client.post(f"/v2/models/{name}/infer", json=infer_body(model_input))
    if response.status_code != 200:
        raise RuntimeError(f"infer {name}: {response.status_code} {response.text[:500]}")
    outputs = {out["name"]: out for out in response.json()["outputs"]}
    got = np.asarray(outputs["y"]["data"], dtype=np.float32).reshape(outputs["y"]["shape"])
    check_output(f"infer {name}", got, expected, rtol, atol)
