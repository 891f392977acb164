"""What a model's files say before it is loaded: the bytes its weights take, and which files an
ONNX model keeps its tensors in. One reading, shared by memory admission and `snooze scan`.

ONNX tensors may live outside the `.onnx` file ("external data"), referenced by a location
relative to it: initializers, and tensors in node attributes (a Constant's `value`), in the main
graph, in subgraphs (If, Loop, Scan bodies) and in model-local functions.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from snoozeml.runtime.base import FileSizes

if TYPE_CHECKING:
    from onnx import GraphProto, ModelProto, NodeProto, SparseTensorProto, TensorProto

# A larger .onnx file holds its own weights: reading its structure would cost as much as
# loading it, for external data it almost surely does not have.
EXTERNAL_SCAN_LIMIT = 64 * 1024 * 1024
TORCH_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


# --- ONNX tensors -----------------------------------------------------------------------------


def onnx_tensors(model: ModelProto) -> Iterator[TensorProto]:
    """Every tensor an ONNX model may keep in external data, wherever in the model it is."""
    yield from _graph_tensors(model.graph)
    for function in model.functions:
        yield from _node_tensors(function.node)


def _graph_tensors(graph: GraphProto) -> Iterator[TensorProto]:
    yield from graph.initializer
    yield from _sparse_parts(graph.sparse_initializer)
    yield from _node_tensors(graph.node)


def _node_tensors(nodes: Iterable[NodeProto]) -> Iterator[TensorProto]:
    for node in nodes:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            if attribute.HasField("sparse_tensor"):
                yield from _sparse_parts([attribute.sparse_tensor])
            yield from _sparse_parts(attribute.sparse_tensors)
            if attribute.HasField("g"):
                yield from _graph_tensors(attribute.g)
            for subgraph in attribute.graphs:
                yield from _graph_tensors(subgraph)


def _sparse_parts(tensors: Iterable[SparseTensorProto]) -> Iterator[TensorProto]:
    for sparse in tensors:
        yield sparse.values
        yield sparse.indices


def external_data_paths(model: ModelProto, folder: Path) -> set[Path]:
    """The resolved paths of the files `model`'s tensors live in; `folder` is the one holding
    the .onnx file, which locations are relative to. Empty when every tensor is inside it."""
    return {
        (folder / entry.value).resolve()
        for tensor in onnx_tensors(model)
        if tensor.data_location == tensor.EXTERNAL
        for entry in tensor.external_data
        if entry.key == "location"
    }


# --- sizes ------------------------------------------------------------------------------------


def onnx_file_sizes_blocking(path: Path) -> FileSizes:
    """The .onnx file plus its external data as weights; the file alone as the load's transient
    (onnxruntime holds the parsed protobuf next to the weights it builds from it)."""
    size = path.stat().st_size
    return FileSizes(size + _external_bytes(path, size), size)


def _external_bytes(path: Path, size: int) -> int:
    if size > EXTERNAL_SCAN_LIMIT:
        return 0
    try:
        if not _names_a_location(path):
            return 0
        import onnx  # heavy: only once there is a file that may name external data

        files = external_data_paths(onnx.load(str(path), load_external_data=False), path.parent)
    except Exception:  # an unreadable file fails at load, with its own message
        return 0
    return sum(file.stat().st_size for file in files if file.is_file())


def _names_a_location(path: Path) -> bool:
    """Whether the file's bytes hold "location" anywhere. An external tensor names its file under
    that key, and protobuf keeps strings as they are, so a model without it has no external
    data, and onnx (a heavy import) is not needed to say so."""
    with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as view:
        return view.find(b"location") != -1


def torch_file_sizes_blocking(path: Path) -> FileSizes:
    """A weights file itself, or a folder's weight files (config, tokenizer and docs do not
    take model memory); nothing transient."""
    files = [path] if path.is_file() else [
        p for p in path.rglob("*") if p.suffix in TORCH_WEIGHT_SUFFIXES
    ]
    return FileSizes(sum(p.stat().st_size for p in files if p.is_file()), 0)


def bytes_on_disk(path: Path) -> int:
    """A file's size, or the sum of every file under a folder; 0 for what cannot be read."""
    try:
        if path.is_file():
            return path.stat().st_size
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    except OSError:
        return 0
