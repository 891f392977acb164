"""Triton's statistics extension against a real daemon (issue 13, Done means 2): after known
traffic over HTTP and gRPC, tritonclient's own `get_inference_statistics` on both transports
returns the counts sent. Batching is off, so every request is one run of its own rows."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from daemon import Daemon
from onnx_models import write_mlp
from tritonclient.utils import InferenceServerException

CONFIG = """
[[models]]
name = "mlp"
path = "mlp.onnx"
[models.batching]
max_batch_size = 0

[[models]]
name = "quiet"
path = "mlp.onnx"
"""

HTTP_ROWS = [1, 1, 1, 2]  # one request each
GRPC_ROWS = [1, 1, 3]


@pytest.fixture(scope="module")
def daemon(module_serve: Any, tmp_path_factory: pytest.TempPathFactory) -> Daemon:
    folder = tmp_path_factory.mktemp("statistics")
    write_mlp(folder / "mlp.onnx", dims=(4, 8, 2))
    return module_serve(CONFIG, directory=folder)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def http(daemon: Daemon) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{daemon.http_port}")
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc(daemon: Daemon) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(daemon.grpc_address)
    yield client
    client.close()


def tensor(module: Any, rows: int, columns: int = 4) -> Any:
    x = np.ones((rows, columns), np.float32)
    value = module.InferInput("x", list(x.shape), "FP32")
    value.set_data_from_numpy(x)
    return value


@pytest.fixture(scope="module")
def traffic(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> tuple[int, int]:
    """The known traffic, once per module: the epoch ms before the first request and after
    the last."""
    before = int(time.time() * 1000)
    for rows in HTTP_ROWS:
        http.infer("mlp", [tensor(httpclient, rows)])
    for rows in GRPC_ROWS:
        grpc.infer("mlp", [tensor(grpcclient, rows)])
    with pytest.raises(InferenceServerException) as bad:  # 5 columns, not 4
        http.infer("mlp", [tensor(httpclient, 1, columns=5)])
    assert bad.value.status() == "400"
    return before, int(time.time() * 1000) + 1


def count(duration: dict[str, Any]) -> int:
    """A StatisticDuration's count, from either client: protobuf's JSON writes uint64 as a
    string and leaves out zeros."""
    return int(duration.get("count", 0))


def ns(duration: dict[str, Any]) -> int:
    return int(duration.get("ns", 0))


def check_mlp(stats: dict[str, Any], traffic: tuple[int, int]) -> None:
    requests = len(HTTP_ROWS) + len(GRPC_ROWS)
    assert stats["name"] == "mlp"
    assert stats["version"] == "1"
    assert int(stats["inference_count"]) == sum(HTTP_ROWS) + sum(GRPC_ROWS)
    assert int(stats["execution_count"]) == requests  # batching off: one run per request
    before, after = traffic
    assert before <= int(stats["last_inference"]) <= after
    inference = stats["inference_stats"]
    assert count(inference["success"]) == requests
    assert count(inference["fail"]) == 1
    assert count(inference["queue"]) == requests
    assert count(inference["compute_infer"]) == requests
    assert ns(inference["success"]) > ns(inference["compute_infer"]) > 0
    assert ns(inference["fail"]) > 0
    sizes = {int(batch.get("batch_size", 0)): batch for batch in stats["batch_stats"]}
    assert sorted(sizes) == [1, 2, 3]
    assert count(sizes[1]["compute_infer"]) == 5
    assert count(sizes[2]["compute_infer"]) == 1
    assert count(sizes[3]["compute_infer"]) == 1


def test_tritonclient_http_reads_the_counts_of_the_traffic(
    http: httpclient.InferenceServerClient, traffic: tuple[int, int]
) -> None:
    (stats,) = http.get_inference_statistics("mlp")["model_stats"]
    check_mlp(stats, traffic)
    (versioned,) = http.get_inference_statistics("mlp", "1")["model_stats"]
    assert versioned["execution_count"] == stats["execution_count"]


def test_tritonclient_grpc_reads_the_same_counts(
    grpc: grpcclient.InferenceServerClient, traffic: tuple[int, int]
) -> None:
    (stats,) = grpc.get_inference_statistics("mlp", as_json=True)["model_stats"]
    check_mlp(stats, traffic)
    message = grpc.get_inference_statistics("mlp", "1")  # the protobuf itself
    (versioned,) = message.model_stats
    assert versioned.inference_count == sum(HTTP_ROWS) + sum(GRPC_ROWS)
    assert versioned.inference_stats.fail.count == 1


def test_every_configured_model_is_listed_without_a_name(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient,
    traffic: tuple[int, int],
) -> None:
    over_http = http.get_inference_statistics()["model_stats"]
    assert [s["name"] for s in over_http] == ["mlp", "quiet"]
    quiet = over_http[1]
    assert (quiet["inference_count"], quiet["execution_count"], quiet["last_inference"]) == (
        0, 0, 0)
    assert quiet["inference_stats"]["success"] == {"count": 0, "ns": 0}
    assert quiet["batch_stats"] == []
    over_grpc = grpc.get_inference_statistics(as_json=True)["model_stats"]
    assert [s["name"] for s in over_grpc] == ["mlp", "quiet"]
    assert int(over_grpc[0]["execution_count"]) == int(over_http[0]["execution_count"])


def test_an_unknown_model_or_version_is_not_found(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    for name, version in (("nobody", ""), ("mlp", "7")):
        with pytest.raises(InferenceServerException) as over_http:
            http.get_inference_statistics(name, version)
        assert over_http.value.status() == "404"
        with pytest.raises(InferenceServerException) as over_grpc:
            grpc.get_inference_statistics(name, version)
        assert over_grpc.value.status() == "StatusCode.NOT_FOUND"


def test_the_stats_routes_leave_model_routes_alone(daemon: Daemon, traffic: object) -> None:
    with httpx.Client(base_url=daemon.url, timeout=30) as client:
        listing = client.get("/v2/models/stats")
        assert listing.status_code == 200
        assert [s["name"] for s in listing.json()["model_stats"]] == ["mlp", "quiet"]
        assert client.head("/v2/models/stats").status_code == 200
        assert client.get("/v2/models/mlp").json()["name"] == "mlp"  # still its metadata
        assert client.get("/v2/models/mlp/versions/1/stats").status_code == 200
        assert client.post("/v2/models/stats").status_code == 405


def test_server_metadata_lists_the_extension(
    http: httpclient.InferenceServerClient, grpc: grpcclient.InferenceServerClient
) -> None:
    assert "statistics" in http.get_server_metadata()["extensions"]
    assert "statistics" in grpc.get_server_metadata().extensions
