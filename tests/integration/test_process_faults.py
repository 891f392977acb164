"""Process faults (issue 15, part 6): a SIGKILL'd daemon comes back on the same ports at once,
SIGTERM under full load answers or refuses every request (none hangs, none is cut short), and a
full disk for the logs does not stop serving."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
from daemon import Daemon, free_ports, write_config
from oip_http import output
from onnx_models import SERVED, reference_session, write_mlp

from snoozeml.proto import inference_pb2 as pb
from snoozeml.proto import inference_pb2_grpc as pb_grpc

ROW = np.full((1, 64), 0.5, np.float32)
MLP_ROW = {"inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP32",
                       "data": ROW.ravel().tolist()}]}
CONFIG = '[[models]]\nname = "m"\npath = "m.onnx"\n'


def _grpc_request() -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[1, 64])
    tensor.contents.fp32_contents.extend(ROW.ravel().tolist())
    return request


@pytest.fixture
def model(tmp_path: Path) -> tuple[Path, np.ndarray]:
    path = write_mlp(tmp_path / "m.onnx")
    return path, reference_session(path).run(None, {"x": ROW})[0]


def test_a_sigkilled_daemon_restarts_on_the_same_ports_at_once(
    tmp_path: Path, model: tuple[Path, np.ndarray]
) -> None:
    http_port, grpc_port = free_ports(2)
    ports = ["--http-port", str(http_port), "--grpc-port", str(grpc_port)]
    config = write_config(tmp_path, CONFIG)
    first = Daemon(config, ports).start()
    # Connections open on both ports when it dies: the kernel keeps their ends in TIME_WAIT.
    with httpx.Client(base_url=first.url, timeout=30) as client, \
            grpc.insecure_channel(first.grpc_address) as channel:
        assert client.post("/v2/models/m/infer", json=MLP_ROW).status_code == 200
        pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(_grpc_request(), timeout=30)
        first.signal(signal.SIGKILL)
        assert first.wait() == -signal.SIGKILL

    second = Daemon(config, ports).start()
    try:
        assert (second.http_port, second.grpc_port) == (http_port, grpc_port)
        with httpx.Client(base_url=second.url, timeout=30) as client, \
                grpc.insecure_channel(second.grpc_address) as channel:
            response = client.post("/v2/models/m/infer", json=MLP_ROW)
            assert response.status_code == 200, response.text
            np.testing.assert_allclose(output(response.json(), "y"), model[1], **SERVED)
            reply = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(_grpc_request(),
                                                                         timeout=30)
            assert reply.model_name == "m"
    finally:
        assert second.stop() == 0


def _http_client(url: str, expected: np.ndarray, outcomes: Counter[str], stop: threading.Event,
                 problems: list[str]) -> None:
    """Requests back to back until the daemon is gone; each outcome classified. A request the
    server never began to answer (refused, or reset in the kernel's backlog or on a keep-alive
    connection as it closed) is refused; one whose answer began must arrive whole."""
    with httpx.Client(base_url=url, timeout=30) as client:
        while not stop.is_set():
            try:
                with client.stream("POST", "/v2/models/m/infer", json=MLP_ROW) as response:
                    try:
                        response.read()
                    except httpx.HTTPError as exc:
                        problems.append(f"an answer cut short: {type(exc).__name__}: {exc}")
                        return
            except httpx.ConnectError:
                outcomes["refused"] += 1  # nothing listens any more: the end for this client
                return
            except httpx.TransportError:
                outcomes["reset before an answer"] += 1
                continue
            if response.status_code == 200:
                values = output(response.json(), "y")
                if not np.allclose(values, expected, **SERVED):
                    problems.append(f"wrong answer {values}")
                outcomes["200"] += 1
            elif response.status_code == 503:
                assert "error" in response.json()
                outcomes["503"] += 1
            else:
                problems.append(f"status {response.status_code}: {response.text}")


def _grpc_client(address: str, expected: np.ndarray, outcomes: Counter[str],
                 stop: threading.Event, problems: list[str], signalled: threading.Event) -> None:
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        while not stop.is_set():
            try:
                reply = stub.ModelInfer(_grpc_request(), timeout=30)
            except grpc.RpcError as exc:
                code = exc.code()
                if code is grpc.StatusCode.UNAVAILABLE:
                    outcomes["grpc unavailable"] += 1
                    if "refused" in (exc.details() or "").lower() or \
                            "failed to connect" in (exc.details() or "").lower():
                        return
                    continue
                if code is grpc.StatusCode.CANCELLED and signalled.is_set():
                    # grpc core's own answer to calls it had queued but not yet handed to the
                    # server when the listener stops: they never ran (docs/reliability.md).
                    outcomes["grpc cancelled at stop"] += 1
                    continue
                problems.append(f"grpc {code}: {exc.details()}")
                return
            values = np.frombuffer(reply.raw_output_contents[0], np.float32)
            if not np.allclose(values.reshape(expected.shape), expected, **SERVED):
                problems.append(f"wrong grpc answer {values}")
            outcomes["grpc ok"] += 1


def test_sigterm_under_full_load_answers_or_refuses_every_request(
    serve: Any, model: tuple[Path, np.ndarray]
) -> None:
    daemon = serve('[server]\ndrain_timeout = "5s"\n\n' + CONFIG)
    expected = model[1]
    outcomes: Counter[str] = Counter()
    problems: list[str] = []
    stop = threading.Event()
    signalled = threading.Event()
    threads = [threading.Thread(target=_http_client,
                                args=(daemon.url, expected, outcomes, stop, problems))
               for _ in range(12)]
    threads += [threading.Thread(target=_grpc_client,
                                 args=(daemon.grpc_address, expected, outcomes, stop, problems,
                                       signalled))
                for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 60
        while outcomes["200"] < 200 or outcomes["grpc ok"] < 50:  # full load, observed
            assert time.monotonic() < deadline, outcomes
            assert not problems, problems
            time.sleep(0.01)  # poll interval only: the counts are what we wait for

        signalled.set()
        daemon.signal(signal.SIGTERM)

        assert daemon.wait(timeout=60) == 0
    finally:
        stop.set()  # the gRPC clients keep retrying UNAVAILABLE until told
        for thread in threads:
            thread.join(timeout=60)
    assert not [thread for thread in threads if thread.is_alive()], "a client hung"
    assert not problems, problems
    assert outcomes["200"] >= 200
    assert "Traceback" not in daemon.log()


def test_a_full_disk_for_the_logs_does_not_stop_serving(
    tmp_path: Path, model: tuple[Path, np.ndarray]
) -> None:
    http_port, grpc_port = free_ports(2)
    config = write_config(tmp_path, CONFIG)
    with open("/dev/full", "w") as full:  # every write: ENOSPC
        process = subprocess.Popen(
            [sys.executable, "-m", "snoozeml", "serve", "-c", str(config), "--log-level",
             "debug", "--http-port", str(http_port), "--grpc-port", str(grpc_port)],
            stdout=full, stderr=full)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{http_port}", timeout=30) as client:
            deadline = time.monotonic() + 60
            while True:  # no log to read the start from: readiness is what we wait for
                try:
                    if client.get("/v2/health/ready").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert process.poll() is None, "the daemon exited"
                assert time.monotonic() < deadline
                time.sleep(0.01)  # poll interval only
            for _ in range(20):  # each one logs (debug), and every log write fails
                response = client.post("/v2/models/m/infer", json=MLP_ROW)
                assert response.status_code == 200, response.text
                np.testing.assert_allclose(output(response.json(), "y"), model[1], **SERVED)
            missing = client.post("/v2/models/nope/infer", json=MLP_ROW)
            assert missing.status_code == 404
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
