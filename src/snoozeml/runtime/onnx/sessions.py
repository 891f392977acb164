"""How an ONNX model loads: onnxruntime sessions, the load plan, the weights cache entry.

Imported with onnxruntime at a model's first load, not at start (runtime/onnx/backend.py).

Sessions are created from a file, never from bytes: a session built from bytes keeps a copy of
them for its whole life, doubling the model's memory.

Two load paths (docs/models.md, "How an ONNX model loads"):
- mapped, on the CPU provider with a cache directory: the weights come from the model's entry in
  runtime/onnx/cache.py, mapped in place. `prepack` decides when onnxruntime pre-packs
  MatMul/Gemm weights (a second, faster-to-multiply copy): "on" at load; "auto" only once a
  batch of more than one row has run (a one-row run is as fast unpacked), through
  `upgrade_blocking` in the background, swapped in between two runs; "off" never.
- default, everywhere else (a GPU, `weights_cache = false`, or an entry that cannot be made):
  onnxruntime reads the file and pre-packs at load.

With `tokenize = true` the loaded graph is wrapped by runtime/onnx/text.py, which adds the
`text` input and the pooled `embedding` and `token_count` outputs, or, for a text classifier
(task "text-classification", from the entry or config.json), by runtime/onnx/text_classifier.py,
which adds the `text` and `text_pair` inputs to its `logits`.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import onnxruntime as ort

from snoozeml.config.settings import ModelConfig
from snoozeml.errors import describe_exception
from snoozeml.logs import log_event
from snoozeml.runtime.base import FileSizes, Instance, LoadPlan, looks_out_of_memory
from snoozeml.runtime.onnx.cache import CacheError, build_blocking, entry_key, find_blocking
from snoozeml.runtime.onnx.cache_entry import Entry
from snoozeml.runtime.onnx.diagnose import diagnose_blocking
from snoozeml.runtime.onnx.instance import OnnxInstance
from snoozeml.runtime.onnx.mapped import MappedWeights
from snoozeml.runtime.onnx.ml_outputs import (
    NoTensorForm,
    holds_zipmap_after_all_blocking,
    may_rewrite_blocking,
    session_blocking,
)
from snoozeml.runtime.onnx.text import load_text_blocking
from snoozeml.runtime.onnx.text_classifier import load_text_classifier_blocking
from snoozeml.runtime.text.by_length import default_budget
from snoozeml.runtime.text.settings import text_task

# A mapped load's peak beyond its measured size, besides its graph: onnxruntime's own session
# structures (measured: under 0.1 MiB above the resident size for a 92 MiB model).
SESSION_BYTES = 1024 * 1024

# onnxruntime's own logger prints coloured lines to stderr; errors reach our logs as exceptions.
ort.set_default_logger_severity(4)


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


class OnnxSessions:
    """The loads of one backend's models (runtime/onnx/backend.py's OnnxBackend, which holds
    `unbuildable`: the entry keys whose build failed in this process)."""

    def __init__(self, cache_dir: Path | None, unbuildable: set[str]) -> None:
        self._cache_dir = cache_dir  # None: no weights cache, every load takes the default path
        self._unbuildable = unbuildable

    def load_plan_blocking(self, spec: ModelConfig, sizes: FileSizes) -> LoadPlan:
        """The next load's path and transient bytes. "mapped" when the model has a valid
        entry (read through once per process): its graph beside the weights, and the packed
        copy with prepack "on". Otherwise "default": the protobuf beside the weights, with
        the entry written afterwards in the background when the cache applies. "rewritten"
        for a model with ZipMap outputs (runtime/onnx/ml_outputs.py): its graph is parsed,
        rewritten and written once more before onnxruntime reads it."""
        if may_rewrite_blocking(spec.path):
            return LoadPlan("rewritten", 3 * sizes.transient)
        if not self._maps(spec):
            return LoadPlan("default", sizes.transient)
        assert self._cache_dir is not None
        try:
            entry = find_blocking(self._cache_dir, spec.path)
        except (CacheError, OSError):
            # Writing the entry maps the weights once more while onnxruntime optimizes them.
            build = self._buildable(spec)
            return LoadPlan("default", sizes.transient, background=build,
                            background_bytes=sizes.weights if build else 0)
        # The graph twice (its protobuf, onnxruntime's graph) and the session's own structures.
        graph = 2 * entry.graph_bytes + SESSION_BYTES
        return LoadPlan("mapped", graph + (entry.packed_bytes if spec.prepack == "on" else 0),
                        least=entry.weights_bytes)

    def background_blocking(self, spec: ModelConfig) -> None:
        """Write the model's entry, so that its next loads map it. Runs after a default load,
        while the model serves: it streams the weights through a 4 MiB buffer, then maps
        them while onnxruntime saves the optimized graph (onnx_cache._optimize)."""
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
                and not may_rewrite_blocking(spec.path)
                and _cpu_only(providers_for(spec.device, spec.tensorrt,
                                            ort.get_available_providers(), warn=False)))

    def has_cuda(self) -> bool:
        """Whether this onnxruntime has the CUDA provider."""
        return "CUDAExecutionProvider" in ort.get_available_providers()

    def load_blocking(self, spec: ModelConfig) -> Instance:
        if spec.tokenize and text_task(spec) == "text-classification":
            return load_text_classifier_blocking(spec, lambda: self._load_graph_blocking(spec),
                                                 _token_budget(spec))
        if spec.tokenize:
            return load_text_blocking(spec, lambda: self._load_graph_blocking(spec),
                                      _token_budget(spec))
        return self._load_graph_blocking(spec)

    def _load_graph_blocking(self, spec: ModelConfig) -> OnnxInstance:
        providers = providers_for(spec.device, spec.tensorrt, ort.get_available_providers())
        if may_rewrite_blocking(spec.path):  # ZipMap outputs, served as tensors
            rewritten = session_blocking(spec.path, lambda graph: ort.InferenceSession(
                str(graph), sess_options=_options(spec, spec.prepack != "off"),
                providers=providers))
            if rewritten is not None:
                return OnnxInstance(spec.name, rewritten)
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
        try:
            session = ort.InferenceSession(str(spec.path),
                                           sess_options=_options(spec, spec.prepack != "off"),
                                           providers=providers)
        except Exception as exc:
            problem = None if looks_out_of_memory(exc) else diagnose_blocking(spec.path)
            if problem is None:
                raise
            raise RuntimeError(f"{spec.path}: {problem}; onnxruntime: "
                               f"{describe_exception(exc)}") from exc
        try:
            return OnnxInstance(spec.name, session)
        except NoTensorForm:
            del session
            if not holds_zipmap_after_all_blocking(spec.path):  # not a file too large to scan
                raise
        return self._load_graph_blocking(spec)  # rewritten, now that the file is known

    def _entry_blocking(self, spec: ModelConfig) -> Entry | None:
        """The model's valid entry, when the cache applies and has one."""
        if not self._maps(spec):
            return None
        assert self._cache_dir is not None
        try:
            return find_blocking(self._cache_dir, spec.path)
        except (CacheError, OSError):
            return None  # the default load; the entry is written after it (background)


def _token_budget(spec: ModelConfig) -> int:
    """Padded tokens per run of a text model's sorted rows: the entry's, else the default for
    where its graph runs (runtime/text/by_length.py)."""
    if spec.batching.max_batch_tokens is not None:
        return spec.batching.max_batch_tokens
    on_cpu = _cpu_only(providers_for(spec.device, spec.tensorrt, ort.get_available_providers(),
                                     warn=False))
    return default_budget("cpu" if on_cpu else "cuda")


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
