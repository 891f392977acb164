"""Inputs, the three ways to send one OIP inference (JSON HTTP, binary HTTP through the binary
tensor data extension, gRPC with ``raw_input_contents``) and their decoders, and the
onnxruntime session every answer is checked against.

Each request is encoded once by the caller and sent many times; each decoder turns a response
back into the numpy array of one output, which is what a client needs from it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import orjson

HEADER_LENGTH = "Inference-Header-Content-Length"
JSON_HEADERS = {"Content-Type": "application/json"}
OIP_DATATYPES: dict[np.dtype[Any], str] = {
    np.dtype(np.float32): "FP32",
    np.dtype(np.int64): "INT64",
}
NUMPY_DATATYPES: dict[str, np.dtype[Any]] = {oip: dtype for dtype, oip in OIP_DATATYPES.items()}


def random_rows(rows: int, width: int, seed: int = 7) -> np.ndarray:
    """A fixed-seed FP32 [rows, width] input in [-1, 1], rounded to 4 decimals (so its JSON
    text is short and parses back to the same float32 values)."""
    rng = np.random.default_rng(seed)
    return rng.uniform(-1, 1, size=(rows, width)).round(4).astype(np.float32)


def infer_body(model_input: np.ndarray, name: str = "x") -> dict[str, Any]:
    """An OIP JSON infer request with one FP32 input."""
    data = [float(v) for v in model_input.reshape(-1)]
    return {
        "inputs": [
            {"name": name, "shape": list(model_input.shape), "datatype": "FP32", "data": data}
        ]
    }


def write_body(path: Path, model_input: np.ndarray) -> dict[str, Any]:
    """Write the infer body for ``model_input`` to ``path`` (for wrk) and return it."""
    body = infer_body(model_input)
    path.write_text(json.dumps(body), encoding="utf-8")
    return body


def new_session(path: Path, intra_op_threads: int = 1) -> ort.InferenceSession:
    """An onnxruntime session as the daemon makes one: sequential, one inter-op thread."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = intra_op_threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def check_output(
    label: str, got: np.ndarray, expected: np.ndarray, rtol: float = 1e-4, atol: float = 1e-5
) -> None:
    """Raise unless ``got`` matches onnxruntime's ``expected`` (so nothing wrong is timed)."""
    if got.shape != expected.shape or not np.allclose(got, expected, rtol=rtol, atol=atol):
        diff = float(np.max(np.abs(got - expected))) if got.shape == expected.shape else None
        raise RuntimeError(
            f"{label}: output differs from onnxruntime in-process "
            f"(shape {got.shape} vs {expected.shape}, max abs diff {diff})"
        )


def _tensor_header(name: str, model_input: np.ndarray) -> dict[str, Any]:
    return {
        "name": name,
        "shape": list(model_input.shape),
        "datatype": OIP_DATATYPES[model_input.dtype],
    }


def _raw(model_input: np.ndarray) -> bytes:
    return np.ascontiguousarray(model_input).astype(model_input.dtype.newbyteorder("<")).tobytes()


def json_request(model_input: np.ndarray, name: str = "x") -> bytes:
    """A JSON infer body for one input. orjson writes each value in its shortest form
    (``-0.1234``, not ``-0.12340000271797180``), so this is the smallest JSON body a client
    could send."""
    tensor = {**_tensor_header(name, model_input), "data": np.ascontiguousarray(model_input)}
    return orjson.dumps({"inputs": [tensor]}, option=orjson.OPT_SERIALIZE_NUMPY)


def binary_request(
    model_input: np.ndarray, name: str = "x", output: str = "y"
) -> tuple[bytes, int]:
    """A binary-extension infer body (JSON header, then the raw input) asking for ``output``
    in binary; returns the body and the value of ``Inference-Header-Content-Length``."""
    raw = _raw(model_input)
    header = orjson.dumps(
        {
            "inputs": [
                {**_tensor_header(name, model_input), "parameters": {"binary_data_size": len(raw)}}
            ],
            "outputs": [{"name": output, "parameters": {"binary_data": True}}],
        }
    )
    return header + raw, len(header)


def binary_headers(header_length: int) -> dict[str, str]:
    """The headers of a binary-extension body."""
    return {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(header_length)}


def http_output(body: bytes, header_length: str | None, output: str = "y") -> np.ndarray:
    """One output of an HTTP infer response, JSON or binary (``header_length`` is the
    response's ``Inference-Header-Content-Length``, None for plain JSON)."""
    if header_length is None:
        doc, binary = orjson.loads(body), memoryview(b"")
    else:
        split = int(header_length)
        doc, binary = orjson.loads(body[:split]), memoryview(body)[split:]
    offset = 0
    for tensor in doc["outputs"]:
        size = (tensor.get("parameters") or {}).get("binary_data_size")
        if tensor["name"] == output:
            dtype = NUMPY_DATATYPES[tensor["datatype"]]
            if size is None:
                decoded: np.ndarray = np.asarray(tensor["data"], dtype=dtype)
                return decoded.reshape(tensor["shape"])
            data = np.frombuffer(binary[offset : offset + size], dtype=dtype.newbyteorder("<"))
            return data.reshape(tensor["shape"])
        offset += size or 0
    raise RuntimeError(f"response has no output {output!r}: {list(doc)}")


def grpc_request(model: str, model_input: np.ndarray, name: str = "x") -> Any:
    """A ``ModelInferRequest`` carrying the input in ``raw_input_contents``."""
    from snoozeml.proto import inference_pb2 as pb

    tensor = pb.ModelInferRequest.InferInputTensor(**_tensor_header(name, model_input))
    return pb.ModelInferRequest(model_name=model, inputs=[tensor],
                                raw_input_contents=[_raw(model_input)])


def grpc_output(response: Any, output: str = "y") -> np.ndarray:
    """One output of a ``ModelInferResponse`` (from ``raw_output_contents``)."""
    for index, tensor in enumerate(response.outputs):
        if tensor.name == output:
            dtype = NUMPY_DATATYPES[tensor.datatype].newbyteorder("<")
            data = np.frombuffer(response.raw_output_contents[index], dtype=dtype)
            return data.reshape(tuple(tensor.shape))
    raise RuntimeError(f"response has no output {output!r}")


def grpc_stub(channel: Any) -> Any:
    """A ``GRPCInferenceServiceStub`` on ``channel`` (sync or aio)."""
    from snoozeml.proto import inference_pb2_grpc as pb_grpc

    return pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]


def grpc_channel_options(max_message_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]
