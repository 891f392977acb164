"""A tabular classifier as its users export it (issue 33): scikit-learn's RandomForestClassifier
(100 trees, the library's defaults) on 30 features, exported by skl2onnx's `to_onnx(model, X)`
with its defaults (a ZipMap output, served as FP32 [N, 3]), one row per request at c64.
`--train-rows` sets the forest's size: with the defaults (max_depth=None) its trees grow with
the rows they are fitted on (about 1,350 nodes each at 5,000 rows, 33,000 at 200,000); the
fitted model is kept in `--model-cache` (one folder per size and scikit-learn version).

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
import shutil
import sys
import warnings
from dataclasses import dataclass
from importlib.metadata import version
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
TRAIN_ROWS = 5000
DEFAULT_MODEL_CACHE = DEFAULT_MLSERVER_VENV.parent / "snooze-bench-tabular"
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
    parser.add_argument("--train-rows", type=int, default=TRAIN_ROWS,
                        help=f"rows the forest is fitted on: its size ({TRAIN_ROWS:,}; "
                             "200,000 gives trees of about 33,000 nodes, a 164 MiB .onnx)")
    parser.add_argument("--model-cache", type=Path, default=DEFAULT_MODEL_CACHE,
                        help=f"where fitted forests are kept between runs ({DEFAULT_MODEL_CACHE})")


@dataclass
class Run:
    server: str
    wrk: dict[str, Any]
    rows_per_batch: float | None = None

    @property
    def per_s(self) -> float:
        return float(self.wrk["requests_per_s"])


def make_model(cache: Path, rows: int) -> tuple[Any, np.ndarray, Path]:
    """The fitted forest and its training rows, and the folder holding it as model.onnx
    (skl2onnx's defaults) and model.joblib: fitted once per size and scikit-learn version
    (a joblib file loads only in the version that wrote it), then read from `cache`."""
    import joblib
    from sklearn.datasets import make_classification
    from sklearn.ensemble import RandomForestClassifier

    x, y = make_classification(rows, FEATURES, n_informative=15, n_classes=3, random_state=0)
    x = x.astype(np.float32)
    folder = cache / f"forest-{TREES}-{rows}-sklearn{version('scikit-learn')}"
    if (folder / "model.onnx").exists() and (folder / "model.joblib").exists():
        print(f"forest read from {folder}", file=sys.stderr)
        return joblib.load(folder / "model.joblib"), x, folder
    from skl2onnx import to_onnx

    print(f"fitting and exporting the forest on {rows:,} rows into {folder}", file=sys.stderr)
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = RandomForestClassifier(TREES, random_state=0, n_jobs=2).fit(x, y)
        (partial / "model.onnx").write_bytes(to_onnx(model, x[:1]).SerializeToString())
    model.n_jobs = None  # served one process per worker, as fitted with the defaults
    joblib.dump(model, partial / "model.joblib")
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    return model, x, folder


def describe(model: Any, folder: Path, rows: int) -> str:
    nodes = np.mean([tree.tree_.node_count for tree in model.estimators_])
    depth = np.mean([tree.tree_.max_depth for tree in model.estimators_])
    return (f"fitted on {rows:,} rows: {nodes:,.0f} nodes and depth {depth:.0f} per tree on "
            f"average; model.onnx {(folder / 'model.onnx').stat().st_size / 2**20:,.0f} MiB, "
            f"model.joblib {(folder / 'model.joblib').stat().st_size / 2**20:,.0f} MiB")


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
    model, x, folder = make_model(args.model_cache, args.train_rows)
    size = describe(model, folder, args.train_rows)
    print(size, file=sys.stderr)
    row = x[:1].round(4)
    expected = model.predict_proba(row)
    runs = serve_snoozeml(bench, folder / "model.onnx", row, expected)
    setup = install_mlserver(args.mlserver_venv, args.install_timeout)
    print(setup.note, file=sys.stderr)
    if setup.executable is not None:
        payload = body(row, "input-0", "predict_proba")
        (workdir / "mlserver.json").write_text(json.dumps(payload))
        for label, workers, batching in MLSERVER_VARIANTS:
            repository = write_repository(workdir / f"mlserver-{workers}-{bool(batching)}",
                                          NAME, folder / "model.joblib", batching)
            server = MLServer(setup.executable, repository, NAME, workers,
                              workdir / "mlserver.log")
            try:
                url = f"{server.base_url}/v2/models/{NAME}/infer"
                check(url, payload, "predict_proba", expected)
                runs.append(Run(f"MLServer {label}",
                                measure(url, workdir / "mlserver.json", args, label)))
                check(url, payload, "predict_proba", expected)
            finally:
                server.stop()
    batch = max(1, round(runs[0].rows_per_batch or 1))
    ceilings = ceiling(workdir, folder / "model.onnx", x, sorted({1, batch, 64}),
                       args.duration)
    return Outcome(report(bench, runs, ceilings, batch, f"{size}; MLServer: {setup.note}"),
                   {"runs": runs, "ceilings": ceilings})


def serve_snoozeml(bench: Bench, onnx_file: Path, row: np.ndarray,
                   expected: np.ndarray) -> list[Run]:
    """The forest, then the null model (the daemon's own floor for this request) beside it."""
    args, workdir = bench.args, bench.workdir
    write_null(workdir / "null.onnx", FEATURES)
    paths = {NAME: str(onnx_file), "null": "null.onnx"}
    config = write_config(workdir / "models.toml", [
        {"name": name, "path": paths[name], "preload": True,
         "intra_op_threads": 1, "batching": {"max_batch_size": 64, "max_delay": "0ms"}}
        for name in (NAME, "null")], server={"idle_timeout": "never"})
    payloads = {NAME: body(row, "X", "output_probability"), "null": body(row, "x", "y")}
    runs = []
    # a large forest's file (hundreds of MB) takes longer than the usual minute to load
    with bench.serve(config, [NAME, "null"], timeout_s=300.0) as daemon:
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


def ceiling(workdir: Path, onnx_file: Path, x: np.ndarray, batches: list[int],
            duration_s: float) -> dict[int, Latency]:
    """onnxruntime on the graph the daemon serves (ZipMap rewritten), one intra-op thread."""
    from snoozeml.runtime.onnx.ml_outputs import write_tensor_form_blocking

    served = workdir / "served.onnx"
    write_tensor_form_blocking(onnx_file, served)
    session = new_session(served)
    return {batch: warm_then_time(
        lambda feed={"X": x[:batch]}: session.run(["output_probability"], feed), duration_s)
        for batch in batches}


def report(bench: Bench, runs: list[Run], ceilings: dict[int, Latency], batch: int,
           setup: str) -> str:
    args = bench.args
    lines = bench.header(
        f"## Tabular: RandomForestClassifier ({TREES} trees, {FEATURES} features, 3 classes, "
        f"{args.train_rows:,} training rows), one row per request at c{args.concurrency[0]}",
        f"{args.duration:g} s per run after a {args.warm_up:g} s wrk warm-up (-t2); every "
        "server answers predict_proba, checked against scikit-learn (1e-5)",
        f"SnoozeML: skl2onnx `to_onnx(model, X)` defaults (ZipMap); forest {setup}")
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
    pace = ("the request path, not the model, sets the pace" if ours >= 0.9 * null
            else "the model's cost shows")
    lines += ["", f"- The forest is served at {ours / null:.2f}x the daemon's null model (a Relu "
              f"on the same one-row JSON request, {null:,.0f} req/s): {pace}; the in-process "
              f"ceiling at that batch is {rows_s / null:.1f}x the null model's rate."]
    return "\n".join(lines) + "\n"
