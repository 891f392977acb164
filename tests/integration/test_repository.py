"""The model-repository extension: explicit load and unload change what the index reports
(Done means 9), and an unload waits for the work in flight."""

from __future__ import annotations

import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from daemon import Daemon
from oip_http import index_of, loop_request, status_of, wait_for_status
from onnx_models import LoopModel, write_mlp

MLP_ROW = {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32", "data": [0.5] * 64}]}


@pytest.fixture(scope="module")
def daemon(module_serve: Any, tmp_path_factory: pytest.TempPathFactory,
           loop_model: LoopModel) -> Daemon:
    folder = tmp_path_factory.mktemp("repository")
    write_mlp(folder / "mlp.onnx")
    return module_serve(f"""
        [[models]]
        name = "alpha"
        path = "mlp.onnx"

        [[models]]
        name = "beta"
        path = "mlp.onnx"

        [[models]]
        name = "gamma"
        path = "mlp.onnx"

        [[models]]
        name = "slow"
        path = "{loop_model.path}"
    """, directory=folder)  # type: ignore[no-any-return]


@pytest.fixture
def client(daemon: Daemon) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=daemon.url, timeout=60) as http:
        yield http


def test_explicit_load_and_unload_move_a_model_through_the_states_the_index_reports(
    daemon: Daemon, client: httpx.Client
) -> None:
    assert index_of(client)["alpha"] == {
        "name": "alpha", "version": "1", "state": "UNLOADED", "reason": "",
    }

    mark = daemon.mark()
    loaded = client.post("/v2/repository/models/alpha/load")
    assert loaded.status_code == 200, loaded.text
    daemon.wait_for_log(r"model_loaded model=alpha ", start=mark)
    assert index_of(client)["alpha"]["state"] == "READY"
    assert status_of(client, "alpha")["loads"] == 1

    mark = daemon.mark()
    unloaded = client.post("/v2/repository/models/alpha/unload")
    assert unloaded.status_code == 200, unloaded.text
    daemon.wait_for_log(r"model_unloaded model=alpha reason=admin", start=mark)
    assert index_of(client)["alpha"] == {
        "name": "alpha", "version": "1", "state": "UNLOADED", "reason": "admin",
    }
    assert status_of(client, "alpha")["replicas"] == 0


def test_loading_a_loaded_model_and_unloading_an_unloaded_one_change_nothing(
    daemon: Daemon, client: httpx.Client
) -> None:
    for _ in range(2):
        assert client.post("/v2/repository/models/beta/load").status_code == 200
    assert status_of(client, "beta")["loads"] == 1
    assert index_of(client)["beta"]["state"] == "READY"

    for _ in range(2):
        assert client.post("/v2/repository/models/beta/unload").status_code == 200
    assert index_of(client)["beta"]["state"] == "UNLOADED"
    # The log arrives through a pipe the test reads on a thread: wait for the line, then count.
    daemon.wait_for_log(r"model_unloaded model=beta ")
    assert len(re.findall(r"model_unloaded model=beta ", daemon.log())) == 1


def test_an_unloaded_model_loads_again_on_its_next_request(
    daemon: Daemon, client: httpx.Client
) -> None:
    assert client.post("/v2/repository/models/gamma/load").status_code == 200
    assert client.post("/v2/repository/models/gamma/unload").status_code == 200
    assert index_of(client)["gamma"]["state"] == "UNLOADED"

    response = client.post("/v2/models/gamma/infer", json=MLP_ROW)

    assert response.status_code == 200, response.text
    assert index_of(client)["gamma"]["state"] == "READY"
    assert status_of(client, "gamma")["loads"] == 2


def test_index_with_ready_true_lists_only_ready_models(client: httpx.Client) -> None:
    assert client.post("/v2/repository/models/beta/load").status_code == 200
    assert client.post("/v2/repository/models/alpha/unload").status_code == 200

    everything = index_of(client)
    ready = index_of(client, ready=True)
    not_filtered = index_of(client, ready=False)

    assert set(everything) == {"alpha", "beta", "gamma", "slow"}
    assert not_filtered == everything
    assert "beta" in ready
    assert "alpha" not in ready
    assert all(entry["state"] == "READY" for entry in ready.values())
    assert set(ready) == {n for n, e in everything.items() if e["state"] == "READY"}


def test_index_accepts_an_empty_body(client: httpx.Client) -> None:
    response = client.post("/v2/repository/index")
    assert response.status_code == 200, response.text
    assert {entry["name"] for entry in response.json()} == {"alpha", "beta", "gamma", "slow"}


@pytest.mark.parametrize(
    ("content", "fragment"),
    [(b'{"ready": "yes"}', "'ready'"), (b"[true]", "JSON object"), (b"{oops", "JSON")],
)
def test_a_malformed_index_body_gets_a_400(
    client: httpx.Client, content: bytes, fragment: str
) -> None:
    response = client.post("/v2/repository/index", content=content)
    assert response.status_code == 400, response.text
    assert fragment in response.json()["error"]


def test_unload_waits_for_the_request_in_flight_and_a_request_meanwhile_reloads_the_model(
    daemon: Daemon, client: httpx.Client, loop_model: LoopModel
) -> None:
    trips = loop_model.trips_for(1.0)
    with ThreadPoolExecutor(3) as pool:
        running = pool.submit(client.post, "/v2/models/slow/infer", json=loop_request(trips))
        wait_for_status(client, "slow", lambda m: m["in_flight"] == 1)
        mark = daemon.mark()
        unloading = pool.submit(client.post, "/v2/repository/models/slow/unload")
        draining = wait_for_status(client, "slow", lambda m: m["state"] == "UNLOADING")
        assert draining["in_flight"] == 1
        assert index_of(client)["slow"]["state"] == "UNLOADING"
        later = pool.submit(client.post, "/v2/models/slow/infer", json=loop_request(1))

        assert running.result().status_code == 200, running.result().text
        assert unloading.result().status_code == 200, unloading.result().text
        assert later.result().status_code == 200, later.result().text

    unloaded = daemon.wait_for_log(r"model_unloaded model=slow reason=admin", start=mark)
    # The reload comes after the unload. (Not searched from `mark`: the first load's line may
    # reach our log reader after the status poll that set `mark` saw its request in flight.)
    daemon.wait_for_log(r"model_loaded model=slow ", start=daemon.lines.index(unloaded) + 1)
    assert status_of(client, "slow")["loads"] == 2
    assert index_of(client)["slow"]["state"] == "READY"
