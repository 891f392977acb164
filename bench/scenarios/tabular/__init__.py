"""A tabular classifier as its users export it (issue 33): scikit-learn's RandomForestClassifier
(100 trees, the library's defaults) on 30 features, exported by skl2onnx's `to_onnx(model, X)`
with its defaults (a ZipMap output, served as FP32 [N, 3]), one row per request at c64.

- SnoozeML serves the .onnx file: preloaded, `intra_op_threads = 1`, 64 rows per batch with
  `max_delay = "0ms"`; mean rows per batch from `/admin/status` over the measured window.
- MLServer serves the same fitted model with its own scikit-learn runtime (mlserver-sklearn,
  the model as a joblib file), installed into its own venv: its defaults (one inference
  worker), two workers, and adaptive batching (64 rows, 2 ms).
- The daemon's floor: a null model (one Relu, `x` FP32 [N, 30]) in the same daemon, same
  request shape, same batching.
- The ceiling: onnxruntime in this process on the same graph as the daemon serves it (ZipMap
  rewritten, runtime/onnx/ml_outputs.py), one intra-op thread, at the batch size the daemon
  formed, and at 1 and 64.

Every server answers `predict_proba` only, checked against the fitted model (1e-5) before and
after its load; wrk sends the same one-row JSON body to each.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from harness.cli import Bench
from harness.config import write_config
from harness.load import run_wrk
from harness.oip import new_session
from harness.report import Outcome, table, yes
from harness.status import batch_counters, wait_idle
from harness.timing import Latency, warm_then_time
from models import write_null

from scenarios.tabular.mlserver import (
    DEFAULT_MLSERVER_VENV,
    MLServer,
    install_mlserver,
    write_repository,
)

FEATURES = 30
TREES = 100
NAME = "forest"
AIM_MLSERVER = 5.0
AIM_CEILING = 0.8
ATOL = 1e-5
# (label, inference workers, adaptive batching (rows, seconds) or None)
MLSERVER_VARIANTS = (("defaults (1 worker)", 1, None), ("2 workers", 2, None),
                     ("adaptive batching (64 rows, 2 ms)", 1, (64, 0.002)))


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mlserver-venv", type=Path, default=DEFAULT_MLSERVER_VENV,
                        help=f"venv holding mlserver; installed there if missing "
                             f"({DEFAULT_MLSERVER_VENV})")
    parser.add_argument("--install-timeout", type=float, default=900.0,
                        help="seconds for pip to install mlserver (900)")


@dataclass
class Run:
    server: str
    wrk: dict[str, Any]
    rows_per_batch: float | None = None

    @property
    def per_s(self) -> float:
        return float(self.wrk["requests_per_s"])


def make_model(workdir: Path) -> tuple[Any, np.ndarray]:
    """The fitted forest, written as model.onnx (skl2onnx's defaults) and model.joblib."""
    import joblib
    from skl2onnx import to_onnx
    from sklearn.datasets import make_classification
    from sklearn.ensemble import RandomForestClassifier

    x, y = make_classification(5000, FEATURES, n_informative=15, n_classes=3, random_state=0)
    x = x.astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = RandomForestClassifier(TREES, random_state=0).fit(x, y)
        (workdir / "model.onnx").write_bytes(to_onnx(model, x[:1]).SerializeToString())
    joblib.dump(model, workdir / "model.joblib")
    return model, x


def body(row: np.ndarray, input_name: str, output: str) -> dict[str, Any]:
    return {"inputs": [{"name": input_name, "shape": [1, FEATURES], "datatype": "FP32",
                        "data": [float(v) for v in row.ravel()]}],
            "outputs": [{"name": output}]}


def check(url: str, payload: dict[str, Any], output: str, expected: np.ndarray) -> None:
    response = httpx.post(url, json=payload, timeout=30)
    if response.status_code != 200:
        raise RuntimeError(f"{url}: {response.status_code} {response.text[:300]}")
    (out,) = [o for o in response.json()["outputs"] if o["name"] == output]
    got = np.asarray(out["data"], np.float64).reshape(expected.shape)
    if not np.allclose(got, expected, rtol=0, atol=ATOL):
        raise RuntimeError(f"{url}: {got} is not predict_proba's {expected}")


def measure(url: str, body_file: Path, args: argparse.Namespace, label: str,
            warm: bool = True) -> dict[str, Any]:
    connections = args.concurrency[0]
    if warm:
        run_wrk(url, body_file, 2, connections, min(args.warm_up, args.duration))
    result = run_wrk(url, body_file, 2, connections, args.duration)
    print(f"{label} -c{connections}: {json.dumps(result)}", file=sys.stderr)
    return result


def run(bench: Bench) -> Outcome:
    args, workdir = bench.args, bench.workdir
    model, x = make_model(workdir)
    row = x[:1].round(4)
    expected = model.predict_proba(row)
    runs = serve_snoozeml(bench, row, expected)
    setup = install_mlserver(args.mlserver_venv, args.install_timeout)
    print(setup.note, file=sys.stderr)
    if setup.executable is not None:
        payload = body(row, "input-0", "predict_proba")
        (workdir / "mlserver.json").write_text(json.dumps(payload))
        for label, workers, batching in MLSERVER_VARIANTS:
            folder = write_repository(workdir / f"mlserver-{workers}-{bool(batching)}", NAME,
                                      workdir / "model.joblib", batching)
            server = MLServer(setup.executable, folder, NAME, workers, workdir / "mlserver.log")
            try:
                url = f"{server.base_url}/v2/models/{NAME}/infer"
                check(url, payload, "predict_proba", expected)
                runs.append(Run(f"MLServer {label}",
                                measure(url, workdir / "mlserver.json", args, label)))
                check(url, payload, "predict_proba", expected)
            finally:
                server.stop()
    batch = max(1, round(runs[0].rows_per_batch or 1))
    ceilings = ceiling(workdir, x, sorted({1, batch, 64}), args.duration)
    return Outcome(report(bench, runs, ceilings, batch, setup.note),
                   {"runs": runs, "ceilings": ceilings})


def serve_snoozeml(bench: Bench, row: np.ndarray, expected: np.ndarray) -> list[Run]:
    """The forest, then the null model (the daemon's own floor for this request) beside it."""
    args, workdir = bench.args, bench.workdir
    write_null(workdir / "null.onnx", FEATURES)
    config = write_config(workdir / "models.toml", [
        {"name": name, "path": f"{name if name == 'null' else 'model'}.onnx", "preload": True,
         "intra_op_threads": 1, "batching": {"max_batch_size": 64, "max_delay": "0ms"}}
        for name in (NAME, "null")], server={"idle_timeout": "never"})
    payloads = {NAME: body(row, "X", "output_probability"), "null": body(row, "x", "y")}
    runs = []
    with bench.serve(config, [NAME, "null"]) as daemon:
        check(daemon.infer_url(NAME), payloads[NAME], "output_probability", expected)
        for name, label in ((NAME, "SnoozeML"), ("null", "SnoozeML, null model (Relu)")):
            url, file = daemon.infer_url(name), workdir / f"{name}.json"
            file.write_text(json.dumps(payloads[name]))
            run_wrk(url, file, 2, args.concurrency[0], min(args.warm_up, args.duration))
            before = batch_counters(wait_idle(daemon.client, name))
            wrk = measure(url, file, args, label, warm=False)
            after = batch_counters(wait_idle(daemon.client, name))
            batches, rows = after[0] - before[0], after[1] - before[1]
            runs.append(Run(label, wrk, rows / batches if batches else None))
        check(daemon.infer_url(NAME), payloads[NAME], "output_probability", expected)
    return runs


def ceiling(workdir: Path, x: np.ndarray, batches: list[int],
            duration_s: float) -> dict[int, Latency]:
    """onnxruntime on the graph the daemon serves (ZipMap rewritten), one intra-op thread."""
    from snoozeml.runtime.onnx.ml_outputs import write_tensor_form_blocking

    served = workdir / "served.onnx"
    write_tensor_form_blocking(workdir / "model.onnx", served)
    session = new_session(served)
    return {batch: warm_then_time(
        lambda feed={"X": x[:batch]}: session.run(["output_probability"], feed), duration_s)
        for batch in batches}


def report(bench: Bench, runs: list[Run], ceilings: dict[int, Latency], batch: int,
           setup: str) -> str:
    args = bench.args
    lines = bench.header(
        f"## Tabular: RandomForestClassifier ({TREES} trees, {FEATURES} features, 3 classes), "
        f"one row per request at c{args.concurrency[0]}",
        f"{args.duration:g} s per run after a {args.warm_up:g} s wrk warm-up (-t2); every "
        "server answers predict_proba, checked against scikit-learn (1e-5)",
        f"SnoozeML: skl2onnx `to_onnx(model, X)` defaults (ZipMap); MLServer: {setup}")
    lines += table(["server", "requests/s", "p50 ms", "p99 ms", "rows/batch", "errors"],
                   [(r.server, f"{r.per_s:,.0f}", f"{r.wrk['p50_ms']:.2f}",
                     f"{r.wrk['p99_ms']:.2f}",
                     f"{r.rows_per_batch:.1f}" if r.rows_per_batch else "-", r.wrk["errors"])
                    for r in runs], "lrrrrr")
    lines += ["", "### In-process onnxruntime ceiling (the served graph, 1 intra-op thread)", ""]
    lines += table(["batch", "calls/s", "rows/s", "p50 ms per call"],
                   [(b, f"{c.per_s:,.0f}", f"{c.per_s * b:,.0f}", f"{c.p50_ms:.3f}")
                    for b, c in ceilings.items()], "rrrr")
    ours, null = runs[0].per_s, runs[1].per_s
    best = max((r for r in runs[2:]), key=lambda r: r.per_s, default=None)
    rows_s = ceilings[batch].per_s * batch
    lines += ["", "### Against the aims of issue 33", ""]
    aims = [(f"SnoozeML >= {AIM_CEILING:g}x the ceiling at the batch formed ({batch} rows)",
             f"{ours / rows_s:.2f}x ({ours:,.0f} / {rows_s:,.0f} rows/s)",
             yes(ours >= AIM_CEILING * rows_s))]
    if best is not None:
        aims.insert(0, (f"SnoozeML >= {AIM_MLSERVER:g}x MLServer's best ({best.server})",
                        f"{ours / best.per_s:.1f}x ({ours:,.0f} / {best.per_s:,.0f} req/s)",
                        yes(ours >= AIM_MLSERVER * best.per_s)))
    lines += table(["aim", "ours", "met"], aims, "lrl")
    lines += ["", f"- The forest is served at {ours / null:.2f}x the daemon's null model (a Relu "
              f"on the same one-row JSON request, {null:,.0f} req/s): the request path, not "
              "the model, sets the pace; the in-process ceiling at that batch is "
              f"{rows_s / null:.1f}x the null model's rate."]
    return "\n".join(lines) + "\n"
