"""Graceful shutdown: SIGTERM lets every request in flight finish, then exits 0 (Done means 8)."""

from __future__ import annotations

import re
import signal
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
from oip_http import loop_request, output, wait_for_status
from onnx_models import SERVED, LoopModel, reference_session


def test_sigterm_with_twenty_requests_in_flight_answers_all_of_them_then_exits_0(
    serve: Any, loop_model: LoopModel
) -> None:
    daemon = serve(f"""
[[models]]
name = "slow"
path = "{loop_model.path}"
""")
    long_trips = loop_model.trips_for(2.5)
    short_trips = loop_model.trips_for(0.02)
    limits = httpx.Limits(max_connections=30)
    with httpx.Client(base_url=daemon.url, timeout=120, limits=limits) as client, \
            ThreadPoolExecutor(20) as pool:
        warm = client.post("/v2/models/slow/infer", json=loop_request(1))
        assert warm.status_code == 200, warm.text

        # One long request occupies the model's worker; 19 short ones queue behind it, so all
        # 20 hold a lease on the model when the signal arrives.
        first = pool.submit(client.post, "/v2/models/slow/infer", json=loop_request(long_trips))
        wait_for_status(client, "slow", lambda m: m["in_flight"] == 1)
        rest = [
            pool.submit(client.post, "/v2/models/slow/infer",
                        json=loop_request(short_trips, rows=2))
            for _ in range(19)
        ]
        wait_for_status(client, "slow", lambda m: m["in_flight"] == 20)
        assert not first.done()

        mark = daemon.mark()
        daemon.signal(signal.SIGTERM)
        daemon.wait_for_log(r"shutdown_requested signal=SIGTERM", start=mark)
        responses = [first.result(), *(future.result() for future in rest)]
    exit_code = daemon.wait()

    for response in responses:
        assert response.status_code == 200, response.text
    assert output(responses[0].json(), "y").shape == (1, 4)
    (expected,) = reference_session(loop_model.path).run(
        None, {"x": np.ones((2, 4), np.float32), "trips": np.array(short_trips, np.int64)})
    for response in responses[1:]:
        np.testing.assert_allclose(output(response.json(), "y"), expected, **SERVED)
    assert exit_code == 0
    log = "\n".join(daemon.lines[mark:])
    assert "model_unloaded model=slow reason=shutdown" in log
    assert re.search(r"server_stopped", log)
    assert "Traceback" not in daemon.log()


def test_a_second_signal_ends_the_drain_at_once_answering_what_is_left_with_503(
    serve: Any, loop_model: LoopModel
) -> None:
    # drain_timeout is far longer than the test: only the second signal can cut the drain.
    daemon = serve(f"""
[server]
drain_timeout = "10m"

[[models]]
name = "slow"
path = "{loop_model.path}"
""")
    trips = loop_model.trips_for(2.0)
    with httpx.Client(base_url=daemon.url, timeout=120) as client, \
            ThreadPoolExecutor(3) as pool:
        warm = client.post("/v2/models/slow/infer", json=loop_request(1))
        assert warm.status_code == 200, warm.text
        running = pool.submit(client.post, "/v2/models/slow/infer", json=loop_request(trips))
        wait_for_status(client, "slow", lambda m: m["in_flight"] == 1)
        queued = [pool.submit(client.post, "/v2/models/slow/infer", json=loop_request(trips))
                  for _ in range(2)]
        wait_for_status(client, "slow", lambda m: m["in_flight"] == 3)

        mark = daemon.mark()
        daemon.signal(signal.SIGTERM)
        daemon.wait_for_log(r"shutdown_requested signal=SIGTERM", start=mark)
        daemon.signal(signal.SIGINT)
        daemon.wait_for_log(r"shutdown_forced signal=SIGINT", start=mark)
        responses = [running.result(), *(future.result() for future in queued)]
    exit_code = daemon.wait()

    for response in responses:
        assert response.status_code == 503, response.text
        assert response.json() == {"error": "the server shut down before this request finished"}
        assert response.headers["retry-after"] == "1"
    assert exit_code == 0
    assert "server_stopped" in "\n".join(daemon.lines[mark:])
    assert "Traceback" not in daemon.log()


def test_during_the_drain_readiness_is_503_on_http_and_not_serving_on_grpc(
    serve: Any, loop_model: LoopModel
) -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    daemon = serve(f"""
[[models]]
name = "slow"
path = "{loop_model.path}"
""")
    with httpx.Client(base_url=daemon.url, timeout=120) as client, ThreadPoolExecutor(1) as pool, \
            grpc.insecure_channel(daemon.grpc_address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        assert client.get("/health/ready").status_code == 200
        assert health.Check(health_pb2.HealthCheckRequest(service="")).status == \
            health_pb2.HealthCheckResponse.SERVING
        held = pool.submit(client.post, "/v2/models/slow/infer",
                           json=loop_request(loop_model.trips_for(3.0)))
        wait_for_status(client, "slow", lambda m: m["in_flight"] == 1)
        mark = daemon.mark()
        daemon.signal(signal.SIGTERM)
        daemon.wait_for_log("shutdown_requested", start=mark)
        # The request under way holds the drain open; meanwhile, on new connections too:
        with httpx.Client(base_url=daemon.url, timeout=30) as fresh:
            ready = fresh.get("/health/ready")
            assert ready.status_code == 503
            assert fresh.get("/v2/health/ready").status_code == 503
            assert fresh.get("/health/live").status_code == 200  # still alive
            refused = fresh.post("/v2/models/slow/infer", json=loop_request(1))
            assert refused.status_code == 503
            assert "shutting down" in refused.json()["error"]
            assert refused.headers["retry-after"] == "1"
        assert health.Check(health_pb2.HealthCheckRequest(service="")).status == \
            health_pb2.HealthCheckResponse.NOT_SERVING
        answer = held.result(timeout=60)
        assert answer.status_code == 200, answer.text  # the call under way finished
    assert daemon.wait(60) == 0
