"""One loaded ONNX model: an onnxruntime session and what runs through it, and its swap to a
pre-packed session (runtime/onnx/backend.py decides how a model loads; this is what a load
makes)."""

from __future__ import annotations

import ctypes
import math
import threading
from collections.abc import Callable, Sequence

import numpy as np
import onnxruntime as ort
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument

from snoozeml.datatypes import ONNX_TO_OIP, ModelMetadata, TensorSpec
from snoozeml.errors import InvalidInput, Unsupported
from snoozeml.heap import drop_attribute_blocking, release_memory_blocking
from snoozeml.runtime.base import NO_PARAMETERS, Arrays, InputParameters, utf8_strings
from snoozeml.runtime.onnx.mapped import MappedWeights
from snoozeml.runtime.onnx.ml_outputs import NoTensorForm, no_tensor_form
from snoozeml.runtime.stacking import run_stacked_blocking

PLATFORM = "onnxruntime_onnx"


def _dim(value: object) -> int:
    # onnxruntime reports symbolic dims as strings and unknown ones as None.
    return value if isinstance(value, int) and value >= 0 else -1


def _spec(arg: ort.NodeArg, kind: str) -> TensorSpec:
    datatype = ONNX_TO_OIP.get(arg.type)
    if datatype is None:
        raise NoTensorForm(no_tensor_form(kind, arg.name, arg.type))
    return TensorSpec(arg.name, datatype, tuple(_dim(d) for d in arg.shape))


def wants_prepack(policy: str, rows: int) -> bool:
    """Whether a session should be pre-packed, given the model's `prepack` policy and the
    rows of a batch that ran. Unpacked, a one-row run costs the same (measured: 0.97-1.05x)
    and 2-16 rows cost 2-2.8x (docs/models.md)."""
    return policy == "on" or (policy == "auto" and rows > 1)


class OnnxInstance:
    def __init__(
        self,
        name: str,
        session: ort.InferenceSession,
        weights: MappedWeights | None = None,
        prepacked: Callable[[], ort.InferenceSession] | None = None,
        policy: str = "on",
    ) -> None:
        self._session = session
        self._weights = weights
        # Builds the pre-packed session that replaces this one; None once it did (or never).
        self._prepacked = prepacked
        self._policy = policy
        # Held by each run and by the swap: a session is never freed under a run.
        self._lock = threading.Lock()
        # Held through an upgrade and by close: the mapping never goes under a build.
        self._upgrading = threading.Lock()
        self._closed = False
        self._metadata = ModelMetadata(
            name=name,
            platform=PLATFORM,
            inputs=tuple(_spec(a, "input") for a in session.get_inputs()),
            outputs=tuple(_spec(a, "output") for a in session.get_outputs()),
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

    def validate_inputs(self, inputs: Arrays,
                        parameters: InputParameters = NO_PARAMETERS) -> None:
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
            with self._lock:
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
        with self._lock:
            results = self._session.run_with_ort_values(names, values)
            return {name: _to_numpy(value) for name, value in zip(names, results, strict=True)}

    def upgrade_bytes(self, rows: int) -> int:
        """Bytes a pre-packed session would add while it is built, when a batch of `rows`
        makes one worth it and none was built yet; else 0."""
        if self._prepacked is None or self._weights is None or \
                not wants_prepack(self._policy, rows):
            return 0
        return self._weights.packed_bytes or self._weights.bytes

    def upgrade_blocking(self) -> bool:
        """Build the pre-packed session and swap it in between two runs, then let the
        unpacked weights' pages go. Returns False when there was nothing to do (already
        upgraded, or closed)."""
        with self._upgrading:
            build, self._prepacked = self._prepacked, None
            if build is None or self._closed:
                return False
            session = build()
            with self._lock:
                old, self._session = self._session, session
            del old, session  # the unpacked session goes here: no run holds it
            if self._weights is not None:
                self._weights.release_packed()
            release_memory_blocking()
            return True

    def close(self) -> None:
        with self._upgrading, self._lock:
            self._closed = True
            self._prepacked = None
        drop_attribute_blocking(self, "_session")
        if self._weights is not None:
            self._weights.close()


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
