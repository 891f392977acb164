"""The `process` section of /admin/status: the daemon's own RSS, descriptors, threads and
asyncio tasks, read on its event loop (what bench/run.py soak watches for leaks)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from daemon import Daemon
from onnx_models import write_mlp

from snoozeml.api.status import process_json

CONFIG = """
[[models]]
name = "mlp"
path = "mlp.onnx"
preload = true
"""


def _infer(client: httpx.Client) -> None:
    body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32",
                        "data": [0.1, 0.2, 0.3, 0.4]}]}
    assert client.post("/v2/models/mlp/infer", json=body).status_code == 200


def _process(client: httpx.Client) -> dict[str, Any]:
    response = client.get("/admin/status")
    assert response.status_code == 200
    section: dict[str, Any] = response.json()["process"]
    return section


def test_status_reports_the_daemons_own_resources(serve: Any, tmp_path: Path) -> None:
    write_mlp(tmp_path / "mlp.onnx", dims=(4, 8, 2))
    daemon: Daemon = serve(CONFIG)
    with httpx.Client(base_url=daemon.url, timeout=30) as client:
        _infer(client)
        process = _process(client)
        # Descriptors come and go inside the daemon (onnxruntime, gRPC's pollers), so the count
        # is checked by what it must follow: twenty more open connections, twenty more fds.
        extra = [httpx.Client(base_url=daemon.url, timeout=30) for _ in range(20)]
        for other in extra:
            assert other.get("/v2/health/live").status_code == 200  # accepted and kept alive
        with_extra = _process(client)["open_fds"]
        for other in extra:
            other.close()

    assert set(process) == {"pid", "rss_bytes", "open_fds", "threads", "asyncio_tasks"}
    assert process["pid"] == daemon.pid
    # At least the task answering this request, and the listeners' own.
    assert process["asyncio_tasks"] >= 1
    outside = psutil.Process(daemon.pid)
    assert process["threads"] >= 1
    assert process["threads"] <= outside.num_threads() + 16  # onnxruntime and gRPC come and go
    # The listening sockets, this client's connection and the log pipe at least.
    assert process["open_fds"] >= 3
    assert with_extra >= process["open_fds"] + 16  # twenty connections, give or take the churn
    rss = outside.memory_info().rss
    assert 0.5 * rss < process["rss_bytes"] < 2 * rss


def test_process_section_off_the_event_loop_has_no_task_count() -> None:
    process = process_json()
    assert process["asyncio_tasks"] is None  # only the loop's thread can count its tasks
    assert process["rss_bytes"] > 0
    assert process["threads"] >= 1
    assert process["open_fds"] > 0


def test_the_daemon_keeps_no_onnxruntime_telemetry_queue_open(
    serve: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """onnxruntime 1.32 opens a telemetry database at import unless ORT_DISABLE_TELEMETRY is
    set; the daemon sets it itself (importing snoozeml here set it for this process too)."""
    monkeypatch.delenv("ORT_DISABLE_TELEMETRY", raising=False)
    write_mlp(tmp_path / "mlp.onnx", dims=(4, 8, 2))
    daemon: Daemon = serve(CONFIG)
    with httpx.Client(base_url=daemon.url, timeout=30) as client:
        _infer(client)
        files = [f.path for f in psutil.Process(daemon.pid).open_files()]

    assert not [path for path in files if ".onnxruntime" in path or "Microsoft" in path]
