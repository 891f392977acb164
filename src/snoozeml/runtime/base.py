"""The contract every backend implements: everything the engine may ask of one, and nothing else.

Layering: `runtime/` sits below `engine/`. It imports nothing from `engine/`, `api/` or any web
or gRPC library; the engine chooses a backend through `runtime/registry.py`. Calls whose names
end in `_blocking` do real work (file reads, model loads, inference) and run off the event loop.

Every capability is declared here, none is discovered with `getattr`: a backend with nothing
to do for one implements it as a no-op.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

import numpy as np

from snoozeml.config.settings import ModelConfig
from snoozeml.datatypes import ModelMetadata
from snoozeml.errors import InvalidInput

Arrays = dict[str, np.ndarray]
# Each input's OIP `parameters`, by the input's name (an input without any may be absent): a
# text pair model reads `text_pair`'s `max_tokens` (runtime/text/pairs.py); others ignore them.
InputParameters = Mapping[str, Mapping[str, object]]
NO_PARAMETERS: InputParameters = MappingProxyType({})
# Blocking work that completes a request's inputs before it is queued (decoding its images).
Prepare = Callable[[], None]


@dataclass(frozen=True, slots=True)
class FileSizes:
    """What a model's files say about its memory, before it is loaded."""

    weights: int  # every byte the model loads
    transient: int  # extra bytes held only while loading (onnx: the .onnx protobuf itself)


@dataclass(frozen=True, slots=True)
class LoadPlan:
    """How the next load of a model will go: which path (a backend's own name for it, e.g.
    onnx "mapped", "build" or "default") and what it holds beyond the model's size meanwhile."""

    path: str
    transient: int
    background: bool = False  # work for `background_blocking` once the load has finished
    background_bytes: int = 0  # what that work holds while it runs
    least: int = 0  # the least the model will hold once loaded this way (onnx mapped: its weights)


class Unsplittable(Exception):
    """A batched run's outputs do not follow the batch's rows (axis 0 is not a batch there):
    the engine runs the requests alone instead, and stops batching the model."""


class Instance(Protocol):
    """One loaded copy of a model. `*_blocking` calls come from one worker thread at a time."""

    @property
    def metadata(self) -> ModelMetadata: ...

    def validate_inputs(self, inputs: Arrays,
                        parameters: InputParameters = NO_PARAMETERS) -> Prepare | None:
        """Checks that need the loaded model, run on the event loop before the request is
        queued (so a bad request fails alone, never its batch): raises InvalidInput or
        Unsupported. May replace arrays in `inputs` with converted ones. `parameters` are the
        request's inputs' own (the ones a backend does not read are ignored). Returns None, or
        the blocking work that completes `inputs` (decoding images, cutting documents to
        `max_tokens`), which the engine runs on its preparation pool before queueing; it raises
        as this method does."""
        ...

    def run_blocking(self, inputs: Arrays, outputs: Sequence[str] | None) -> Arrays:
        """One request: the outputs named (all of them when `outputs` is None). Raises
        InvalidInput when the runtime refuses the input; anything else is a backend failure."""
        ...

    def run_batch_blocking(
        self, requests: Sequence[Arrays], outputs: Sequence[str] | None
    ) -> list[Arrays]:
        """Several requests as one run, each answered with exactly its own rows. Raises
        Unsplittable when the outputs cannot be split back by rows."""
        ...

    def upgrade_bytes(self, rows: int) -> int:
        """Bytes a faster form of this instance would add while it is built (onnx: a
        pre-packed session), when a batch of `rows` made one worth building; 0 for none."""
        ...

    def upgrade_blocking(self) -> bool:
        """Build the faster form and swap it in between two runs (requests keep running on
        the current form meanwhile); False when there was nothing to do."""
        ...

    def close(self) -> None:
        """Release the model's memory (called once, after the last run; waits for an
        upgrade under way)."""
        ...


class Backend(Protocol):
    """Loads one model format. One backend object per configured model."""

    def file_sizes_blocking(self, spec: ModelConfig) -> FileSizes:
        """Sizes from the model's files, without loading weights. It may raise OSError for
        files it cannot read: the load then fails with its own message."""
        ...

    def memory_device(self, spec: ModelConfig, gpus: Sequence[str]) -> str:
        """The device whose memory budget the model counts against: a GPU among `gpus` when it
        will run there, else "cpu"."""
        ...

    def prepare_blocking(self, spec: ModelConfig) -> None:
        """Import what the model's code needs before its load is measured: memory that stays
        for the life of the process is not the model's."""
        ...

    def load_plan_blocking(self, spec: ModelConfig, sizes: FileSizes) -> LoadPlan:
        """The path the next load will take and its transient bytes, predicted from files
        (cheap: called before every load, for its admission)."""
        ...

    def load_blocking(self, spec: ModelConfig) -> Instance: ...

    def background_blocking(self, spec: ModelConfig) -> None:
        """Work a load left for later (onnx: writing the weights cache entry that the next
        loads map), run on a loader thread while the model serves. Logs its own failures."""
        ...

    def is_out_of_memory(self, exc: BaseException) -> bool:
        """Whether `exc`, raised by this backend's load or run, means memory ran out."""
        ...


# --- helpers shared by the backends -----------------------------------------------------------

_OOM_MARKERS = (
    "failed to allocate memory",
    "bad_alloc",
    "bad allocation",
    "out of memory",
    "cudaerrormemoryallocation",
)


def looks_out_of_memory(exc: BaseException) -> bool:
    """MemoryError, or an exception whose message is an allocator's (onnxruntime raises
    RuntimeException with its arena's message; CUDA says "out of memory")."""
    if isinstance(exc, MemoryError):
        return True
    text = str(exc).lower()
    return any(marker in text for marker in _OOM_MARKERS)


def requested_gpu(device: str, gpus: Sequence[str]) -> str:
    """The GPU a model's `device` asks for ("auto" and "cuda" mean cuda:0) when it is among
    `gpus`; otherwise "cpu" (mps shares the host's memory)."""
    if device in ("cpu", "mps") or not gpus:
        return "cpu"
    wanted = "cuda:0" if device in ("auto", "cuda") else device
    return wanted if wanted in gpus else "cpu"


def utf8_strings(array: np.ndarray, name: str) -> np.ndarray:
    """A BYTES tensor as str objects, for runtimes that take text; an element that is not
    UTF-8 is this request's 400. Returns `array` itself when it already holds only str."""
    flat = array.reshape(-1)
    if all(type(v) is str for v in flat):
        return array
    strings = np.empty(flat.shape[0], dtype=object)
    for i, value in enumerate(flat):
        try:
            strings[i] = value.decode("utf-8") if isinstance(value, bytes) else str(value)
        except UnicodeDecodeError as exc:
            raise InvalidInput(f"input {name!r}: element {i} is not valid UTF-8 "
                               f"({exc.reason} at byte {exc.start})") from None
    return strings.reshape(array.shape)
