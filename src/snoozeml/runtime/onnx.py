"""ONNX models through onnxruntime.

Sessions are created from the file path, never from bytes: a session built from bytes keeps a
copy of them for its whole life, doubling the model's memory.
"""

from __future__ import annotations

import ctypes
import math
import sys
from collections.abc import Sequence

import numpy as np
import onnxruntime as ort
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument

from snoozeml.config import ModelConfig
from snoozeml.datatypes import ONNX_TO_OIP, ModelMetadata, TensorSpec
from snoozeml.errors import InvalidInput, Unsupported
from snoozeml.heap import drop_attribute_blocking
from snoozeml.logs import log_event
from snoozeml.runtime.base import (
    Arrays,
    FileSizes,
    looks_out_of_memory,
    requested_gpu,
    utf8_strings,
)
from snoozeml.runtime.files import onnx_file_sizes_blocking
from snoozeml.runtime.stacking import run_stacked_blocking

PLATFORM = "onnxruntime_onnx"

# onnxruntime's own logger prints coloured lines to stderr; errors reach our logs as exceptions.
ort.set_default_logger_severity(4)


def _dim(value: object) -> int:
    # onnxruntime reports symbolic dims as strings and unknown ones as None.
    return value if isinstance(value, int) and value >= 0 else -1


def _spec(arg: ort.NodeArg) -> TensorSpec:
    datatype = ONNX_TO_OIP.get(arg.type)
    if datatype is None:
        raise RuntimeError(f"tensor {arg.name!r} has type {arg.type}, which has no OIP datatype")
    return TensorSpec(arg.name, datatype, tuple(_dim(d) for d in arg.shape))


def providers_for(device: str, tensorrt: bool, available: Sequence[str]) -> list[object]:
    """Execution providers for `device`, best first; CPU is always the last resort."""
    wanted: list[object] = []
    if device.startswith("cuda") or device == "auto":
        index = int(device.split(":", 1)[1]) if ":" in device else 0
        if tensorrt:
            wanted.append(("TensorrtExecutionProvider", {"device_id": index}))
        wanted.append(("CUDAExecutionProvider", {"device_id": index}))
    if device in ("mps", "auto") and sys.platform == "darwin":
        wanted.append("CoreMLExecutionProvider")
    elif device == "mps":
        wanted.append("CoreMLExecutionProvider")  # absent off macOS: warned below
    chosen = [p for p in wanted if (p[0] if isinstance(p, tuple) else p) in available]
    missing = [p[0] if isinstance(p, tuple) else p for p in wanted if p not in chosen]
    if missing and device != "auto":
        log_event("provider_unavailable", 30, device=device, missing=",".join(map(str, missing)),
                  fallback="CPUExecutionProvider")
    return [*chosen, "CPUExecutionProvider"]


class OnnxInstance:
    def __init__(self, name: str, session: ort.InferenceSession) -> None:
        self._session = session
        self._metadata = ModelMetadata(
            name=name,
            platform=PLATFORM,
            inputs=tuple(_spec(a) for a in session.get_inputs()),
            outputs=tuple(_spec(a) for a in session.get_outputs()),
        )
        self._string_inputs = {s.name for s in self._metadata.inputs if s.datatype == "BYTES"}
        # BF16 travels as uint16 bits; onnxruntime's numpy API has no bfloat16, so such models
        # run through OrtValues (which cannot hold strings: a model mixing both is refused).
        self._bf16_inputs = {s.name for s in self._metadata.inputs if s.datatype == "BF16"}
        self._bf16 = bool(self._bf16_inputs) or any(
            s.datatype == "BF16" for s in self._metadata.outputs
        )

    @property
    def metadata(self) -> ModelMetadata:
        return self._metadata

    def validate_inputs(self, inputs: Arrays) -> None:
        """String tensors become str here, before queueing: onnxruntime wants str objects (it
        would turn bytes into their repr), and bytes that are not UTF-8 fail this request alone
        with a 400 instead of the whole batch with a 500."""
        if self._bf16 and self._string_inputs:
            raise Unsupported(_BF16_WITH_STRINGS)
        for name in self._string_inputs & inputs.keys():
            inputs[name] = utf8_strings(inputs[name], name)

    def run_blocking(self, inputs: Arrays, outputs: Sequence[str] | None) -> Arrays:
        feed = inputs
        if self._string_inputs:
            feed = dict(inputs)
            for name in self._string_inputs & feed.keys():
                feed[name] = utf8_strings(feed[name], name)
        names = list(outputs) if outputs else [s.name for s in self._metadata.outputs]
        try:
            if self._bf16:
                return self._run_ort_values(feed, names)
            results = self._session.run(names, feed)
        except InvalidArgument as exc:  # a dtype, rank or shape the graph does not take
            raise InvalidInput(
                f"model {self._metadata.name!r} rejected the input: {exc}"
            ) from exc
        return {name: np.asarray(value) for name, value in zip(names, results, strict=True)}

    def run_batch_blocking(
        self, requests: Sequence[Arrays], outputs: Sequence[str] | None
    ) -> list[Arrays]:
        """Rows stacked along axis 0 and run once; see runtime/stacking.py."""
        return run_stacked_blocking(self.run_blocking, requests, outputs)

    def _run_ort_values(self, feed: Arrays, names: list[str]) -> Arrays:
        if self._string_inputs:
            raise Unsupported(_BF16_WITH_STRINGS)
        values = {
            name: ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
                np.ascontiguousarray(array), _ONNX_BFLOAT16
            )
            if name in self._bf16_inputs
            else ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array))
            for name, array in feed.items()
        }
        results = self._session.run_with_ort_values(names, values)
        return {name: _to_numpy(value) for name, value in zip(names, results, strict=True)}

    def close(self) -> None:
        drop_attribute_blocking(self, "_session")


_ONNX_BFLOAT16 = 16  # onnx.TensorProto.BFLOAT16
_BF16_WITH_STRINGS = (
    "this model has both BF16 tensors and string inputs, which onnxruntime's Python API cannot "
    "feed in one run"
)


def _to_numpy(value: ort.OrtValue) -> np.ndarray:
    if value.data_type() != "tensor(bfloat16)":
        return np.asarray(value.numpy())
    if value.device_name().lower() != "cpu":
        raise Unsupported("BF16 outputs are only read back from CPU memory")
    shape = tuple(value.shape())
    count = math.prod(shape)
    if count == 0:
        return np.zeros(shape, dtype=np.uint16)
    bits = (ctypes.c_uint16 * count).from_address(value.data_ptr())
    return np.frombuffer(bits, dtype=np.uint16).copy().reshape(shape)


class OnnxBackend:
    def file_sizes_blocking(self, spec: ModelConfig) -> FileSizes:
        return onnx_file_sizes_blocking(spec.path)

    def memory_device(self, spec: ModelConfig, gpus: Sequence[str]) -> str:
        """The GPU the model asks for when it is present and this onnxruntime has CUDA;
        otherwise the host, where the CPU provider will run it."""
        gpu = requested_gpu(spec.device, gpus)
        if gpu != "cpu" and "CUDAExecutionProvider" not in ort.get_available_providers():
            return "cpu"
        return gpu

    def prepare_blocking(self, spec: ModelConfig) -> None:
        pass  # onnxruntime is imported with this module; a model brings no code of its own

    def is_out_of_memory(self, exc: BaseException) -> bool:
        return looks_out_of_memory(exc)

    def load_blocking(self, spec: ModelConfig) -> OnnxInstance:
        options = ort.SessionOptions()
        options.intra_op_num_threads = spec.intra_op_threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.log_severity_level = 4  # errors reach us as exceptions
        # Spinning worker threads would steal the event loop's core between requests.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        providers = providers_for(spec.device, spec.tensorrt, ort.get_available_providers())
        session = ort.InferenceSession(str(spec.path), sess_options=options, providers=providers)
        return OnnxInstance(spec.name, session)
