"""What the fuzz tests share: one tiny model per OIP datatype, onnxruntime's answers for them,
the wire format written out independently of the server's codec, hypothesis strategies for
tensors and parameters, and the checks that a daemon came through a campaign unharmed.

`SNOOZE_FUZZ_EXAMPLES` multiplies every fuzz test's examples (default 1, what `make test`
runs, derandomized); above 1 a campaign also draws fresh random examples on each run.
"""

from __future__ import annotations

import math
import os
import re
import struct
from collections import Counter
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import onnxruntime as ort
import psutil
from daemon import Daemon
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from onnx import TensorProto, helper, numpy_helper
from onnx_models import reference_session, write_corrupt_model

SCALE = float(os.environ.get("SNOOZE_FUZZ_EXAMPLES", "1") or "1")


def fuzz_settings(examples: int) -> settings:
    """`examples` times SNOOZE_FUZZ_EXAMPLES, no deadline (the daemon shares two busy cores),
    the same examples on every `make test` run."""
    return settings(
        max_examples=max(1, int(examples * SCALE)),
        deadline=None,
        derandomize=SCALE <= 1,
        database=None,
        print_blob=True,  # a random campaign's failure comes with what reproduces it
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                               HealthCheck.filter_too_much, HealthCheck.large_base_example],
    )


# --- one model per datatype --------------------------------------------------------------


@dataclass(frozen=True)
class Kind:
    """An OIP datatype: its ONNX type, its little-endian wire dtype, the gRPC typed-contents
    field that carries it (None: raw only) and what its model does to `x`."""

    onnx_type: int
    wire: str
    field: str | None
    op: str  # "double", "increment", "negate" or "identity"


KINDS: dict[str, Kind] = {
    "BOOL": Kind(TensorProto.BOOL, "|b1", "bool_contents", "negate"),
    "UINT8": Kind(TensorProto.UINT8, "|u1", "uint_contents", "identity"),
    "UINT16": Kind(TensorProto.UINT16, "<u2", "uint_contents", "identity"),
    "UINT32": Kind(TensorProto.UINT32, "<u4", "uint_contents", "identity"),
    "UINT64": Kind(TensorProto.UINT64, "<u8", "uint64_contents", "identity"),
    "INT8": Kind(TensorProto.INT8, "|i1", "int_contents", "identity"),
    "INT16": Kind(TensorProto.INT16, "<i2", "int_contents", "identity"),
    "INT32": Kind(TensorProto.INT32, "<i4", "int_contents", "increment"),
    "INT64": Kind(TensorProto.INT64, "<i8", "int64_contents", "increment"),
    "FP16": Kind(TensorProto.FLOAT16, "<f2", None, "double"),
    "FP32": Kind(TensorProto.FLOAT, "<f4", "fp32_contents", "double"),
    "FP64": Kind(TensorProto.DOUBLE, "<f8", "fp64_contents", "double"),
    "BF16": Kind(TensorProto.BFLOAT16, "<u2", None, "identity"),  # numpy has no bfloat16
    "BYTES": Kind(TensorProto.STRING, "O", "bytes_contents", "identity"),
}
DATATYPES = sorted(KINDS)
CONTENTS_FIELDS = sorted({k.field for k in KINDS.values() if k.field})
BROKEN = "broken"  # a model whose file no loader takes: its requests get the documented 503


def model_name(datatype: str) -> str:
    return f"dt_{datatype.lower()}"


MODELS = {model_name(d): d for d in DATATYPES}


def _write_model(path: Path, datatype: str) -> None:
    """`x` [n, 2] of `datatype` -> `y` [n, 2]: doubled (floats, FP16 as x + x), plus one
    (INT32, INT64), negated (BOOL) or the same (everything else)."""
    kind = KINDS[datatype]
    initializers = []
    if kind.op == "double" and datatype != "FP16":
        numpy_type = np.float32 if datatype == "FP32" else np.float64
        initializers.append(numpy_helper.from_array(np.array(2, numpy_type), "k"))
        node = helper.make_node("Mul", ["x", "k"], ["y"])
    elif kind.op == "double":
        node = helper.make_node("Add", ["x", "x"], ["y"])
    elif kind.op == "increment":
        numpy_type = np.int32 if datatype == "INT32" else np.int64
        initializers.append(numpy_helper.from_array(np.array(1, numpy_type), "k"))
        node = helper.make_node("Add", ["x", "k"], ["y"])
    elif kind.op == "negate":
        node = helper.make_node("Not", ["x"], ["y"])
    else:
        node = helper.make_node("Identity", ["x"], ["y"])
    graph = helper.make_graph(
        [node], model_name(datatype),
        [helper.make_tensor_value_info("x", kind.onnx_type, ["n", 2])],
        [helper.make_tensor_value_info("y", kind.onnx_type, ["n", 2])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())


def write_models(folder: Path) -> str:
    """Every datatype's model and the broken one into `folder`; the daemon's config (debug
    logging, so that an unexpected error's traceback reaches the log)."""
    lines = ['[server]', 'log_level = "debug"', ""]
    for datatype in DATATYPES:
        name = model_name(datatype)
        _write_model(folder / f"{name}.onnx", datatype)
        lines += ["[[models]]", f'name = "{name}"', f'path = "{name}.onnx"', ""]
    write_corrupt_model(folder / f"{BROKEN}.onnx")
    lines += ["[[models]]", f'name = "{BROKEN}"', f'path = "{BROKEN}.onnx"']
    return "\n".join(lines)


@cache
def _session(path: Path) -> ort.InferenceSession:
    return reference_session(path)


def expected_output(folder: Path, datatype: str, x: np.ndarray) -> np.ndarray:
    """onnxruntime's own `y` for `x` (BYTES as bytes, BF16 as its uint16 words)."""
    if datatype == "BF16":  # the model is Identity: its answer is the same 16-bit words
        return x.copy()
    session = _session(folder / f"{model_name(datatype)}.onnx")
    if datatype == "BYTES":
        text = np.array([v.decode("utf-8") for v in x.ravel()], dtype=object).reshape(x.shape)
        y = session.run(["y"], {"x": text})[0]
        return np.array([v.encode("utf-8") for v in y.ravel()], dtype=object).reshape(y.shape)
    return np.asarray(session.run(["y"], {"x": x})[0])


def assert_same(datatype: str, got: np.ndarray, expected: np.ndarray) -> None:
    assert got.shape == expected.shape, (got.shape, expected.shape)
    if datatype == "BYTES":
        assert got.tolist() == expected.tolist()
    else:
        assert got.dtype == expected.dtype, (got.dtype, expected.dtype)
        np.testing.assert_array_equal(got, expected)  # NaNs in the same places are equal


# --- the wire format, by hand ------------------------------------------------------------


def to_raw(datatype: str, array: np.ndarray) -> bytes:
    """Little-endian, row-major; each BYTES element a 4-byte little-endian length first."""
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(v)) + v for v in array.ravel())
    return np.ascontiguousarray(array, dtype=KINDS[datatype].wire).tobytes()


def from_raw(datatype: str, shape: list[int], raw: bytes) -> np.ndarray:
    if datatype != "BYTES":
        return np.frombuffer(raw, KINDS[datatype].wire).reshape(shape)
    items, offset = [], 0
    while offset < len(raw):
        (length,) = struct.unpack_from("<I", raw, offset)
        items.append(raw[offset + 4:offset + 4 + length])
        offset += 4 + length
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array.reshape(shape)


def is_utf8(array: np.ndarray) -> bool:
    try:
        for value in array.ravel():
            value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


# --- strategies --------------------------------------------------------------------------

INT64 = st.integers(-(2**63), 2**63 - 1)
UINT64 = st.integers(0, 2**64 - 1)
# Names the server reads, and others it must ignore.
PARAMETER_NAMES = st.one_of(
    st.sampled_from(["timeout", "priority", "binary_data_output", "binary_data",
                     "binary_data_size", "shared_memory_region", "classification",
                     "triton_enable_empty_final_response", "sequence_id"]),
    st.text(max_size=12),
)
TEXT_ELEMENTS = st.text(max_size=8).map(lambda s: s.encode("utf-8"))
# Mostly UTF-8 text (what a string model takes), sometimes any bytes (a 400 for it).
BYTES_ELEMENTS = st.one_of(TEXT_ELEMENTS, st.binary(max_size=8))


@st.composite
def tensors(draw: st.DrawFn, datatype: str, finite: bool = False, utf8: bool = False,
            trailing: tuple[int, ...] = (2,)) -> np.ndarray:
    """An [n, *trailing] tensor of `datatype` (n 0-4). `finite`: floats a JSON body can carry,
    small enough that doubling them stays finite; `utf8`: BYTES elements that are text."""
    shape = (draw(st.integers(0, 4)), *trailing)
    count = math.prod(shape)
    if datatype == "BYTES":
        element = TEXT_ELEMENTS if utf8 else BYTES_ELEMENTS
        array = np.empty(count, dtype=object)
        array[:] = draw(st.lists(element, min_size=count, max_size=count))
        return array.reshape(shape)
    dtype = np.dtype(KINDS[datatype].wire)
    if datatype == "BF16" and finite:  # the upper halves of finite float32 values
        words = st.integers(0, 2**16 - 1).filter(lambda w: (w >> 7) & 0xFF != 0xFF)
        return draw(arrays(dtype, shape, elements=words))
    if finite and dtype.kind == "f":
        width = dtype.itemsize * 8
        bound = {16: 8192.0, 32: 2.0**100, 64: 2.0**1000}[width]  # exact in each width
        floats = st.floats(-bound, bound, width=width, allow_subnormal=width != 16)
        return draw(arrays(dtype, shape, elements=floats))
    return draw(arrays(dtype, shape))


# --- the daemon after a campaign ---------------------------------------------------------

# A 503 the contract documents: the broken model, a `timeout` that ran out in the queue.
ALLOWED_FAILURES = re.compile(r"request_failed .*status=503 .*error=\"(model 'broken' failed to "
                              r"load|queue timeout)")


def log_problems(daemon: Daemon, start: int) -> list[str]:
    """Log lines since `start` that show a fault: a traceback, an ERROR, or a request that
    failed on the server's side other than a documented 503."""
    lines = daemon.log().splitlines()[start:]
    return [line for line in lines
            if "Traceback" in line or " ERROR " in line or " CRITICAL " in line
            or ("request_failed" in line and not ALLOWED_FAILURES.search(line))]


def report(outcomes: Counter[str]) -> None:
    """How a campaign's cases were answered (shown with `pytest -s`)."""
    print(f"{sum(outcomes.values())} cases:", ", ".join(
        f"{label} {count}" for label, count in outcomes.most_common()))


def assert_alive(daemon: Daemon) -> None:
    process = psutil.Process(daemon.pid)
    assert process.is_running()
    assert process.status() != psutil.STATUS_ZOMBIE
