"""The table of scenarios: name -> module, one line for ``--list``, a rough duration at the
defaults, the common options each takes (with its defaults) and its parts (``--only``).

Each module (or package) holds only what is its own: ``add_options(parser)`` for its extra
options, and ``run(bench) -> Outcome``. Importing this table imports none of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Scenario:
    module: str
    summary: str
    duration: str
    common: dict[str, Any] = field(default_factory=dict)
    parts: tuple[str, ...] = ()
    wrk: bool = True  # needs wrk (bash bench/setup.sh)


SCENARIOS: dict[str, Scenario] = {
    "http": Scenario(
        "http", "MLP 64-256-64 over JSON HTTP at c1/c64, the in-process floor, cold starts "
        "(issue 2)", "~1 min", {"duration": 10.0, "warm_up": 2.0, "concurrency": [1, 64]}),
    "batching": Scenario(
        "batching", "micro-batching on and off, MLP 512-2048-2048-512 at c1/16/64 (issue 3)",
        "~2 min", {"duration": 10.0, "warm_up": 2.0}),
    "torch": Scenario(
        "minilm_torch", "all-MiniLM-L6-v2 through torch and its ONNX export: cold starts, "
        "warm sentences/s (issue 6)", "~3 min",
        {"duration": 10.0, "warm_up": 3.0, "concurrency": [32]}, wrk=False),
    "protocols": Scenario(
        "protocols", "JSON HTTP vs binary HTTP vs gRPC, one row and a 38.5 MB batch (issue 4)",
        "~3 min", {"duration": 10.0, "warm_up": 2.0}, wrk=False),
    "memory": Scenario(
        "memory", "Zipf traffic over 20 models of 100 MiB under a 500 MiB budget (issue 5)",
        "~80 s", {"duration": 60.0, "concurrency": [16], "seed": 1}, wrk=False),
    "compare": Scenario(
        "compare", "two versions of the daemon side by side, paired interleaved bursts "
        "(issue 10)", "~12 min", {"duration": 3.0, "warm_up": 2.0, "rounds": 12}),
    "replicas": Scenario(
        "replicas", "replica autoscaling: one replica against two, and the count over a "
        "spike (issue 11)", "~4 min",
        {"duration": 10.0, "warm_up": 2.0, "rounds": 3, "concurrency": [32], "wrk_threads": 1},
        ("throughput", "timeline")),
    "auth": Scenario(
        "auth", "auth off vs API key vs JWT, in-process and end to end (issue 12)", "~4 min",
        {"duration": 10.0, "warm_up": 2.0, "rounds": 3, "concurrency": [1, 32],
         "wrk_threads": 1}, ("in-process", "end-to-end")),
    "metrics": Scenario(
        "metrics", "Prometheus metrics on vs off, in-process and at c64 (issue 13)", "~2 min",
        {"duration": 10.0, "warm_up": 2.0, "rounds": 3, "concurrency": [64], "wrk_threads": 2},
        ("in-process", "end-to-end")),
    "coldstart": Scenario(
        "coldstart", "rehydration of a 100 MB ONNX model, load peaks, capacity, MiniLM "
        "(issue 14)", "~3 min", {"rounds": 7}, wrk=False),
    "coldstart_torch": Scenario(
        "coldstart_torch", "MiniLM's torch load in a warm process: from_pretrained vs "
        "SnoozeML's", "~1 min", {"rounds": 15}, wrk=False),
    "soak": Scenario(
        "soak", "mixed HTTP/gRPC trouble for 10 minutes; fails on a wrong answer or a leak "
        "(issue 15)", "10 min", {"duration": 600.0, "warm_up": "20%", "seed": 1}, wrk=False),
    "throughput": Scenario(
        "throughput", "null model vs MLP over JSON/binary/gRPC at c1/16/64, ceiling, py-spy "
        "(issue 19)", "~10 min",
        {"duration": 5.0, "warm_up": 1.0, "rounds": 2, "concurrency": [1, 16, 64]}),
    "embeddings": Scenario(
        "embeddings", "MiniLM sentences/s: /v1/embeddings vs OIP vs infinity vs in-process "
        "(issue 18)", "~10 min",
        {"duration": 20.0, "warm_up": 5.0, "rounds": 3, "concurrency": [32]}),
    "rerank": Scenario(
        "rerank", "MiniLM cross-encoder pairs/s, 32 documents a request at c16: /v1/rerank "
        "and /rerank vs infinity vs CrossEncoder.predict (issue 32)", "~7 min",
        {"duration": 20.0, "warm_up": 8.0, "rounds": 3, "concurrency": [16]}, wrk=False),
    "forward": Scenario(
        "forward", "MiniLM embeddings and cross-encoder forward passes alone at each batch size "
        "a server forms: the ceiling of any server of the engine (issue 32)", "~3 min",
        {"duration": 6.0, "rounds": 3}, wrk=False),
    "images": Scenario(
        "images", "MobileNetV3-Small fed 640x480 JPEGs over binary HTTP at c16 vs the "
        "in-process decode + preprocess + run ceiling (issue 33)", "~2 min",
        {"duration": 10.0, "warm_up": 2.0, "concurrency": [16], "rounds": 3}),
    "tabular": Scenario(
        "tabular", "RandomForest (skl2onnx defaults) at c64 vs MLServer's sklearn runtime "
        "and the in-process ceiling (issue 33)", "~3 min",
        {"duration": 10.0, "warm_up": 2.0, "concurrency": [64]}),
    "keepalive": Scenario(
        "keepalive", "fixed vs adaptive keep-alive, LRU vs cost-aware eviction, on a seeded "
        "Azure-like trace of 60 models over 12 h, simulated; a slice replayed live (issue 34)",
        "~1 min + 4 min", {}, ("simulation", "replay"), wrk=False),
    "http_servers": Scenario(
        "http_servers", "one JSON inference under uvicorn, granian and the daemon's own "
        "protocol (issue 19)", "~2 min",
        {"duration": 4.0, "warm_up": 1.0, "rounds": 3, "concurrency": [1, 64]}),
    "grpc_floor": Scenario(
        "grpc_floor", "the daemon over gRPC next to an empty grpc.aio servicer and HTTP "
        "(issue 19)", "~2 min",
        {"duration": 4.0, "warm_up": 1.0, "rounds": 3, "concurrency": [1, 64]}),
    "startup": Scenario(
        "startup", "start-up time and idle RSS, the daemon next to a bare Starlette app",
        "~1 min", {"rounds": 5}, wrk=False),
    "monitor_screenshot": Scenario(
        "monitor_screenshot", "regenerate docs/monitor.svg: snooze monitor during load and "
        "evictions", "~15 s", {"duration": 12.0}, wrk=False),
}
