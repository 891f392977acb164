"""`GET /metrics` against the real daemon (issue 13, Done means 1).

One daemon takes known traffic — HTTP and gRPC inferences, cold starts, an idle unload, an
eviction, bad requests on both transports and a queue-full refusal — then `/metrics`, parsed
with prometheus_client's own parser, must hold exactly the counts and label values that traffic
makes, and every histogram's count must be the number of requests (or batches) sent. Every
scrape is itself a request the next scrape counts, so the tests count their own scrapes.
Waits are on log lines and on the gauges of /metrics, never on sleeps.
"""

from __future__ import annotations

import asyncio
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
from batching_models import write_matmul_chain_model
from daemon import Daemon, write_config
from onnx_models import write_mlp
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families
from snooze_command import new_key

from snoozeml.proto import inference_pb2 as pb
from snoozeml.proto import inference_pb2_grpc as pb_grpc

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
MODELS = ("mlp", "sleepy", "big_a", "big_b", "slow")
HTTP_ROWS = (1, 2, 3, 1)  # the warm HTTP requests to mlp, after its cold one (1 row)
GRPC_REQUESTS = 3
POLL_INTERVAL = 0.005  # between two scrapes while waiting on a gauge; the deadline bounds it


def samples(text: str) -> Samples:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(found: Samples, name: str, **labels: str) -> float:
    return found[(name, frozenset(labels.items()))]


def by_label(found: Samples, name: str, label: str, **where: str) -> dict[str, float]:
    """`name`'s samples keyed by the value of `label`, among those matching `where`."""
    picked = {}
    for (sample, labelset), count in found.items():
        labels = dict(labelset)
        if sample == name and all(labels.get(k) == v for k, v in where.items()):
            picked[labels[label]] = count
    return picked


class Scraper:
    """GET /metrics, counting its own scrapes (each one a request the next one sees)."""

    def __init__(self, daemon: Daemon, headers: dict[str, str] | None = None) -> None:
        self.client = httpx.Client(base_url=daemon.url, timeout=60, headers=headers)
        self.scrapes = 0

    def __call__(self) -> Samples:
        response = self.client.get("/metrics")
        self.scrapes += 1
        assert response.status_code == 200, response.text
        assert response.headers["content-type"] == CONTENT_TYPE_LATEST
        return samples(response.text)

    def until(self, check: Any, within: float = 30.0) -> Samples:
        deadline = time.monotonic() + within
        while True:
            found = self()
            if check(found):
                return found
            if time.monotonic() > deadline:
                raise AssertionError("/metrics never satisfied the check")
            time.sleep(POLL_INTERVAL)


def rows(count: int, width: int, start: float = 0.0) -> np.ndarray:
    return np.arange(count * width, dtype=np.float32).reshape(count, width) / 10 + start


def infer_body(x: np.ndarray, name: str = "x") -> dict[str, Any]:
    return {"inputs": [{"name": name, "shape": list(x.shape), "datatype": "FP32",
                        "data": x.ravel().tolist()}]}


def grpc_request(model: str, x: np.ndarray, datatype: str = "FP32") -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="x", datatype=datatype, shape=list(x.shape))
    request.raw_input_contents.append(x.astype("<f4").tobytes())
    return request


# --- the daemon and its known traffic ---------------------------------------------------------


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("metrics")
    write_mlp(folder / "mlp.onnx", dims=(4, 8, 2))
    write_matmul_chain_model(folder / "slow.onnx")
    return folder


@pytest.fixture(scope="module")
def daemon(folder: Path, big_model: Path) -> Iterator[Daemon]:
    # A 120 MiB model loads (the default way, without the weights cache) with a 252 MiB peak
    # and then holds about 132 MiB: with 350 MiB,
    # big_b's load evicts big_a. mlp and slow are pinned, so big_a is the only victim.
    config = textwrap.dedent(f"""
        [server]
        idle_timeout = "10m"
        [server.memory]
        host_budget = "350MiB"
        min_residency = "0s"

        [[models]]
        name = "mlp"
        path = "mlp.onnx"
        device = "cpu"
        idle_timeout = "never"

        [[models]]
        name = "sleepy"
        path = "mlp.onnx"
        device = "cpu"
        idle_timeout = "1s"

        [[models]]
        name = "big_a"
        path = "{big_model}"
        weights_cache = false

        [[models]]
        name = "big_b"
        path = "{big_model}"
        weights_cache = false

        [[models]]
        name = "slow"
        path = "slow.onnx"
        device = "cpu"
        preload = true
        idle_timeout = "never"
        [models.batching]
        max_queue = 1
        """)
    daemon = Daemon(write_config(folder, config))
    try:
        daemon.start()
        daemon.wait_for_log(r"model_loaded model=slow ")
        yield daemon
    finally:
        daemon.stop()


def queue_full_on_slow(daemon: Daemon, scrape: Scraper) -> list[int]:
    """One request running on slow, one queued (max_queue 1), one refused: their statuses."""

    async def scenario() -> list[int]:
        async with httpx.AsyncClient(base_url=daemon.url, timeout=60) as client:
            def post(x: float) -> asyncio.Future[httpx.Response]:
                return asyncio.ensure_future(client.post(
                    "/v2/models/slow/infer", json=infer_body(np.array([[x]], np.float32))))

            running = post(1.0)
            await asyncio.to_thread(scrape.until, lambda m: (
                value(m, "snooze_inflight_requests", model="slow") == 1
                and value(m, "snooze_queue_depth", model="slow") == 0))
            queued = post(2.0)
            await asyncio.to_thread(scrape.until, lambda m: (
                value(m, "snooze_queue_depth", model="slow") == 1))
            refused = await post(3.0)
            return [refused.status_code, (await running).status_code,
                    (await queued).status_code]

    return asyncio.run(scenario())


@pytest.fixture(scope="module")
def traffic(daemon: Daemon) -> Iterator[tuple[Scraper, Samples]]:
    """The known traffic, then one scrape of its result."""
    scrape = Scraper(daemon)
    with (httpx.Client(base_url=daemon.url, timeout=120) as client,
          grpc.insecure_channel(daemon.grpc_address) as channel):
        # A cold start, then warm requests, over HTTP and gRPC.
        assert client.post("/v2/models/mlp/infer", json=infer_body(rows(1, 4))).status_code == 200
        for i, count in enumerate(HTTP_ROWS):
            response = client.post("/v2/models/mlp/infer", json=infer_body(rows(count, 4, i)))
            assert response.status_code == 200, response.text
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        for i in range(GRPC_REQUESTS):
            stub.ModelInfer(grpc_request("mlp", rows(1, 4, i)), timeout=60)
        # A bad request on each transport.
        bad = client.post("/v2/models/mlp/infer", json=infer_body(rows(1, 4), name="nope"))
        assert bad.status_code == 400, bad.text
        with pytest.raises(grpc.RpcError) as refused:
            stub.ModelInfer(grpc_request("mlp", rows(1, 4), datatype="FP64"), timeout=60)
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        # A cold start that ends in an idle unload.
        mark = daemon.mark()
        assert client.post("/v2/models/sleepy/infer",
                           json=infer_body(rows(1, 4))).status_code == 200
        daemon.wait_for_log(r"model_unloaded model=sleepy reason=idle", start=mark)
        # An eviction: big_b's load makes big_a go.
        big = infer_body(np.linspace(-1, 1, 16, dtype=np.float32).reshape(1, 16))
        mark = daemon.mark()
        assert client.post("/v2/models/big_a/infer", json=big).status_code == 200
        assert client.post("/v2/models/big_b/infer", json=big).status_code == 200
        daemon.wait_for_log(r"model_unloaded model=big_a reason=memory_pressure", start=mark)
    # A queue-full refusal.
    assert queue_full_on_slow(daemon, scrape) == [503, 200, 200]
    yield scrape, scrape()
    scrape.client.close()


# --- what /metrics says after it ---------------------------------------------------------------


def test_requests_are_counted_by_model_protocol_operation_and_status_code(
    traffic: tuple[Scraper, Samples],
) -> None:
    scrape, found = traffic
    counted = {
        (labels["model"], labels["protocol"], labels["operation"], labels["code"]): count
        for (name, labelset), count in found.items()
        for labels in [dict(labelset)] if name == "snooze_requests_total"
    }

    assert counted == {
        ("mlp", "http", "infer", "200"): 1 + len(HTTP_ROWS),
        ("mlp", "http", "infer", "400"): 1,
        ("mlp", "grpc", "infer", "200"): GRPC_REQUESTS,
        ("mlp", "grpc", "infer", "400"): 1,
        ("sleepy", "http", "infer", "200"): 1,
        ("big_a", "http", "infer", "200"): 1,
        ("big_b", "http", "infer", "200"): 1,
        ("slow", "http", "infer", "200"): 2,
        ("slow", "http", "infer", "503"): 1,
        # Every scrape but this one (a scrape is counted once it is answered).
        ("", "http", "metrics", "200"): scrape.scrapes - 1,
    }


def test_the_histograms_counts_are_the_requests_and_batches_sent(
    traffic: tuple[Scraper, Samples],
) -> None:
    scrape, found = traffic
    durations = by_label(found, "snooze_request_duration_seconds_count", "model",
                         protocol="http")
    assert durations == {"": scrape.scrapes - 1, "mlp": 2 + len(HTTP_ROWS), "sleepy": 1,
                         "big_a": 1, "big_b": 1, "slow": 3}
    assert by_label(found, "snooze_request_duration_seconds_count", "model",
                    protocol="grpc") == {"mlp": GRPC_REQUESTS + 1}  # shown once observed
    # Sequential requests: one batch each; the refused ones never reached a queue.
    ran = {"mlp": 1 + len(HTTP_ROWS) + GRPC_REQUESTS, "sleepy": 1, "big_a": 1, "big_b": 1,
           "slow": 2}
    assert by_label(found, "snooze_queue_duration_seconds_count", "model") == ran
    assert by_label(found, "snooze_inference_duration_seconds_count", "model") == ran
    assert by_label(found, "snooze_batch_size_count", "model") == ran
    assert value(found, "snooze_batch_size_sum", model="mlp") == \
        1 + sum(HTTP_ROWS) + GRPC_REQUESTS
    loads = dict.fromkeys(MODELS, 1)
    assert by_label(found, "snooze_model_load_duration_seconds_count", "model") == loads
    for (name, labelset), count in found.items():  # +Inf holds every observation
        if name.endswith("_bucket") and ("le", "+Inf") in labelset:
            rest = labelset - {("le", "+Inf")}
            assert found[(name.removesuffix("_bucket") + "_count", rest)] == count, name


def test_loads_unloads_and_evictions_are_counted_with_their_reasons(
    traffic: tuple[Scraper, Samples],
) -> None:
    _, found = traffic
    for model in MODELS:
        assert by_label(found, "snooze_model_loads_total", "result", model=model) == \
            {"ok": 1, "failed": 0, "deferred": 0}, model
    unloads = {(labels["model"], labels["reason"]): count
               for (name, labelset), count in found.items()
               for labels in [dict(labelset)]
               if name == "snooze_model_unloads_total" and count}
    assert unloads == {("sleepy", "idle"): 1, ("big_a", "memory_pressure"): 1}
    assert by_label(found, "snooze_evictions_total", "reason") == \
        {"memory_pressure": 1, "oom": 0}
    assert by_label(found, "snooze_queue_dropped_total", "reason", model="slow") == \
        {"full": 1, "timeout": 0, "client_gone": 0}
    assert by_label(found, "snooze_auth_failures_total", "reason", protocol="http") == \
        {"unauthenticated": 0, "forbidden": 0}


def test_the_gauges_show_states_replicas_queues_and_memory_now(
    traffic: tuple[Scraper, Samples],
) -> None:
    _, found = traffic
    current = {model: state for (name, labelset), count in found.items()
               for labels in [dict(labelset)] if name == "snooze_model_state" and count
               for model, state in [(labels["model"], labels["state"])]}
    assert current == {"mlp": "READY", "sleepy": "UNLOADED", "big_a": "UNLOADED",
                       "big_b": "READY", "slow": "READY"}
    assert sum(count for (name, _), count in found.items()
               if name == "snooze_model_state") == len(MODELS)
    assert by_label(found, "snooze_replicas", "model") == \
        {"mlp": 1, "sleepy": 0, "big_a": 0, "big_b": 1, "slow": 1}
    assert set(by_label(found, "snooze_queue_depth", "model").values()) == {0}
    assert set(by_label(found, "snooze_inflight_requests", "model").values()) == {0}
    memory = by_label(found, "snooze_model_memory_bytes", "model", device="cpu")
    assert memory["big_a"] == memory["sleepy"] == 0
    assert memory["big_b"] > 100 * 2**20
    assert value(found, "snooze_device_memory_used_bytes", device="cpu") == sum(memory.values())
    assert value(found, "snooze_device_memory_budget_bytes", device="cpu") == 350 * 2**20
    assert value(found, "process_resident_memory_bytes") > 0


# --- configuration and access -----------------------------------------------------------------


def small_config(folder: Path, extra: str = "") -> Path:
    return write_config(folder, textwrap.dedent(f"""
        {extra}
        [[models]]
        name = "one"
        path = "mlp.onnx"
        device = "cpu"

        [[models]]
        name = "two"
        path = "mlp.onnx"
        device = "cpu"
        """))


def start(config: Path) -> Daemon:
    return Daemon(config).start()


@pytest.fixture
def small(tmp_path: Path) -> Iterator[Any]:
    write_mlp(tmp_path / "mlp.onnx", dims=(4, 8, 2))
    started: list[Daemon] = []

    def serve(extra: str = "") -> Daemon:
        started.append(Daemon(small_config(tmp_path, extra)))
        return started[-1].start()

    yield serve
    for daemon in started:
        daemon.stop()


def test_per_model_off_keeps_the_model_label_and_empties_it(small: Any) -> None:
    daemon = small("[server.metrics]\nper_model = false\n")
    with httpx.Client(base_url=daemon.url, timeout=60) as client:
        for model in ("one", "two", "two"):
            response = client.post(f"/v2/models/{model}/infer", json=infer_body(rows(1, 4)))
            assert response.status_code == 200, response.text
        assert client.post("/v2/models/three/infer",
                           json=infer_body(rows(1, 4))).status_code == 404
    scrape = Scraper(daemon)
    found = scrape()
    scrape.client.close()

    models = {labels["model"] for (_, labelset) in found
              for labels in [dict(labelset)] if "model" in labels}
    assert models == {""}
    assert value(found, "snooze_requests_total", model="", protocol="http", operation="infer",
                 code="200") == 3
    assert value(found, "snooze_requests_total", model="", protocol="http", operation="infer",
                 code="404") == 1
    assert value(found, "snooze_queue_duration_seconds_count", model="") == 3
    assert value(found, "snooze_model_loads_total", model="", result="ok") == 2
    assert value(found, "snooze_model_state", model="", state="READY") == 2
    assert value(found, "snooze_replicas", model="") == 2


def test_metrics_turned_off_answers_404_and_inference_still_serves(small: Any) -> None:
    daemon = small("[server.metrics]\nenabled = false\n")
    with httpx.Client(base_url=daemon.url, timeout=60) as client:
        response = client.get("/metrics")
        assert response.status_code == 404
        assert response.json() == {"error": "metrics are off ([server.metrics] enabled = false)"}
        assert client.post("/v2/models/one/infer",
                           json=infer_body(rows(1, 4))).status_code == 200


def test_metrics_need_a_readonly_key_with_auth_on_unless_made_public(small: Any) -> None:
    key, entry = new_key("readonly", "scraper")
    daemon = small(f"[auth]\napi_keys = [{entry}]\n")
    with httpx.Client(base_url=daemon.url, timeout=60) as client:
        refused = client.get("/metrics")
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"] == "Bearer"
    scrape = Scraper(daemon, headers={"Authorization": f"Bearer {key}"})
    found = scrape()
    scrape.client.close()
    assert value(found, "snooze_auth_failures_total", protocol="http",
                 reason="unauthenticated") == 1
    assert value(found, "snooze_requests_total", model="", protocol="http",
                 operation="metrics", code="401") == 1

    public = small(f"[auth]\nmetrics_public = true\napi_keys = [{entry}]\n")
    with httpx.Client(base_url=public.url, timeout=60) as client:
        assert client.get("/metrics").status_code == 200
        assert client.post("/v2/models/one/infer",
                           json=infer_body(rows(1, 4))).status_code == 401
        assert client.get("/admin/status").status_code == 401
