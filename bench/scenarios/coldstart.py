"""How fast a model comes back after an idle unload, the memory its load holds at its peak,
warm throughput once loaded, and what a budget holds (issue 14).

Models: ``big.onnx``, a 100 MB single-file model (x [N, 5000] -> MatMul 5000x5000 -> MatMul
5000x16, FP32 random weights), and three ~96 MiB models of that shape for the capacity check;
one thread per session. In one sitting, rounds (``--rounds``) alternated:

1. raw onnxruntime, a fresh process per round: ``InferenceSession(path)`` plus one one-row run,
   and its peak RSS above the process's RSS before it (VmHWM after a reset);
2. rehydration through the daemon: the time of the first one-row JSON request after an unload
   for ``big`` (the defaults: weights cache, ``prepack = "auto"``) and ``plain`` (the same file,
   ``weights_cache = false``), with each load's time, size, reserved and real peaks from its
   ``model_loaded`` line;
3. first-ever load: a new daemon with an empty cache folder per round, ``big`` next to ``plain``,
   and how long writing the entry took afterwards (``onnx_cache_built``);
4. warm batch-64 latency in process: SnoozeML's instance before and after its pre-packing
   upgrade next to a default onnxruntime session;
5. capacity: three models under ``host_budget = "300MiB"``, entries built beforehand: all three
   asked for in turn, evictions counted, the daemon's peak RSS above its baseline;
6. MiniLM through torch (the ``coldstart_torch`` scenario) and MiniLM's ONNX export (685 nodes)
   through the daemon, mapped next to the default load.
"""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnx
from harness.cli import Bench
from harness.config import write_config
from harness.cpu import reset_peak, status_bytes
from harness.oip import infer_body
from harness.report import Outcome, table
from harness.rounds import median_or_nan as median
from harness.rounds import spread
from harness.status import admin_status
from harness.timing import elapsed_ms
from onnx import TensorProto, helper, numpy_helper

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


class ColdStart:
    """This scenario's folder, body and daemons: each with its own log watch and its own
    ``XDG_CACHE_HOME`` (the weights cache)."""

    def __init__(self, bench: Bench) -> None:
        self.bench = bench
        self.folder = bench.workdir
        self.big = write_model(self.folder / "big.onnx", 0)
        self.body = infer_body(np.ones((1, WIDTH), np.float32))
        self.configs = 0

    def serve(self, models: list[dict[str, Any]], loads: Loads, cache: str = "cache",
              **server: Any) -> Any:
        self.configs += 1
        config = write_config(self.folder / f"models-{self.configs}.toml", models, server={
            "idle_timeout": "never", "log_level": "info", **server})
        env = {**os.environ, "XDG_CACHE_HOME": str(self.folder / cache)}
        return self.bench.serve(config, on_line=loads, env=env, timeout_s=120)

    def pair(self, path: Path, name: str = "big", plain: str = "plain") -> list[dict[str, Any]]:
        """The file twice: mapped (the defaults) and a default load."""
        return [{"name": name, "path": str(path)},
                {"name": plain, "path": str(path), "weights_cache": False}]

    def first_request_ms(self, client: httpx.Client, name: str,
                         body: dict[str, Any] | None = None) -> float:
        ms, response = elapsed_ms(lambda: client.post(f"/v2/models/{name}/infer",
                                                      json=body or self.body))
        if response.status_code != 200:
            raise RuntimeError(f"{name}: {response.status_code} {response.text[:500]}")
        return float(ms)

    def after_unload_ms(self, client: httpx.Client, name: str,
                        body: dict[str, Any] | None = None) -> float:
        client.post(f"/v2/repository/models/{name}/unload").raise_for_status()
        return self.first_request_ms(client, name, body)


def rehydration(cs: ColdStart) -> list[str]:
    """Parts 1 and 2: raw onnxruntime in a fresh process and the daemon's rehydrations,
    alternated."""
    loads = Loads()
    raw: list[dict[str, float]] = []
    served: dict[str, list[float]] = {"big": [], "plain": []}
    seen: dict[str, list[dict[str, float]]] = {"big": [], "plain": []}
    with cs.serve(cs.pair(cs.big), loads) as daemon:
        cs.first_request_ms(daemon.client, "big")  # writes the entry: not a rehydration
        cs.first_request_ms(daemon.client, "plain")
        loads.wait_built("big")
        for _ in range(cs.bench.args.rounds):
            raw.append(raw_load(cs.big))
            for name in served:
                served[name].append(cs.after_unload_ms(daemon.client, name))
                seen[name].append(loads.last(name))
    raw_ms = median([r["ms"] for r in raw])
    rows = [("raw `InferenceSession` + one run, fresh process",
             spread([r["ms"] for r in raw], ".0f"), "",
             f"{median([r['resident'] / MIB for r in raw]):.0f}", "",
             f"{median([r['peak'] / MIB for r in raw]):.0f}", "1.00")]
    for name, label in (("plain", "SnoozeML, default load (`weights_cache = false`)"),
                        ("big", "SnoozeML, mapped weights (defaults)")):
        rows.append((label, spread(served[name], ".1f"),
                     f"{median([s['ms'] for s in seen[name]]):.1f}",
                     *(f"{median([s[key] / MIB for s in seen[name]]):.0f}"
                       for key in ("bytes", "reserved", "peak")),
                     f"{median(served[name]) / raw_ms:.2f}"))
    big = seen["big"]
    ratio = median([s["peak"] for s in big]) / median([s["bytes"] for s in big])
    lines = ["## Rehydration of the 100 MB ONNX model (first request after an unload)", ""]
    lines += table(["path", "first request ms (median, min to max)", "load ms in the daemon",
                    "measured size MiB", "reserved peak MiB", "real peak MiB", "x raw"], rows,
                   "lllllll")
    return [*lines, "", f"Mapped load: real peak / measured size = {ratio:.2f}; the "
            f"reservation covered the real peak in {sum(s['reserved'] >= s['peak'] for s in big)}"
            f"/{len(big)} loads.", ""]


def first_ever(cs: ColdStart) -> list[str]:
    """Part 3: first-ever loads, each in a new daemon with an empty cache."""
    first: dict[str, list[float]] = {"big": [], "plain": []}
    build_ms: list[float] = []
    for index in range(max(3, cs.bench.args.rounds // 2)):
        loads = Loads()
        with cs.serve(cs.pair(cs.big), loads, cache=f"fresh-{index}") as daemon:
            for name in ("big", "plain") if index % 2 == 0 else ("plain", "big"):
                first[name].append(cs.first_request_ms(daemon.client, name))
            loads.wait_built("big")
            build_ms.append(loads.build_ms["big"])
    lines = ["## First-ever load (no entry yet: a default load, the entry written after it)", ""]
    lines += table(["path", "first request ms (median, min to max)"], [
        ("default load", spread(first["plain"], ".0f")),
        ("the same with the weights cache on", spread(first["big"], ".0f")),
        ("ratio", f"{median(first['big']) / median(first['plain']):.2f}")], "ll")
    return [*lines, "", "Writing the entry afterwards, in the background: "
            f"{spread(build_ms, '.0f')} ms.", ""]


def warm_batch(cs: ColdStart) -> list[str]:
    """Part 4: batch-64 latency in process, SnoozeML's instance before and after its
    pre-packing upgrade next to a default session, alternated."""
    import onnxruntime as ort

    from snoozeml.config.settings import ModelConfig
    from snoozeml.runtime.onnx.backend import OnnxBackend

    x = np.random.default_rng(3).standard_normal((64, WIDTH), dtype=np.float32)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    default = ort.InferenceSession(str(cs.big), options, providers=["CPUExecutionProvider"])
    spec = ModelConfig(name="big", path=cs.big, format="onnx", device="cpu")
    instance = OnnxBackend(cs.folder / "cache" / "onnx").load_blocking(spec)
    timings: dict[str, list[float]] = {"default": [], "unpacked": [], "upgraded": []}
    calls = {"default": lambda: default.run(None, {"x": x}),
             "mapped": lambda: instance.run_blocking({"x": x}, None)}
    for _ in range(3):
        calls["default"]()
        calls["mapped"]()
    for phase in ("unpacked", "upgraded"):
        if phase == "upgraded":
            instance.upgrade_blocking()
        for _ in range(cs.bench.args.rounds * 2):
            timings["default"].append(elapsed_ms(calls["default"])[0])
            timings[phase].append(elapsed_ms(calls["mapped"])[0])
    instance.close()
    base = median(timings["default"])
    lines = ["## Warm batch-64 latency, in process (ms per run of 64 rows)", ""]
    lines += table(["session", "ms (median, min to max)", "x default"], [
        (label, spread(timings[name], ".1f"), f"{median(timings[name]) / base:.2f}")
        for name, label in (("default", "onnxruntime default session"),
                            ("unpacked", "SnoozeML mapped, before its upgrade"),
                            ("upgraded", "SnoozeML mapped, after its pre-packing upgrade"))],
        "lll")
    return [*lines, ""]


def capacity(cs: ColdStart) -> list[str]:
    """Part 5: three ~96 MiB models under a 300 MiB budget, entries written beforehand."""
    paths = [write_model(cs.folder / f"cap_{n}.onnx", seed) for seed, n in enumerate("abc", 1)]
    loads = Loads()
    with cs.serve([{"name": p.stem, "path": str(p)} for p in paths], loads, idle_timeout="10m",
                  memory={"host_budget": "300MiB", "min_residency": "0s"}) as daemon:
        client = daemon.client
        for path in paths:  # write the entries (a first load may evict: not measured)
            cs.first_request_ms(client, path.stem)
            loads.wait_built(path.stem)
        for path in paths:
            client.post(f"/v2/repository/models/{path.stem}/unload").raise_for_status()
        time.sleep(1.0)  # let the allocator settle before the baseline (a measurement)
        baseline = status_bytes("VmRSS", daemon.pid) or 0
        reset_peak(daemon.pid)
        evictions_before = admin_status(client)["evictions"]
        for path in paths:
            cs.first_request_ms(client, path.stem)
        status = admin_status(client)
        peak = status_bytes("VmHWM", daemon.pid) or 0
    states = {m["name"]: m["state"] for m in status["models"]}
    return ["## Capacity: three ~96 MiB models under `host_budget = \"300MiB\"`", "",
            f"- states after asking for the third: {states}",
            f"- evictions before / after: {evictions_before} / {status['evictions']}",
            f"- measured sizes MiB: {[round(loads.last(p.stem)['bytes'] / MIB) for p in paths]}",
            f"- daemon baseline RSS {baseline / MIB:.0f} MiB; peak RSS above it "
            f"{(peak - baseline) / MIB:.0f} MiB (limit: budget + 10% = "
            f"{300 * 1.1:.0f} MiB)", ""]


def minilm_onnx(cs: ColdStart) -> list[str]:
    """Part 6: MiniLM's ONNX export (685 nodes: where a real model's load time goes is the
    graph, not only the weights): rehydration through the daemon, mapped (the entry holds the
    optimized graph) next to the default load."""
    from transformers import AutoModel

    from scenarios.minilm import MINILM, TOKEN_INPUTS, export_onnx

    path = cs.folder / "minilm.onnx"
    export_onnx(AutoModel.from_pretrained(str(MINILM)).eval(), path)
    tokens = np.array([[101, 7592, 2088, 102, 2023, 2003, 1037, 102]], np.int64)
    feeds = {"input_ids": tokens, "attention_mask": np.ones_like(tokens),
             "token_type_ids": np.zeros_like(tokens)}
    body = {"inputs": [{"name": name, "shape": list(feeds[name].shape), "datatype": "INT64",
                        "data": feeds[name].ravel().tolist()} for name in TOKEN_INPUTS]}
    loads = Loads()
    served: dict[str, list[float]] = {"minilm": [], "minilm_plain": []}
    loaded: dict[str, list[float]] = {"minilm": [], "minilm_plain": []}
    with cs.serve(cs.pair(path, "minilm", "minilm_plain"), loads) as daemon:
        for name in served:
            cs.first_request_ms(daemon.client, name, body)
        loads.wait_built("minilm")
        for _ in range(cs.bench.args.rounds):
            for name in served:
                served[name].append(cs.after_unload_ms(daemon.client, name, body))
                loaded[name].append(loads.last(name)["ms"])
    lines = ["## MiniLM's ONNX export: rehydration through the daemon (8 tokens)", ""]
    lines += table(["path", "first request ms (median, min to max)", "load ms in the daemon"], [
        ("default load (`weights_cache = false`)", spread(served["minilm_plain"], ".1f"),
         spread(loaded["minilm_plain"], ".1f")),
        ("mapped, optimized graph (defaults)", spread(served["minilm"], ".1f"),
         spread(loaded["minilm"], ".1f")),
        ("ratio (first request)",
         f"{median(served['minilm']) / median(served['minilm_plain']):.2f}", "")], "lll")
    return [*lines, ""]


def run(bench: Bench) -> Outcome:
    cs = ColdStart(bench)
    lines = bench.header(f"# Cold starts ({time.strftime('%Y-%m-%d')})")
    lines += rehydration(cs) + first_ever(cs) + warm_batch(cs) + capacity(cs)
    try:
        from scenarios import coldstart_torch
    except ImportError as exc:
        lines += [f"## MiniLM (torch): not measured ({exc})", ""]
    else:
        lines += coldstart_torch.report(coldstart_torch.measure_torch(max(bench.args.rounds, 9)))
        lines += minilm_onnx(cs)
    return Outcome("\n".join(lines))
