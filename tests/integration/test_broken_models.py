"""Broken model files and a disk that changes under the daemon (issue 15, part 4).

Every file of the corpus in tests/support/broken_models.py goes FAILED with a reason that names
the file and what is wrong with it, the daemon never crashes, and the healthy model beside them
keeps serving. A model file replaced or deleted while its model is unloaded is picked up (or
reported) at the next load, weights cache or not.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from broken_models import CORPUS, Broken
from daemon import Daemon, write_config
from oip_http import index_of, output
from onnx_models import SERVED, reference_session, write_mlp

ROW = np.full((1, 64), 0.5, np.float32)
MLP_ROW = {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32",
                       "data": ROW.ravel().tolist()}]}
TORCH_ROW = {"inputs": [{"name": "x", "shape": [1, 8], "datatype": "FP32", "data": [0.5] * 8}]}
# The daemon runs without root's right to read any file (CAP_DAC_OVERRIDE), so a file of mode
# 000 is as unreadable to it as to any other user.
AS_A_USER = (["setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search"]
             if os.geteuid() == 0 else [])


@dataclass
class Served:
    daemon: Daemon
    client: httpx.Client
    healthy: Path


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("broken")
    entries = []
    for broken in CORPUS:
        folder = root / broken.name
        folder.mkdir()
        path = broken.write(folder)
        entries.append(f'[[models]]\nname = "{broken.name}"\npath = "{path}"\n'
                       f"{broken.torch_keys}")
    healthy = write_mlp(root / "healthy.onnx")
    entries.append('[[models]]\nname = "healthy"\npath = "healthy.onnx"\n')
    config = write_config(root, "\n".join(entries))
    # The state-dict models' factory module lives next to their weights.
    modules = os.pathsep.join(str(folder) for b in CORPUS
                              for folder in (root / b.name).iterdir() if folder.is_dir())
    daemon = Daemon(config, env={"PYTHONPATH": modules}, wrap=AS_A_USER).start()
    try:
        with httpx.Client(base_url=daemon.url, timeout=120) as client:
            yield Served(daemon, client, healthy)
    finally:
        assert daemon.stop() == 0
        assert not [line for line in daemon.lines if "Traceback" in line]


@pytest.mark.parametrize("broken", CORPUS, ids=[b.name for b in CORPUS])
def test_a_broken_file_fails_its_model_with_a_reason_naming_the_problem(
    served: Served, broken: Broken
) -> None:
    body = TORCH_ROW if broken.torch_keys else MLP_ROW

    response = served.client.post(f"/v2/models/{broken.name}/infer", json=body)

    assert response.status_code == 503, response.text
    error = response.json()["error"]
    assert error.startswith(f"model '{broken.name}' failed to load: ")
    for fragment in broken.says:
        assert fragment in error.lower(), error
    assert int(response.headers["retry-after"]) >= 1
    entry = index_of(served.client)[broken.name]
    assert entry["state"] == "FAILED"
    assert entry["reason"] in error
    # The daemon is up, ready, and the healthy model still answers what onnxruntime does.
    assert served.client.get("/v2/health/ready").status_code == 200
    healthy = served.client.post("/v2/models/healthy/infer", json=MLP_ROW)
    assert healthy.status_code == 200, healthy.text
    np.testing.assert_allclose(output(healthy.json(), "y"),
                               reference_session(served.healthy).run(None, {"x": ROW})[0],
                               **SERVED)


def test_an_explicit_load_of_a_broken_file_says_the_same(served: Served) -> None:
    response = served.client.post("/v2/repository/models/truncated-50/load")

    assert response.status_code == 503
    assert "the file is truncated" in response.json()["error"]
    assert "retry-after" in response.headers


# --- a disk that changes under the daemon --------------------------------------------------


def _serve_one(serve: Any, tmp_path: Path, cache: bool) -> tuple[Daemon, Path]:
    path = write_mlp(tmp_path / "m.onnx", seed=1)
    daemon: Daemon = serve(textwrap.dedent(f"""
        [[models]]
        name = "m"
        path = "m.onnx"
        weights_cache = {str(cache).lower()}
    """))
    return daemon, path


def _answer(client: httpx.Client) -> np.ndarray:
    response = client.post("/v2/models/m/infer", json=MLP_ROW)
    assert response.status_code == 200, response.text
    return np.asarray(output(response.json(), "y"))


@pytest.mark.parametrize("cache", [True, False], ids=["weights-cache", "no-cache"])
def test_a_file_replaced_while_unloaded_is_the_one_the_next_load_serves(
    serve: Any, tmp_path: Path, cache: bool
) -> None:
    daemon, path = _serve_one(serve, tmp_path, cache)
    with httpx.Client(base_url=daemon.url, timeout=60) as client:
        first = _answer(client)
        np.testing.assert_allclose(first, reference_session(path).run(None, {"x": ROW})[0],
                                   **SERVED)
        if cache:  # the entry of the first file is on disk before the file changes
            daemon.wait_for_log(r"onnx_cache_built model=m ")
        assert client.post("/v2/repository/models/m/unload").status_code == 200

        # Same name, same size, other weights: what a redeploy does.
        replacement = write_mlp(tmp_path / "next" / "m.onnx", seed=2)
        os.replace(replacement, path)

        second = _answer(client)
        np.testing.assert_allclose(second, reference_session(path).run(None, {"x": ROW})[0],
                                   **SERVED)
        assert not np.allclose(first, second)


def test_a_file_deleted_while_unloaded_fails_the_next_load_naming_it_until_it_is_back(
    serve: Any, tmp_path: Path
) -> None:
    daemon, path = _serve_one(serve, tmp_path, True)
    with httpx.Client(base_url=daemon.url, timeout=60) as client:
        kept = path.read_bytes()
        _answer(client)
        assert client.post("/v2/repository/models/m/unload").status_code == 200
        path.unlink()

        response = client.post("/v2/models/m/infer", json=MLP_ROW)

        assert response.status_code == 503, response.text
        error = response.json()["error"]
        assert str(path) in error
        assert "no such file" in error.lower()
        assert index_of(client)["m"]["state"] == "FAILED"

        path.write_bytes(kept)
        assert client.post("/v2/repository/models/m/load").status_code == 200
        np.testing.assert_allclose(_answer(client),
                                   reference_session(path).run(None, {"x": ROW})[0], **SERVED)
