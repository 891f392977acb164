"""An image classifier fed encoded images (issue 33): a MobileNet-sized ONNX model
(MobileNetV3-Small, random weights: scenarios/images/mobilenet.py) and 640x480 JPEGs, one per
request, over HTTP with the binary extension at c16.

- SnoozeML: the model's entry describes its preprocessing ([models.image]: resize 256, crop
  224, ImageNet mean and std); the daemon decodes and preprocesses on its preparation pool and
  batches the tensors (up to 16 rows, max_delay 0). `--intra-op-threads` sets the model's
  onnxruntime threads (one by default).
- The ceiling: the same work in this process, with no server: the daemon's own decoding and
  preprocessing (runtime/image/) and an onnxruntime session with as many intra-op threads,
  on as many Python threads as the machine has cores, each decoding, preprocessing and running
  its own images, one at a time and in batches of 8; the better of the two is the ceiling.
- `--rounds` rounds (3) of the served run then the two ceilings (the daemon idle meanwhile),
  each round's ratio from measurements a few seconds apart; the median ratio is the result,
  and the CPU the rest of the machine used meanwhile is reported beside each.

The server's logits are checked against the in-process answer for the same JPEG (1e-4) before
and after the load.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from harness.cli import Bench
from harness.config import write_config
from harness.cpu import CpuWindow, cpu_count
from harness.load import run_wrk
from harness.oip import binary_headers, http_output, new_session
from harness.report import Outcome, table, yes
from harness.status import batch_counters, wait_idle

from scenarios.images.mobilenet import write_mobilenet

NAME = "mobilenet"
AIM = 0.8
ATOL = 1e-4
MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]
IMAGE = {"resize": 256, "crop": 224, "mean": MEAN, "std": STD}


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--intra-op-threads", type=int, default=1,
                        help="the model's onnxruntime intra-op threads, served and in process "
                             "(1)")
    parser.add_argument("--max-batch-size", type=int, default=16,
                        help="the model's max_batch_size (16)")


def photo(seed: int = 0) -> bytes:
    """A 640x480 JPEG (quality 90) of smooth shapes with sensor-like noise, about 120 KB."""
    import io

    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:480, 0:640].astype(np.float32)
    planes = [127 + 100 * np.sin(x * f1 + y * f2 + p)
              for f1, f2, p in rng.uniform([0.005, 0.005, 0], [0.05, 0.05, 6], (3, 3))]
    pixels = np.stack(planes, -1) + rng.normal(0, 12, (480, 640, 3))
    buffer = io.BytesIO()
    Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def binary_body(jpeg: bytes) -> tuple[bytes, int]:
    """One image as a binary-extension body (a BYTES element: 4-byte length, then the bytes),
    asking for the logits in binary."""
    element = struct.pack("<I", len(jpeg)) + jpeg
    header = json.dumps({
        "inputs": [{"name": "image", "shape": [1], "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(element)}}],
        "outputs": [{"name": "logits", "parameters": {"binary_data": True}}],
    }).encode()
    return header + element, len(header)


class InProcess:
    """Decode, preprocess and run, as the daemon does, without the daemon."""

    def __init__(self, model: Path, threads: int) -> None:
        from snoozeml.config.image import ImageConfig
        from snoozeml.datatypes import TensorSpec
        from snoozeml.runtime.image.preprocess import plan_preprocess

        self.session = new_session(model, threads)
        self.preprocess = plan_preprocess(ImageConfig(**IMAGE),  # type: ignore[arg-type]
                                          TensorSpec("pixel_values", "FP32", (-1, 3, 224, 224)))

    def logits(self, images: list[bytes]) -> np.ndarray:
        from snoozeml.runtime.image.decode import decode_image

        pictures = [decode_image(data, row, 40_000_000) for row, data in enumerate(images)]
        feed = {"pixel_values": self.preprocess(pictures)}
        return np.asarray(self.session.run(["logits"], feed)[0])


def ceiling(runner: InProcess, jpeg: bytes, threads: int, batch: int, duration_s: float,
            warm_up_s: float) -> float:
    """Images per second of `threads` Python threads, each decoding, preprocessing and running
    `batch` images at a time, over `duration_s` after `warm_up_s`."""
    counts = [0] * threads
    stop = threading.Event()
    measuring = threading.Event()

    def work(index: int) -> None:
        images = [jpeg] * batch
        while not stop.is_set():
            runner.logits(images)
            if measuring.is_set():
                counts[index] += batch

    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    time.sleep(warm_up_s)  # a timed window, not synchronisation
    measuring.set()
    started = time.perf_counter()
    time.sleep(duration_s)
    done, elapsed = sum(counts), time.perf_counter() - started
    stop.set()
    for worker in workers:
        worker.join()
    return done / elapsed


def check(url: str, body: bytes, header_length: int, expected: np.ndarray) -> None:
    response = httpx.post(url, content=body, headers=binary_headers(header_length), timeout=60)
    if response.status_code != 200:
        raise RuntimeError(f"{url}: {response.status_code} {response.text[:300]}")
    got = http_output(response.content, response.headers.get("inference-header-content-length"),
                      "logits")
    if not np.allclose(got, expected, rtol=0, atol=ATOL):
        raise RuntimeError(f"{url}: the logits are {np.abs(got - expected).max()} from the "
                           "in-process answer")


def run(bench: Bench) -> Outcome:
    """Rounds of: the served run, then the two ceilings (the daemon idle meanwhile), so that
    each round's ratio compares measurements taken a few seconds apart."""
    args, workdir = bench.args, bench.workdir
    model = write_mobilenet(workdir / "mobilenet.onnx")
    jpeg = photo()
    body, header_length = binary_body(jpeg)
    (workdir / "image.bin").write_bytes(body)
    threads = args.intra_op_threads
    runner = InProcess(model, threads)
    expected = runner.logits([jpeg])
    config = write_config(workdir / "models.toml", [
        {"name": NAME, "path": "mobilenet.onnx", "preload": True, "intra_op_threads": threads,
         "batching": {"max_batch_size": args.max_batch_size, "max_delay": "0ms"},
         "image": IMAGE}], server={"idle_timeout": "never"})
    connections, cores = args.concurrency[0], cpu_count()
    rounds: list[Round] = []
    with bench.serve(config, [NAME]) as daemon:
        url = daemon.infer_url(NAME)
        check(url, body, header_length, expected)
        for index in range(args.rounds):
            before = batch_counters(wait_idle(daemon.client, NAME))
            run_wrk(url, workdir / "image.bin", 2, connections, args.warm_up, header_length)
            with CpuWindow(daemon.pid) as window:
                wrk = run_wrk(url, workdir / "image.bin", 2, connections, args.duration,
                              header_length)
            after = batch_counters(wait_idle(daemon.client, NAME))
            print(f"round {index + 1} snoozeml -c{connections}: {json.dumps(wrk)}",
                  file=sys.stderr)
            batches, rows = after[0] - before[0], after[1] - before[1]
            served = Measured(float(wrk["requests_per_s"]), _rest(window, window.process_s
                                                                  + window.children_s),
                              _threads(window))
            ceilings = {}
            for batch in (1, 8):
                with CpuWindow(os.getpid()) as window:
                    per_s = ceiling(runner, jpeg, cores, batch, args.duration, args.warm_up)
                ceilings[batch] = Measured(per_s, _rest(window, window.own_s))
            rounds.append(Round(served, wrk, rows / batches if batches else None, ceilings))
        check(url, body, header_length, expected)
    return Outcome(report(bench, rounds, cores, len(jpeg)), {"rounds": rounds})


@dataclass
class Measured:
    per_s: float
    rest_cores: float  # the rest of the machine meanwhile: CPU not ours, in cores
    # The daemon's cores: its event loop, the model's worker thread, every other thread (the
    # preparation pool), and wrk's.
    threads: tuple[float, float, float, float] | None = None


@dataclass
class Round:
    served: Measured
    wrk: dict[str, Any]
    rows_per_batch: float | None
    ceilings: dict[int, Measured]

    @property
    def best(self) -> tuple[int, Measured]:
        return max(self.ceilings.items(), key=lambda item: item[1].per_s)

    @property
    def ratio(self) -> float:
        return self.served.per_s / self.best[1].per_s


def _threads(window: CpuWindow) -> tuple[float, float, float, float]:
    loop, worker = window.loop_s, window.busiest_other_s
    return (window.cores(loop), window.cores(worker),
            window.cores(window.process_s - loop - worker), window.cores(window.children_s))


def _rest(window: CpuWindow, ours_s: float) -> float:
    return window.cores(max(0.0, window.machine_s - ours_s))


def report(bench: Bench, rounds: list[Round], cores: int, jpeg_bytes: int) -> str:
    args = bench.args
    lines = bench.header(
        f"## Images: MobileNetV3-Small (ONNX, random weights) fed 640x480 JPEGs, one per "
        f"request, binary extension at c{args.concurrency[0]}",
        f"{args.rounds} rounds of {args.duration:g} s per run after a {args.warm_up:g} s "
        f"warm-up (wrk -t2), the served run then the ceilings; the JPEG is {jpeg_bytes:,} "
        "bytes; [models.image] resize 256, crop 224, ImageNet mean and std; "
        f"intra_op_threads = {args.intra_op_threads}, max_batch_size = {args.max_batch_size}",
        "the server's logits checked against the in-process answer (1e-4) before and after; "
        "*rest* is the CPU the rest of the machine used meanwhile (other work), in cores",
        f"ceiling: decode + preprocess + run in this process, no server, {cores} threads "
        "(one per core), each with its own images one at a time (batch 1) or 8 at a time")
    lines += table(
        ["round", "SnoozeML images/s", "p50 ms", "p99 ms", "rows/batch", "rest",
         "ceiling batch 1", "rest", "ceiling batch 8", "rest", "ratio to the best"],
        [(i + 1, f"{r.served.per_s:,.1f}", f"{r.wrk['p50_ms']:.1f}", f"{r.wrk['p99_ms']:.1f}",
          f"{r.rows_per_batch:.1f}" if r.rows_per_batch else "-",
          f"{r.served.rest_cores:.2f}", f"{r.ceilings[1].per_s:,.1f}",
          f"{r.ceilings[1].rest_cores:.2f}", f"{r.ceilings[8].per_s:,.1f}",
          f"{r.ceilings[8].rest_cores:.2f}", f"{r.ratio:.2f}x")
         for i, r in enumerate(rounds)], "rrrrrrrrrrr")
    lines += ["", "Where the served runs' CPU went, in cores: the daemon's event loop, its busiest "
              "other thread (the model's worker), its other threads (the preparation pool), "
              "and wrk.", ""]
    lines += table(["round", "loop", "busiest other thread", "other threads", "wrk"],
                   [(i + 1, *(f"{c:.2f}" for c in r.served.threads or ()))
                    for i, r in enumerate(rounds)], "rrrrr")
    ratios = sorted(r.ratio for r in rounds)
    median = ratios[len(ratios) // 2] if len(ratios) % 2 else \
        (ratios[len(ratios) // 2 - 1] + ratios[len(ratios) // 2]) / 2
    errors = sum(int(r.wrk["errors"]) for r in rounds)
    lines += ["", "### Against the aim of issue 33", ""]
    lines += table(["aim", "ours (median of rounds, range)", "met"], [(
        f"SnoozeML >= {AIM:g}x the in-process ceiling (each round's better batch)",
        f"{median:.2f}x ({ratios[0]:.2f}-{ratios[-1]:.2f}); {errors} errors",
        yes(median >= AIM and errors == 0))], "lrl")
    return "\n".join(lines) + "\n"
