"""ONNX models through onnxruntime.

Sessions are created from a file, never from bytes: a session built from bytes keeps a copy of
them for its whole life, doubling the model's memory.

Two load paths (docs/models.md, "How an ONNX model loads"):
- mapped, on the CPU provider with a cache directory: the weights come from the model's entry in
  runtime/onnx_cache.py, mapped in place. `prepack` decides when onnxruntime pre-packs
  MatMul/Gemm weights (a second, faster-to-multiply copy): "on" at load; "auto" only once a
  batch of more than one row has run (a one-row run is as fast unpacked), through
  `upgrade_blocking` in the background, swapped in between two runs; "off" never.
- default, everywhere else (a GPU, `weights_cache = false`, or an entry that cannot be made):
  onnxruntime reads the file and pre-packs at load.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument

from snoozeml.config import ModelConfig
from snoozeml.datatypes import ONNX_TO_OIP, ModelMetadata, TensorSpec
from snoozeml.errors import InvalidInput, Unsupported
from snoozeml.heap import drop_attribute_blocking, release_memory_blocking
from snoozeml.logs import log_event
from snoozeml.runtime.base import (
    Arrays,
    FileSizes,
    LoadPlan,
    looks_out_of_memory,
    requested_gpu,
    utf8_strings,
)
from snoozeml.runtime.files import onnx_file_sizes_blocking
from snoozeml.runtime.onnx_cache import (
    CacheError,
    Entry,
    build_blocking,
    entry_key,
    find_blocking,
)
from snoozeml.runtime.onnx_mapped import MappedWeights
from snoozeml.runtime.stacking import run_stacked_blocking

PLATFORM = "onnxruntime_onnx"
# A mapped load's peak beyond its measured size, besides its graph: onnxruntime's own session
# structures (measured: under 0.1 MiB above the resident size for a 92 MiB model).
SESSION_BYTES = 1024 * 1024

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


def providers_for(
    device: str, tensorrt: bool, available: Sequence[str], warn: bool = True
) -> list[object]:
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
    if missing and device != "auto" and warn:
        log_event("provider_unavailable", 30, device=device, missing=",".join(map(str, missing)),
                  fallback="CPUExecutionProvider")
    return [*chosen, "CPUExecutionProvider"]


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


class OnnxBackend:
    def __init__(self, cache_dir: Path | None = None) -> None:
        self._cache_dir = cache_dir  # None: no weights cache, every load takes the default path
        self._unbuildable: set[str] = set()  # entry keys whose build failed in this process

    def file_sizes_blocking(self, spec: ModelConfig) -> FileSizes:
        return onnx_file_sizes_blocking(spec.path)

    def load_plan_blocking(self, spec: ModelConfig, sizes: FileSizes) -> LoadPlan:
        """The next load's path and transient bytes. "mapped" when the model has a valid
        entry (read through once per process): its graph beside the weights, and the packed
        copy with prepack "on". Otherwise "default": the protobuf beside the weights, with
        the entry written afterwards in the background when the cache applies."""
        if not self._maps(spec):
            return LoadPlan("default", sizes.transient)
        assert self._cache_dir is not None
        try:
            entry = find_blocking(self._cache_dir, spec.path)
        except (CacheError, OSError):
            return LoadPlan("default", sizes.transient, background=self._buildable(spec))
        packed = sum(slot.length for slot in entry.slots if slot.packed)
        # The graph twice (its protobuf, onnxruntime's graph) and the session's own structures.
        graph = 2 * entry.graph_bytes + SESSION_BYTES
        return LoadPlan("mapped", graph + (packed if spec.prepack == "on" else 0),
                        least=entry.weights_bytes)

    def background_blocking(self, spec: ModelConfig) -> None:
        """Write the model's entry, so that its next loads map it. Runs after a default load,
        while the model serves: its memory is a 4 MiB buffer and the graph."""
        if not self._maps(spec):
            return
        assert self._cache_dir is not None
        try:
            find_blocking(self._cache_dir, spec.path)
            return  # another replica, or another daemon, wrote it meanwhile
        except (CacheError, OSError) as why:
            reason = str(why)
        log_event("onnx_cache_build", logging.INFO, model=spec.name, reason=reason)
        started = time.perf_counter()
        try:
            entry = build_blocking(self._cache_dir, spec.path)
        except Exception as exc:  # the model keeps loading the default way
            with contextlib.suppress(OSError):
                self._unbuildable.add(entry_key(spec.path))
            log_event("onnx_cache_unusable", logging.WARNING, model=spec.name,
                      error=f"{type(exc).__name__}: {exc}")
            return
        log_event("onnx_cache_built", logging.INFO, model=spec.name,
                  ms=round((time.perf_counter() - started) * 1000, 1),
                  bytes=entry.weights_bytes, entry=str(entry.folder))

    def _buildable(self, spec: ModelConfig) -> bool:
        """Whether to write an entry after this load: not when one already failed for this
        very file (it would fail again at every load)."""
        try:
            return entry_key(spec.path) not in self._unbuildable
        except OSError:
            return False

    def _maps(self, spec: ModelConfig) -> bool:
        return (self._cache_dir is not None and spec.weights_cache
                and _cpu_only(providers_for(spec.device, spec.tensorrt,
                                            ort.get_available_providers(), warn=False)))

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
        providers = providers_for(spec.device, spec.tensorrt, ort.get_available_providers())
        entry = self._entry_blocking(spec)
        if entry is not None:
            try:
                return _load_mapped(spec, entry, providers)
            except Exception as exc:
                if looks_out_of_memory(exc):
                    raise
                # The entry is an optimisation: whatever went wrong, the model loads as it
                # always did (and a broken model file fails there with onnxruntime's words).
                log_event("onnx_cache_unusable", logging.WARNING, model=spec.name,
                          error=f"{type(exc).__name__}: {exc}")
        # Without mapped weights there is nothing to upgrade from: "auto" pre-packs at load.
        session = ort.InferenceSession(str(spec.path),
                                       sess_options=_options(spec, spec.prepack != "off"),
                                       providers=providers)
        return OnnxInstance(spec.name, session)

    def _entry_blocking(self, spec: ModelConfig) -> Entry | None:
        """The model's valid entry, when the cache applies and has one."""
        if not self._maps(spec):
            return None
        assert self._cache_dir is not None
        try:
            return find_blocking(self._cache_dir, spec.path)
        except (CacheError, OSError):
            return None  # the default load; the entry is written after it (background)


def _cpu_only(providers: Sequence[object]) -> bool:
    return list(providers) == ["CPUExecutionProvider"]


def _options(
    spec: ModelConfig, prepack: bool, weights: MappedWeights | None = None
) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = spec.intra_op_threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 4  # errors reach us as exceptions
    # Spinning worker threads would steal the event loop's core between requests.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if not prepack:
        options.add_session_config_entry("session.disable_prepacking", "1")
    if weights is not None:
        weights.add_to(options)
    return options


def _session(
    spec: ModelConfig, graph: Path, providers: Sequence[object], weights: MappedWeights,
    prepack: bool,
) -> ort.InferenceSession:
    return ort.InferenceSession(str(graph), sess_options=_options(spec, prepack, weights),
                                providers=list(providers))


def _load_mapped(spec: ModelConfig, entry: Entry, providers: Sequence[object]) -> OnnxInstance:
    weights = MappedWeights(entry)
    try:
        prepack = spec.prepack == "on"
        session = _session(spec, entry.graph, providers, weights, prepack)
    except BaseException:
        weights.close()
        raise
    if prepack:
        weights.release_packed()
        return OnnxInstance(spec.name, session, weights)

    def prepacked() -> ort.InferenceSession:
        return _session(spec, entry.graph, providers, weights, True)

    return OnnxInstance(spec.name, session, weights,
                        prepacked if spec.prepack == "auto" else None, spec.prepack)
