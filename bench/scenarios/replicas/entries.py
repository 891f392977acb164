"""The replica scenario's model and its entries: the same file served with one or two
replicas, batching on or off, and the timeline's ``burst``."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from harness.config import write_config
from harness.daemon import Daemon
from harness.oip import HEADER_LENGTH, binary_headers, check_output, http_output

DIMS = (64, 1024, 1024, 64)
MODEL_FILE = "replicas_mlp.onnx"
TIMELINE_MODEL = "burst"
RTOL = ATOL = 1e-4  # outputs are O(1); the daemon runs the same graph, batched or not


@dataclass(frozen=True)
class Entry:
    """One model entry of the throughput daemon: the same file, its own replicas/batching."""

    name: str
    max_replicas: int
    batching: bool

    @property
    def label(self) -> str:
        return f"max = {self.max_replicas}, batching {'on' if self.batching else 'off'}"


ENTRIES = (Entry("max1-nobatch", 1, False), Entry("max2-nobatch", 2, False),
           Entry("max1-batch", 1, True), Entry("max2-batch", 2, True))


@dataclass(frozen=True)
class Load:
    """The binary-extension body wrk sends, and the answer it must get."""

    body_file: Path
    header_length: int
    body: bytes
    expected: np.ndarray


def entry(name: str, max_replicas: int, batching: bool, args: argparse.Namespace, *,
          preload: bool, scale_down_after: str, idle_timeout: str | None = None,
          ) -> dict[str, Any]:
    batch: dict[str, Any] = ({"max_batch_size": args.batch_rows, "max_delay": args.max_delay}
                             if batching else {"max_batch_size": 0})
    idle = {"idle_timeout": idle_timeout} if idle_timeout is not None else {}
    return {"name": name, "path": MODEL_FILE, "preload": preload, "intra_op_threads": 1,
            **idle, "batching": batch,
            "replicas": {"min": 0, "max": max_replicas, "target_queue": 2,
                         "scale_up_after": "500ms", "scale_down_after": scale_down_after}}


def throughput_config(workdir: Path, args: argparse.Namespace) -> Path:
    return write_config(workdir / "throughput.toml", [
        entry(e.name, e.max_replicas, e.batching, args, preload=True, scale_down_after="1h")
        for e in ENTRIES], server={"idle_timeout": "never"})


def timeline_config(workdir: Path, args: argparse.Namespace) -> Path:
    return write_config(workdir / "timeline.toml", [
        entry(TIMELINE_MODEL, 2, False, args, preload=False, scale_down_after="3s",
              idle_timeout="5s")], server={"idle_timeout": "never"})


def check_binary(daemon: Daemon, name: str, load: Load) -> None:
    """One binary-extension request (the body wrk sends), checked against onnxruntime."""
    response = daemon.client.post(f"/v2/models/{name}/infer", content=load.body,
                                  headers=binary_headers(load.header_length))
    if response.status_code != 200:
        raise RuntimeError(f"infer {name}: {response.status_code} {response.text[:500]}")
    got = http_output(response.content, response.headers.get(HEADER_LENGTH))
    check_output(f"infer {name}", got, load.expected, RTOL, ATOL)


def ready_replicas(status: dict[str, Any]) -> int:
    return sum(1 for r in status.get("replica_details") or [] if r["state"] == "ready")


def replica_requests(status: dict[str, Any]) -> dict[int, int]:
    return {int(r["index"]): int(r["requests"]) for r in status.get("replica_details") or []}
