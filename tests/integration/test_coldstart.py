"""Cold starts against the real daemon (issue 14): mapped weights from the cache hold about one
copy of the model at their load's peak, so a budget holds more models beside a load; the
pre-packing upgrade swaps in under traffic without failing or holding up a request.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from oip_http import index_of, output
from onnx_models import SERVED, reference_session, write_big_model, write_mlp

MiB = 2**20
BIG_INPUT = np.linspace(-1.0, 1.0, 16, dtype=np.float32).reshape(1, 16)
LOADED = re.compile(r"model_loaded model=(\w+) .*bytes=(\d+) .*reserved_bytes=(\d+) "
                    r"peak_bytes=(\d+)")


def infer(client: httpx.Client, name: str, x: np.ndarray) -> httpx.Response:
    return client.post(f"/v2/models/{name}/infer", json={"inputs": [
        {"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]})


def vm_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {key} in /proc/{pid}/status")


def test_a_budget_holds_two_mapped_models_while_a_third_loads(
    serve: Any, client_for: Any, tmp_path: Path
) -> None:
    paths = {name: write_big_model(tmp_path / f"{name}.onnx", megabytes=92, seed=seed)
             for seed, name in enumerate("abc")}
    daemon = serve("""
[server]
idle_timeout = "10m"
[server.memory]
host_budget = "300MiB"
min_residency = "0s"
""" + "".join(f'\n[[models]]\nname = "{n}"\npath = "{p}"\n' for n, p in paths.items()))
    client = client_for(daemon)
    for name in paths:  # first loads: the default way, each writing its entry afterwards
        mark = daemon.mark()
        assert infer(client, name, BIG_INPUT).status_code == 200
        daemon.wait_for_log(rf"onnx_cache_built model={name} ", start=mark)
    for name in paths:
        client.post(f"/v2/repository/models/{name}/unload").raise_for_status()
    baseline = daemon.rss()
    Path(f"/proc/{daemon.pid}/clear_refs").write_text("5")  # VmHWM from here
    evictions = client.get("/admin/status").json()["evictions"]
    mark = daemon.mark()

    for name, path in paths.items():
        response = infer(client, name, BIG_INPUT)
        assert response.status_code == 200, response.text
        expected = reference_session(path).run(None, {"x": BIG_INPUT})[0]
        np.testing.assert_allclose(output(response.json(), "y"), expected, **SERVED)

    index = index_of(client)
    assert [index[name]["state"] for name in paths] == ["READY"] * 3
    assert client.get("/admin/status").json()["evictions"] == evictions  # nothing made room
    peak = vm_kib(daemon.pid, "VmHWM")
    assert peak - baseline <= 300 * MiB * 1.1, (peak - baseline) / MiB
    # Each rehydration reserved about one copy of the model, and its real peak was within it.
    loads = [LOADED.search(line) for line in daemon.log().splitlines()[mark:]]
    for found in filter(None, loads):
        reserved, real = int(found.group(3)), int(found.group(4))
        assert reserved < 1.2 * 92 * MiB, found.group(0)
        assert real <= reserved, found.group(0)


@pytest.mark.parametrize("weights_cache", ["true", "false"])
def test_the_next_load_reserves_at_least_the_peak_its_path_really_had(
    serve: Any, client_for: Any, tmp_path: Path, weights_cache: str
) -> None:
    path = write_big_model(tmp_path / "big.onnx", megabytes=40)
    daemon = serve(f"""
[[models]]
name = "big"
path = "{path}"
weights_cache = {weights_cache}
""")
    client = client_for(daemon)
    peaks, reserved = [], []
    for attempt in range(3):  # with the cache: a default load, then two mapped loads
        mark = daemon.mark()
        assert infer(client, "big", BIG_INPUT).status_code == 200
        found = LOADED.search(daemon.wait_for_log(r"model_loaded model=big ", start=mark))
        assert found is not None
        reserved.append(int(found.group(3)))
        peaks.append(int(found.group(4)))
        if attempt == 0 and weights_cache == "true":
            daemon.wait_for_log(r"onnx_cache_built model=big ", start=mark)
        client.post("/v2/repository/models/big/unload").raise_for_status()
    # A load on the path the previous one took reserves at least the peak that one had.
    assert reserved[2] >= peaks[1], (reserved, peaks)
    if weights_cache == "false":
        assert reserved[1] >= peaks[0], (reserved, peaks)


def test_the_prepacking_upgrade_loses_no_request_under_concurrent_traffic(
    serve: Any, client_for: Any, tmp_path: Path
) -> None:
    path = write_mlp(tmp_path / "mlp.onnx", dims=(64, 512, 512, 64))
    daemon = serve(f"""
[[models]]
name = "mlp"
path = "{path}"
[models.batching]
max_batch_size = 32
""")
    client = client_for(daemon)
    reference = reference_session(path)
    one = np.random.default_rng(1).standard_normal((1, 64)).astype(np.float32)
    eight = np.random.default_rng(2).standard_normal((8, 64)).astype(np.float32)
    mark = daemon.mark()
    assert infer(client, "mlp", one).status_code == 200  # the default load, pre-packed
    daemon.wait_for_log(r"onnx_cache_built model=mlp ", start=mark)
    client.post("/v2/repository/models/mlp/unload").raise_for_status()
    assert infer(client, "mlp", one).status_code == 200  # mapped: unpacked until a batch
    mark = daemon.mark()
    answers: list[tuple[np.ndarray, np.ndarray, int, str]] = []
    upgraded = threading.Event()

    def traffic(x: np.ndarray) -> None:
        with httpx.Client(base_url=daemon.url, timeout=60) as own:
            sent_after = 0
            while sent_after < 20:  # keeps going until well after the swap
                response = infer(own, "mlp", x)
                answers.append((x, np.asarray(output(response.json(), "y")) if
                                response.status_code == 200 else np.empty(0),
                                response.status_code, response.text[:200]))
                if upgraded.is_set():
                    sent_after += 1

    threads = [threading.Thread(target=traffic, args=(x,)) for x in (one, one, eight)]
    for thread in threads:
        thread.start()
    try:
        daemon.wait_for_log(r"replica_upgraded model=mlp ", start=mark)
    finally:
        upgraded.set()
        for thread in threads:
            thread.join()

    assert [status for _, _, status, _ in answers if status != 200] == []
    for x, y, _, _ in answers:
        np.testing.assert_allclose(y.reshape(len(x), 64), reference.run(None, {"x": x})[0],
                                   **SERVED)
    # Upgraded, the model answers as onnxruntime's default (pre-packed) session, bit for bit.
    after = infer(client, "mlp", one)
    assert np.array_equal(np.asarray(output(after.json(), "y"), np.float32).reshape(1, 64),
                          reference.run(None, {"x": one})[0])


@pytest.mark.parametrize("prepack", ["on", "off"])
def test_prepack_on_and_off_never_upgrade(serve: Any, client_for: Any, tmp_path: Path,
                                          prepack: str) -> None:
    path = write_mlp(tmp_path / "mlp.onnx", dims=(64, 256, 64))
    daemon = serve(f"""
[[models]]
name = "mlp"
path = "{path}"
prepack = "{prepack}"
""")
    client = client_for(daemon)
    eight = np.random.default_rng(2).standard_normal((8, 64)).astype(np.float32)
    for _ in range(3):
        assert infer(client, "mlp", eight).status_code == 200
    assert "replica_upgraded" not in daemon.log()
