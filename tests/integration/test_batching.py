"""Dynamic micro-batching against the real daemon (issue 3, Done means 3-5).

One daemon serves every model of this module; each test has models of its own, so the
`batching` counters of /admin/status that a test reads are its own. Requests queue up behind a
run of the slow model (about 0.7 s here, on the CPU on purpose); tests wait for that by polling
/admin/status until the queue holds what they expect, never by sleeping.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest
from batching_models import write_doubler, write_matmul_chain_model
from daemon import Daemon, write_config
from onnx_models import write_fixed_shape_model, write_mlp

MLP_DIMS = (16, 64, 8)
POLL_INTERVAL = 0.005  # between two looks at /admin/status; the deadline bounds the wait

CONFIG = """
[[models]]
name = "mlp"
path = "mlp.onnx"
device = "cpu"
preload = true
[models.batching]
max_batch_size = 32
max_delay = "5ms"

[[models]]
name = "mlp_checked"
path = "mlp.onnx"
device = "cpu"
preload = true
[models.batching]
max_batch_size = 32
max_delay = "5ms"

[[models]]
name = "doubler"
path = "doubler.onnx"
device = "cpu"
preload = true
[models.batching]
max_delay = "5ms"

[[models]]
name = "fixed"
path = "fixed.onnx"
device = "cpu"
preload = true

[[models]]
name = "slow_full"
path = "slow.onnx"
device = "cpu"
preload = true
[models.batching]
max_queue = 2

[[models]]
name = "slow_timeout"
path = "slow.onnx"
device = "cpu"
preload = true

[[models]]
name = "slow_gone"
path = "slow.onnx"
device = "cpu"
preload = true

[[models]]
name = "slow_fails"
path = "slow_fails.onnx"
device = "cpu"
preload = true
"""


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("batching")
    write_mlp(folder / "mlp.onnx", dims=MLP_DIMS, seed=3)
    write_doubler(folder / "doubler.onnx")
    write_fixed_shape_model(folder / "fixed.onnx")
    write_matmul_chain_model(folder / "slow.onnx")
    write_matmul_chain_model(folder / "slow_fails.onnx", fail_on_negative=True)
    return folder


@pytest.fixture(scope="module")
def daemon(models: Path) -> Iterator[Daemon]:
    daemon = Daemon(write_config(models, CONFIG))
    try:
        daemon.start()
        for name in ("mlp", "mlp_checked", "doubler", "fixed", "slow_full", "slow_timeout",
                     "slow_gone", "slow_fails"):
            daemon.wait_for_log(rf"model_loaded model={name} ")
        yield daemon
    finally:
        daemon.stop()


# --- helpers ---------------------------------------------------------------------------


def run_async(daemon: Daemon, scenario: Callable[[httpx.AsyncClient], Awaitable[Any]]) -> Any:
    """Run `scenario` with an async client of `daemon` that can hold many connections."""

    async def main() -> Any:
        limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
        async with httpx.AsyncClient(base_url=daemon.url, timeout=60, limits=limits) as client:
            return await scenario(client)

    return asyncio.run(main())


def tensor(array: np.ndarray, name: str = "x", datatype: str = "FP32") -> dict[str, Any]:
    return {"name": name, "shape": list(array.shape), "datatype": datatype,
            "data": array.ravel().tolist()}


def body_of(array: np.ndarray, **extra: Any) -> dict[str, Any]:
    return {"inputs": [tensor(array)], **extra}


def post(client: httpx.AsyncClient, model: str, body: dict[str, Any]) -> Awaitable[httpx.Response]:
    return client.post(f"/v2/models/{model}/infer", json=body)


def output(response: httpx.Response, name: str = "y") -> np.ndarray:
    assert response.status_code == 200, response.text
    entry = next(o for o in response.json()["outputs"] if o["name"] == name)
    return np.asarray(entry["data"], dtype=np.float64).reshape(entry["shape"])


async def status(client: httpx.AsyncClient, model: str) -> dict[str, Any]:
    response = await client.get("/admin/status")
    assert response.status_code == 200, response.text
    return next(m for m in response.json()["models"] if m["name"] == model)


async def until(
    client: httpx.AsyncClient, model: str, check: Callable[[dict[str, Any]], bool],
    within: float = 30.0,
) -> dict[str, Any]:
    """Poll the model's /admin/status entry until `check` holds; fail after `within` s."""
    deadline = time.monotonic() + within
    while True:
        entry = await status(client, model)
        if check(entry):
            return entry
        if time.monotonic() > deadline:
            raise AssertionError(f"/admin/status of {model!r} never satisfied the check: {entry}")
        await asyncio.sleep(POLL_INTERVAL)


def running_alone(entry: dict[str, Any]) -> bool:
    """One request holds the model and none waits: it is running on the worker."""
    return bool(entry["in_flight"] == 1 and entry["queued"] == 0)


def session_of(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


# --- many clients, one batch ------------------------------------------------------------


def test_64_concurrent_clients_each_get_exactly_their_own_rows_from_shared_batches(
    daemon: Daemon, models: Path
) -> None:
    rng = np.random.default_rng(64)
    inputs = [
        rng.standard_normal((int(rng.integers(1, 4)), MLP_DIMS[0])).astype(np.float32)
        for _ in range(64)
    ]

    async def scenario(client: httpx.AsyncClient) -> tuple[list[httpx.Response], dict[str, Any]]:
        responses = await asyncio.gather(*(
            post(client, "mlp", body_of(x, id=f"client-{i}")) for i, x in enumerate(inputs)
        ))
        return list(responses), await status(client, "mlp")

    responses, entry = run_async(daemon, scenario)
    session = session_of(models / "mlp.onnx")
    for i, (x, response) in enumerate(zip(inputs, responses, strict=True)):
        assert response.json()["id"] == f"client-{i}"
        alone = session.run(None, {"x": x})[0]
        got = output(response)
        assert got.shape == alone.shape
        np.testing.assert_allclose(got, alone, rtol=1e-5, atol=1e-6)
    batching = entry["batching"]
    assert batching["enabled"] is True
    assert batching["requests"] == 64
    assert batching["rows"] == sum(len(x) for x in inputs)
    assert batching["largest_batch"] > 1
    assert batching["mean_requests_per_batch"] > 1
    assert batching["batches"] < 64
    assert entry["errors"] == 0


def test_malformed_requests_among_good_ones_get_400_and_never_reach_a_batch(
    daemon: Daemon, models: Path
) -> None:
    rng = np.random.default_rng(400)
    good = [rng.standard_normal((2, MLP_DIMS[0])).astype(np.float32) for _ in range(24)]
    row = np.zeros((1, MLP_DIMS[0]), dtype=np.float32)
    malformed = [
        {"inputs": [tensor(np.zeros((1, MLP_DIMS[0] - 1), dtype=np.float32))]},  # trailing dim
        {"inputs": [tensor(row, datatype="FP64")]},  # datatype
        {"inputs": [tensor(row, name="features")]},  # input name
        {"inputs": [tensor(row)], "outputs": [{"name": "nope"}]},  # output name
    ]
    bodies = [body_of(x) for x in good[:12]] + malformed + [body_of(x) for x in good[12:]]

    async def scenario(client: httpx.AsyncClient) -> tuple[list[httpx.Response], dict[str, Any]]:
        responses = await asyncio.gather(*(post(client, "mlp_checked", b) for b in bodies))
        return list(responses), await status(client, "mlp_checked")

    responses, entry = run_async(daemon, scenario)
    refused = responses[12:16]
    answered = responses[:12] + responses[16:]
    for response in refused:
        assert response.status_code == 400, response.text
        assert response.json()["error"]
    session = session_of(models / "mlp.onnx")
    for x, response in zip(good, answered, strict=True):
        np.testing.assert_allclose(output(response), session.run(None, {"x": x})[0],
                                   rtol=1e-5, atol=1e-6)
    assert entry["batching"]["requests"] == len(good)
    assert entry["batching"]["rows"] == 2 * len(good)
    assert entry["errors"] == len(malformed)


# --- shapes that must not mix -----------------------------------------------------------


def test_a_burst_of_mixed_trailing_shapes_is_answered_correctly(daemon: Daemon) -> None:
    rng = np.random.default_rng(5)
    shapes = [(1, 3), (1, 5), (2, 3)] * 8
    inputs = [rng.integers(-50, 50, size=shape).astype(np.float32) for shape in shapes]

    async def scenario(client: httpx.AsyncClient) -> tuple[list[httpx.Response], dict[str, Any]]:
        responses = await asyncio.gather(*(post(client, "doubler", body_of(x)) for x in inputs))
        return list(responses), await status(client, "doubler")

    responses, entry = run_async(daemon, scenario)
    for x, response in zip(inputs, responses, strict=True):
        np.testing.assert_array_equal(output(response), x * 2)
    assert entry["errors"] == 0
    batching = entry["batching"]
    assert batching["requests"] == len(inputs)
    assert batching["rows"] == sum(shape[0] for shape in shapes)
    # [*, 3] and [*, 5] can never share a batch: at least one batch for each.
    assert batching["batches"] >= 2


def test_a_model_with_a_fixed_first_dimension_turns_batching_off_and_still_serves(
    daemon: Daemon,
) -> None:
    line = daemon.wait_for_log(r"batching_disabled model=fixed ")
    assert "reason=\"input 'x' has a fixed first dimension (2)\"" in line
    inputs = [np.full((2, 3), i, dtype=np.float32) for i in range(6)]

    async def scenario(client: httpx.AsyncClient) -> tuple[list[httpx.Response], dict[str, Any]]:
        responses = await asyncio.gather(*(post(client, "fixed", body_of(x)) for x in inputs))
        return list(responses), await status(client, "fixed")

    responses, entry = run_async(daemon, scenario)
    for x, response in zip(inputs, responses, strict=True):
        np.testing.assert_array_equal(output(response), x + 1)
    batching = entry["batching"]
    assert batching["enabled"] is False
    assert batching["requests"] == len(inputs)
    assert batching["rows"] == 2 * len(inputs)
    assert batching["largest_batch"] == 1


# --- queue limits and timeouts ----------------------------------------------------------


def test_a_request_beyond_max_queue_gets_503_with_retry_after_and_the_queued_ones_finish(
    daemon: Daemon,
) -> None:
    async def scenario(client: httpx.AsyncClient) -> dict[str, Any]:
        blocker = asyncio.ensure_future(post(client, "slow_full", body_of(np.array([[1.0]]))))
        await until(client, "slow_full", running_alone)
        queued = [
            asyncio.ensure_future(post(client, "slow_full", body_of(np.array([[2.0]])))),
            asyncio.ensure_future(post(client, "slow_full", body_of(np.array([[3.0], [4.0]])))),
        ]
        await until(client, "slow_full", lambda e: e["queued"] == 2)

        refused = await post(client, "slow_full", body_of(np.array([[5.0]])))
        assert refused.status_code == 503, refused.text
        assert int(refused.headers["retry-after"]) >= 1
        error = refused.json()["error"]
        assert "queue" in error
        assert "max_queue 2" in error

        np.testing.assert_array_equal(output(await blocker), [[1.0]])
        np.testing.assert_array_equal(output(await queued[0]), [[2.0]])
        np.testing.assert_array_equal(output(await queued[1]), [[3.0], [4.0]])
        return await status(client, "slow_full")

    entry = run_async(daemon, scenario)
    batching = entry["batching"]
    assert batching["queue_full"] == 1
    # The refused request never ran: the blocker alone, then the two queued ones together.
    assert batching["requests"] == 3
    assert batching["batches"] == 2
    assert batching["largest_batch"] == 2
    assert entry["errors"] == 1


def test_a_request_whose_timeout_expires_in_the_queue_gets_503_and_never_runs(
    daemon: Daemon,
) -> None:
    async def scenario(client: httpx.AsyncClient) -> dict[str, Any]:
        blocker = asyncio.ensure_future(post(client, "slow_timeout", body_of(np.array([[1.0]]))))
        await until(client, "slow_timeout", running_alone)

        # OIP `timeout` is in microseconds: 1 ms, far less than the run ahead of it.
        late = await post(client, "slow_timeout",
                          body_of(np.array([[2.0]]), parameters={"timeout": 1000}))
        assert late.status_code == 503, late.text
        assert "queue timeout" in late.json()["error"]
        assert int(late.headers["retry-after"]) >= 1
        # Answered at its deadline, not when the worker came free: the run ahead still goes on.
        assert not blocker.done()

        np.testing.assert_array_equal(output(await blocker), [[1.0]])
        return await status(client, "slow_timeout")

    entry = run_async(daemon, scenario)
    batching = entry["batching"]
    assert batching["queue_timeouts"] == 1
    assert batching["batches"] == 1
    assert batching["requests"] == 1
    assert batching["rows"] == 1
    assert entry["queued"] == 0


def test_a_timeout_of_zero_means_no_timeout(daemon: Daemon) -> None:
    async def scenario(client: httpx.AsyncClient) -> httpx.Response:
        return await post(client, "mlp", body_of(np.zeros((1, MLP_DIMS[0]), np.float32),
                                                  parameters={"timeout": 0}))

    assert run_async(daemon, scenario).status_code == 200


# --- failures and disconnects -----------------------------------------------------------


def test_a_backend_failure_fails_every_request_of_its_batch_and_the_next_request_succeeds(
    daemon: Daemon,
) -> None:
    async def scenario(client: httpx.AsyncClient) -> dict[str, Any]:
        blocker = asyncio.ensure_future(post(client, "slow_fails", body_of(np.array([[1.0]]))))
        await until(client, "slow_fails", running_alone)
        # A negative value makes onnxruntime fail on the whole batch it lands in.
        batch = [
            asyncio.ensure_future(post(client, "slow_fails", body_of(np.array([[-1.0]])))),
            asyncio.ensure_future(post(client, "slow_fails", body_of(np.array([[2.0]])))),
            asyncio.ensure_future(post(client, "slow_fails", body_of(np.array([[3.0], [4.0]])))),
        ]
        await until(client, "slow_fails", lambda e: e["queued"] == 3)

        np.testing.assert_array_equal(output(await blocker), [[1.0]])
        for failed in await asyncio.gather(*batch):
            assert failed.status_code == 500, failed.text
            error = failed.json()["error"]
            assert "failed to run" in error
            assert "Reshape" in error

        after = await post(client, "slow_fails", body_of(np.array([[5.0], [6.0]])))
        np.testing.assert_array_equal(output(after), [[5.0], [6.0]])
        return await status(client, "slow_fails")

    entry = run_async(daemon, scenario)
    assert entry["state"] == "READY"
    assert entry["errors"] == 3
    batching = entry["batching"]
    assert batching["batches"] == 3
    assert batching["largest_batch"] == 3
    assert batching["enabled"] is True
    assert "request_failed" in daemon.log()


def test_a_queued_request_whose_client_disconnects_is_dropped_and_never_runs(
    daemon: Daemon,
) -> None:
    assert daemon.http_port is not None
    payload = json.dumps(body_of(np.array([[2.0]]))).encode()
    raw = (
        b"POST /v2/models/slow_gone/infer HTTP/1.1\r\n"
        b"Host: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\n"
        + f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )

    async def scenario(client: httpx.AsyncClient) -> dict[str, Any]:
        blocker = asyncio.ensure_future(post(client, "slow_gone", body_of(np.array([[1.0]]))))
        await until(client, "slow_gone", running_alone)

        _reader, writer = await asyncio.open_connection("127.0.0.1", daemon.http_port)
        writer.write(raw)
        await writer.drain()
        await until(client, "slow_gone", lambda e: e["queued"] == 1 and e["in_flight"] == 2)
        writer.close()
        await writer.wait_closed()
        # The daemon notices: the request gives up its lease (it stays queued, abandoned,
        # until the worker is free to look at the queue again).
        await until(client, "slow_gone", lambda e: e["in_flight"] == 1)

        np.testing.assert_array_equal(output(await blocker), [[1.0]])
        return await until(client, "slow_gone", lambda e: e["batching"]["dropped"] == 1)

    entry = run_async(daemon, scenario)
    assert entry["queued"] == 0
    batching = entry["batching"]
    assert batching["batches"] == 1
    assert batching["requests"] == 1
    assert batching["rows"] == 1
