"""A load that hangs is cut by `load_timeout` (issue 15, part 4): the model goes FAILED with that
reason, its memory reservation is released, waiting requests get a 503 saying so, other models
keep serving, no second load piles up behind the stuck one, and a SIGTERM does not wait for it.
(`load_timeout = 0` is refused at start: test_failures.py's invalid configurations.)

The hang is real: the model's path is a named pipe, so onnxruntime's open() blocks until a
writer comes, as a read from a dead network mount does.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from oip_http import index_of, output, wait_for_status
from onnx_models import SERVED, reference_session, write_mlp

ROW = np.full((1, 64), 0.5, np.float32)
MLP_ROW = {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32",
                       "data": ROW.ravel().tolist()}]}


def _config(load_timeout: str, drain: str = "30s") -> str:
    return f"""
[server]
drain_timeout = "{drain}"

[[models]]
name = "stuck"
path = "stuck.onnx"
format = "onnx"  # a pipe is no regular file to tell it by
load_timeout = "{load_timeout}"

[[models]]
name = "healthy"
path = "healthy.onnx"
"""


@pytest.fixture
def pipe(tmp_path: Path) -> Path:
    path = tmp_path / "stuck.onnx"
    os.mkfifo(path)
    write_mlp(tmp_path / "healthy.onnx")
    return path


def _reserved(client: httpx.Client) -> int:
    status = client.get("/admin/status").json()
    return sum(device["reserved_bytes"] for device in status["devices"])


def test_a_hung_load_is_cut_at_load_timeout_and_its_memory_released(
    serve: Any, pipe: Path, tmp_path: Path
) -> None:
    daemon = serve(_config("1s"))
    with httpx.Client(base_url=daemon.url, timeout=60) as client:
        started = time.monotonic()
        response = client.post("/v2/models/stuck/infer", json=MLP_ROW)
        waited = time.monotonic() - started

        assert response.status_code == 503, response.text
        assert "load_timeout" in response.json()["error"]
        assert "retry-after" in response.headers
        assert waited < 30  # bounded by the timeout, not by the hang
        daemon.wait_for_log(r"model_load_failed model=stuck .*load_timeout \(1s\)")
        entry = index_of(client)["stuck"]
        assert entry["state"] == "FAILED"
        assert "did not finish within load_timeout (1s)" in entry["reason"]
        assert _reserved(client) == 0
        # The next request is told at once, with the reason.
        again = client.post("/v2/models/stuck/infer", json=MLP_ROW)
        assert again.status_code == 503
        assert "did not finish within load_timeout" in again.json()["error"]
        healthy = client.post("/v2/models/healthy/infer", json=MLP_ROW)
        assert healthy.status_code == 200, healthy.text

        # While the abandoned load still runs, no other load of the model starts behind it.
        retried = client.post("/v2/repository/models/stuck/load")
        assert retried.status_code == 503
        assert "is still running" in retried.json()["error"]

        # The hang ends (a writer comes); what the late load built is closed, not served.
        mark = daemon.mark()
        mlp = write_mlp(tmp_path / "source" / "mlp.onnx").read_bytes()
        writer = threading.Thread(target=pipe.write_bytes, args=(mlp,))
        writer.start()
        daemon.wait_for_log(r"abandoned_load_ended model=stuck still_running=0", start=mark)
        writer.join()
        assert index_of(client)["stuck"]["state"] == "FAILED"

        # With a real file there, an explicit load serves it.
        pipe.unlink()
        pipe.write_bytes(mlp)
        loaded = client.post("/v2/repository/models/stuck/load")
        assert loaded.status_code == 200, loaded.text
        served = client.post("/v2/models/stuck/infer", json=MLP_ROW)
        assert served.status_code == 200, served.text
        np.testing.assert_allclose(output(served.json(), "y"),
                                   reference_session(pipe).run(None, {"x": ROW})[0], **SERVED)


def test_sigterm_does_not_wait_for_a_hung_load(serve: Any, pipe: Path) -> None:
    daemon = serve(_config("10m", drain="1s"))
    waiting: list[httpx.Response] = []

    def wait_for_the_model() -> None:
        with httpx.Client(base_url=daemon.url, timeout=60) as client:
            waiting.append(client.post("/v2/models/stuck/infer", json=MLP_ROW))

    request = threading.Thread(target=wait_for_the_model)
    request.start()
    with httpx.Client(base_url=daemon.url, timeout=60) as client:
        wait_for_status(client, "stuck", lambda m: m["state"] == "LOADING")

    daemon.signal(signal.SIGTERM)

    assert daemon.wait(timeout=30) == 0
    request.join()
    assert waiting[0].status_code == 503
    assert "shut down" in waiting[0].json()["error"]
    daemon.wait_for_log(r"model_load_failed model=stuck .*the daemon is stopping")
    daemon.wait_for_log(r"server_stopped")
