"""Failures stay with the one model or request concerned: a corrupt model file (Done means 5),
invalid configurations (Done means 6)."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from oip_http import index_of, output
from onnx_models import SERVED, reference_session, write_corrupt_model, write_mlp

MLP_ROW = {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]}


# --- Done means 5: a corrupt model fails alone, and an explicit load brings it back --------------


def test_corrupt_model_gets_503_with_its_load_error_while_others_serve_until_it_is_fixed(
    serve: Any, tmp_path: Path
) -> None:
    broken = write_corrupt_model(tmp_path / "broken.onnx")
    write_mlp(tmp_path / "healthy.onnx")
    daemon = serve("""
[[models]]
name = "broken"
path = "broken.onnx"

[[models]]
name = "healthy"
path = "healthy.onnx"
""")
    with httpx.Client(base_url=daemon.url, timeout=60) as client:
        response = client.post("/v2/models/broken/infer", json=MLP_ROW)

        assert response.status_code == 503, response.text
        error = response.json()["error"]
        failed = daemon.wait_for_log(r"model_load_failed model=broken ")
        logged = re.search(r'error="((?:[^"\\]|\\.)*)"', failed)
        assert logged, failed
        assert "INVALID_PROTOBUF" in logged.group(1)
        assert logged.group(1) in error  # the load error itself, not a generic message
        assert "broken" in error
        assert int(response.headers["retry-after"]) >= 1

        again = client.post("/v2/models/broken/infer", json=MLP_ROW)
        assert again.status_code == 503
        assert "INVALID_PROTOBUF" in again.json()["error"]
        assert "retry-after" in again.headers

        ready = client.get("/v2/models/broken/ready")
        assert ready.status_code != 200
        assert ready.json()["ready"] is False
        entry = index_of(client)["broken"]
        assert entry["state"] == "FAILED"
        assert "INVALID_PROTOBUF" in entry["reason"]
        assert "broken" not in index_of(client, ready=True)

        # Everything else keeps serving.
        healthy = client.post("/v2/models/healthy/infer", json=MLP_ROW)
        assert healthy.status_code == 200, healthy.text
        assert client.get("/v2/health/ready").status_code == 200

        # An explicit load of a still-corrupt file fails again, with the error.
        still = client.post("/v2/repository/models/broken/load")
        assert still.status_code == 503
        assert "INVALID_PROTOBUF" in still.json()["error"]
        assert "retry-after" in still.headers

        # Fixed on disk, an explicit load brings it up at once, backoff or not.
        write_mlp(broken, seed=5)
        mark = daemon.mark()
        loaded = client.post("/v2/repository/models/broken/load")
        assert loaded.status_code == 200, loaded.text
        daemon.wait_for_log(r"model_loaded model=broken ", start=mark)
        assert index_of(client)["broken"]["state"] == "READY"
        assert client.get("/v2/models/broken/ready").json() == {"name": "broken", "ready": True}
        fixed = client.post("/v2/models/broken/infer", json=MLP_ROW)
        assert fixed.status_code == 200, fixed.text
        x = np.full((1, 64), 0.5, np.float32)
        np.testing.assert_allclose(output(fixed.json(), "y"),
                                   reference_session(broken).run(None, {"x": x})[0], **SERVED)


def test_a_load_slower_than_load_timeout_is_cut_and_what_it_built_is_closed(
    serve: Any, big_model: Path
) -> None:
    daemon = serve(f"""
[[models]]
name = "big"
path = "{big_model}"
load_timeout = "1ms"
""")
    body = {"inputs": [{"name": "x", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}]}
    with httpx.Client(base_url=daemon.url, timeout=60) as client:
        response = client.post("/v2/models/big/infer", json=body)

        assert response.status_code == 503, response.text
        assert "load_timeout" in response.json()["error"]
        assert int(response.headers["retry-after"]) >= 1
        # The load was abandoned, not waited for: the model is FAILED with that reason, and
        # the session its thread finished building afterwards is closed, never served.
        daemon.wait_for_log(r"abandoned_load_ended model=big still_running=0")
        entry = index_of(client)["big"]
        assert entry["state"] == "FAILED"
        assert "did not finish within load_timeout (0.001s)" in entry["reason"]
        assert not [line for line in daemon.lines if "model_loaded model=big " in line]


# --- Done means 6: invalid configurations stop `snooze serve` with exit code 2 -------------------

INVALID_CONFIGS = [
    pytest.param(
        """
[server]
idle_timeout = "5m"
idle_timout = "1m"
""",
        ["models.toml:3", "server.idle_timout", "unknown key"],
        id="unknown-key",
    ),
    pytest.param(
        """
[[models]]
name = "tiny"
path = "tiny.onnx"
idle_timeout = "5 minutes"
""",
        ["models.toml:4", "models[0].idle_timeout", "invalid duration '5 minutes'"],
        id="bad-duration",
    ),
    pytest.param(
        """
[[models]]
name = "ghost"
path = "nowhere/ghost.onnx"
""",
        ["models.toml:3", "models[0].path", "no such file or folder", "ghost.onnx"],
        id="missing-model-file",
    ),
    pytest.param(
        """
[[models]]
name = "tiny"
path = "tiny.onnx"

[[models]]
name = "tiny"
path = "tiny.onnx"
""",
        ["models.toml:6", "models[1].name", "duplicate model name 'tiny'"],
        id="duplicate-model-name",
    ),
    pytest.param(
        """
[server]
http_port = "eighty"
[server.memory]
host_budget = "lots"
""",
        ["models.toml:2", "server.http_port", "models.toml:4", "server.memory.host_budget",
         "2 problem(s)"],
        id="two-problems",
    ),
    pytest.param(
        """
[[models]]
name = "tiny"
path = "tiny.onnx"
load_timeout = "0s"
""",
        # A load is cut at load_timeout: at 0 every load would fail.
        ["models.toml:4", "models[0].load_timeout", "greater than 0"],
        id="load-timeout-zero",
    ),
    pytest.param(
        """
[server
host = "x"
""",
        ["models.toml", "invalid TOML", "line 1"],
        id="bad-toml",
    ),
]


def serve_once(config: Path, *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*command, "serve", "-c", str(config), "--http-port", "0", "--grpc-port", "0"],
        capture_output=True, text=True, timeout=60, check=False,
    )


@pytest.mark.parametrize(("body", "fragments"), INVALID_CONFIGS)
def test_invalid_config_stops_serve_with_exit_2_and_a_message_naming_the_key(
    tmp_path: Path, body: str, fragments: list[str]
) -> None:
    write_mlp(tmp_path / "tiny.onnx")
    config = tmp_path / "models.toml"
    config.write_text(body.lstrip("\n"))

    result = serve_once(config, sys.executable, "-m", "snoozeml")

    text = result.stdout + result.stderr
    assert result.returncode == 2, text
    for fragment in fragments:
        assert fragment in text
    assert "Traceback" not in text
    assert "server_started" not in text


def test_the_snooze_console_script_refuses_an_invalid_config_the_same_way(
    tmp_path: Path,
) -> None:
    config = tmp_path / "models.toml"
    config.write_text("[server]\ncolour = \"blue\"\n")
    result = serve_once(config, str(Path(sys.executable).parent / "snooze"))
    assert result.returncode == 2, result.stderr
    assert f"{config}:2: server.colour: unknown key" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_missing_config_file_is_reported_without_a_traceback(tmp_path: Path) -> None:
    result = serve_once(tmp_path / "absent.toml", sys.executable, "-m", "snoozeml")
    assert result.returncode == 2, result.stderr
    assert "absent.toml" in result.stderr
    assert "cannot read config" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("taken_by", ["http", "someone-else"])
def test_a_grpc_port_already_taken_is_bind_failed_exit_1_naming_it(
    tmp_path: Path, taken_by: str
) -> None:
    write_mlp(tmp_path / "tiny.onnx")
    config = tmp_path / "models.toml"
    config.write_text('[[models]]\nname = "tiny"\npath = "tiny.onnx"\n')
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    if taken_by == "http":
        holder.close()  # the daemon's own HTTP listener takes it first
    http_port = str(port) if taken_by == "http" else "0"
    try:
        result = subprocess.run(
            [sys.executable, "-m", "snoozeml", "serve", "-c", str(config),
             "--http-port", http_port, "--grpc-port", str(port)],
            capture_output=True, text=True, timeout=60, check=False,
        )
    finally:
        holder.close()

    text = result.stdout + result.stderr
    assert result.returncode == 1, text
    assert f'bind_failed host=127.0.0.1 port={port} error="Address already in use"' in text
    assert "server_started" not in text
    assert "Traceback" not in text
