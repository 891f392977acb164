"""Splitting an ONNX model into a small graph and a file of aligned raw tensors, without parsing
its weights: the protobuf is walked at the wire level, field by field, and every byte that is
not a large main-graph initializer is copied through as it is.

Why not `onnx.load` + `onnx.save`: that parses the whole protobuf (a second copy of the
weights in memory), then copies each tensor's bytes out again, and held the GIL for ~70 ms at a
time on a 100 MB model: measured, building an entry that way took 2.2x the default load. Here
the weights stream from the source file to `weights.bin` through one 4 MiB buffer (read, not
through the mapping the walk uses, which touches only the fields' headers).

Only main-graph initializers move (those with `raw_data` in the file, or external data in a
file next to it), when their type has a fixed size, their bytes match their shape, and they are
not also graph inputs. Everything else, the nodes and their attributes included, is copied
verbatim: the rewritten graph is the same model, reading those tensors from `weights.bin`.

Wire format facts used (protobuf encoding; onnx.proto field numbers): a field is a varint key
(number << 3 | wire type) then a varint (type 0), 8 bytes (1), a varint length and that many
bytes (2), or 4 bytes (5). ModelProto.graph = 7; GraphProto.initializer = 5, .input = 11;
ValueInfoProto.name = 1; TensorProto.dims = 1, .data_type = 2, .name = 8, .raw_data = 9,
.external_data = 13 (StringStringEntryProto: key = 1, value = 2), .data_location = 14.
"""

from __future__ import annotations

import contextlib
import io
import math
import mmap
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

_MODEL_GRAPH = 7
_GRAPH_INITIALIZER = 5
_GRAPH_INPUT = 11
_TENSOR_DIMS, _TENSOR_TYPE, _TENSOR_NAME, _TENSOR_RAW = 1, 2, 8, 9
_TENSOR_EXTERNAL, _TENSOR_LOCATION = 13, 14
_EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL
_CHUNK = 4 * 1024 * 1024


class SplitError(Exception):
    """The file is not a protobuf this walk understands (a corrupt or exotic model)."""


@dataclass(slots=True)
class _Tensor:
    """What the walk learns of one initializer: where its fields are, and its bytes' source."""

    span: tuple[int, int]  # the TensorProto's bytes in the file
    name: str = ""
    data_type: int = 0
    dims: list[int] = field(default_factory=list)
    raw: tuple[int, int] | None = None  # offset, length of raw_data in the .onnx file
    external: dict[str, str] = field(default_factory=dict)
    location: int = 0
    kept: list[tuple[int, int]] = field(default_factory=list)  # fields copied verbatim


@dataclass(frozen=True, slots=True)
class Moved:
    """One tensor now in weights.bin."""

    name: str
    data_type: int
    shape: tuple[int, ...]
    offset: int
    length: int


def split_blocking(
    model: Path, graph_out: Path, weights_out: Path, storage: dict[int, int], align: int,
    min_bytes: int,
) -> tuple[list[Moved], int, list[Path]]:
    """Write `graph_out` and `weights_out` from `model`. `storage` maps an element type to
    its item size (the types that may move). Returns the tensors moved, the CRC-32 of
    weights.bin, and the external data files read."""
    with model.open("rb") as source, \
            mmap.mmap(source.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        view = memoryview(mapped)
        try:
            return _split(view, model, graph_out, weights_out, storage, align, min_bytes)
        finally:
            view.release()


@dataclass(frozen=True, slots=True)
class ExternalData:
    """A main-graph initializer's bytes in another file, as the model says."""

    tensor: str
    location: str
    offset: int
    length: int | None  # None: the model leaves it to the tensor's shape
    dims: tuple[int, ...]
    data_type: int


def external_data(view: memoryview) -> list[ExternalData]:
    """The main graph's initializers whose data the model (its bytes) says is in other
    files."""
    found = []
    for number, _, start, end in _fields(view, 0, len(view)):
        if number != _MODEL_GRAPH:
            continue
        for field_number, _, t_start, t_end in _fields(view, start, end):
            if field_number != _GRAPH_INITIALIZER:
                continue
            tensor = _tensor(view, t_start, t_end)
            if tensor.location != _EXTERNAL:
                continue
            length = tensor.external.get("length")
            found.append(ExternalData(
                tensor.name, tensor.external.get("location", ""),
                int(tensor.external.get("offset", "0") or 0),
                int(length) if length else None, tuple(tensor.dims), tensor.data_type))
    return found


def _split(
    view: memoryview, model: Path, graph_out: Path, weights_out: Path,
    storage: dict[int, int], align: int, min_bytes: int,
) -> tuple[list[Moved], int, list[Path]]:
    model_fields = list(_fields(view, 0, len(view)))
    graphs = [f for f in model_fields if f[0] == _MODEL_GRAPH]
    if len(graphs) != 1:
        raise SplitError(f"expected one graph in the model, found {len(graphs)}")
    _, _, graph_start, graph_end = graphs[0]
    graph_fields = list(_fields(view, graph_start, graph_end))
    inputs = {_input_name(view, start, end)
              for number, _, start, end in graph_fields if number == _GRAPH_INPUT}
    moved: list[Moved] = []
    externals: list[Path] = []
    crc = 0
    offset = 0
    graph = bytearray()
    buffer = bytearray(_CHUNK)
    with contextlib.ExitStack() as files, weights_out.open("wb") as weights:
        sources: dict[Path, io.BufferedReader] = {}  # each file opened once, however many tensors

        def source_of(path: Path) -> io.BufferedReader:
            if path not in sources:
                sources[path] = files.enter_context(path.open("rb"))
            return sources[path]

        for number, key_start, start, end in graph_fields:
            if number != _GRAPH_INITIALIZER:
                graph += view[key_start:end]
                continue
            tensor = _tensor(view, start, end)
            source = _source(tensor, model, storage, min_bytes, inputs)
            if source is None:
                graph += view[key_start:end]
                continue
            path, at, length = source
            padding = -offset % align
            if padding:
                weights.write(bytes(padding))
                crc = zlib.crc32(bytes(padding), crc)
                offset += padding
            if path is not None and path not in externals:
                externals.append(path)
            # Read, not copied from the mapping: the mapping's pages would count in RSS.
            crc = _copy(source_of(path or model), at, length, weights, buffer, crc)
            moved.append(Moved(tensor.name, tensor.data_type, tuple(tensor.dims), offset,
                               length))
            graph += _field(_GRAPH_INITIALIZER, _rewritten(view, tensor, offset, length))
            offset += length
    out = bytearray()
    for number, key_start, _, end in model_fields:
        out += _field(_MODEL_GRAPH, bytes(graph)) if number == _MODEL_GRAPH \
            else view[key_start:end]
    graph_out.write_bytes(bytes(out))
    return moved, crc, externals


def _source(
    tensor: _Tensor, model: Path, storage: dict[int, int], min_bytes: int, inputs: set[str],
) -> tuple[Path | None, int, int] | None:
    """Where the tensor's bytes are (None as the path: the .onnx file itself), when it moves."""
    size = storage.get(tensor.data_type)
    if size is None or tensor.name in inputs or any(d < 0 for d in tensor.dims):
        return None
    expected = math.prod(tensor.dims) * size
    if expected < min_bytes:
        return None
    if tensor.location != _EXTERNAL:
        if tensor.raw is None or tensor.raw[1] != expected:
            return None
        return None, tensor.raw[0], expected
    location = tensor.external.get("location", "")
    path = (model.parent / location).resolve()
    if not location or model.parent.resolve() not in path.parents:
        return None  # outside the model's folder: onnxruntime would refuse it too
    try:
        at = int(tensor.external.get("offset", "0"))
        length = int(tensor.external.get("length", str(expected)))
    except ValueError:
        return None
    if length != expected or at < 0 or not path.is_file() or \
            path.stat().st_size < at + length:
        return None  # a short file fails at load, with onnxruntime's words
    return path, at, length


def _rewritten(view: memoryview, tensor: _Tensor, offset: int, length: int) -> bytes:
    """The tensor's fields but its data ones, pointing at weights.bin instead."""
    out = bytearray()
    for start, end in tensor.kept:
        out += view[start:end]
    for key, value in (("location", "weights.bin"), ("offset", str(offset)),
                       ("length", str(length))):
        entry = _field(1, key.encode()) + _field(2, value.encode())
        out += _field(_TENSOR_EXTERNAL, entry)
    out += _varint((_TENSOR_LOCATION << 3) | 0) + _varint(_EXTERNAL)
    return bytes(out)


# --- the wire format --------------------------------------------------------------------------


def _fields(view: memoryview, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, where its key starts, where its value starts, where it ends) for each
    field in view[start:end]; a length-delimited value starts after its length."""
    at = start
    while at < end:
        key_start = at
        key, at = read_varint(view, at, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise SplitError(f"field number 0 at byte {key_start}")
        if wire == 0:
            _, value_end = read_varint(view, at, end)
            yield number, key_start, at, value_end
            at = value_end
        elif wire == 1:
            yield number, key_start, at, at + 8
            at += 8
        elif wire == 2:
            length, value_start = read_varint(view, at, end)
            at = value_start + length
            yield number, key_start, value_start, at
        elif wire == 5:
            yield number, key_start, at, at + 4
            at += 4
        else:
            raise SplitError(f"wire type {wire} at byte {key_start}")
        if at > end:
            raise SplitError(f"a field at byte {key_start} runs past its message")


def read_varint(view: memoryview, at: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= end or shift > 63:
            raise SplitError(f"truncated or overlong varint at byte {at}")
        byte = view[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _varint((number << 3) | 2) + _varint(len(payload)) + payload


def _input_name(view: memoryview, start: int, end: int) -> str:
    for number, _, value_start, value_end in _fields(view, start, end):
        if number == 1:
            return bytes(view[value_start:value_end]).decode("utf-8", "replace")
    return ""


def _tensor(view: memoryview, start: int, end: int) -> _Tensor:
    tensor = _Tensor((start, end))
    for number, key_start, value_start, value_end in _fields(view, start, end):
        value = view[value_start:value_end]
        if number == _TENSOR_RAW:
            tensor.raw = (value_start, value_end - value_start)
            continue
        if number == _TENSOR_EXTERNAL:
            tensor.external.update([_entry(view, value_start, value_end)])
            continue
        if number == _TENSOR_LOCATION:
            tensor.location = read_varint(view, value_start, value_end)[0]
            continue
        tensor.kept.append((key_start, value_end))
        if number == _TENSOR_TYPE:
            tensor.data_type = read_varint(view, value_start, value_end)[0]
        elif number == _TENSOR_NAME:
            tensor.name = bytes(value).decode("utf-8", "replace")
        elif number == _TENSOR_DIMS:
            tensor.dims += _dims(view, key_start, value_start, value_end)
    return tensor


def _dims(view: memoryview, key_start: int, start: int, end: int) -> list[int]:
    wire = view[key_start] & 7
    if wire == 0:  # one dim
        return [_signed(read_varint(view, start, end)[0])]
    dims = []  # packed
    at = start
    while at < end:
        value, at = read_varint(view, at, end)
        dims.append(_signed(value))
    return dims


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _entry(view: memoryview, start: int, end: int) -> tuple[str, str]:
    key = value = ""
    for number, _, value_start, value_end in _fields(view, start, end):
        text = bytes(view[value_start:value_end]).decode("utf-8", "replace")
        if number == 1:
            key = text
        elif number == 2:
            value = text
    return key, value


# --- copying ----------------------------------------------------------------------------------


def _copy(source: io.BufferedReader, at: int, length: int, out: BinaryIO, buffer: bytearray,
          crc: int) -> int:
    source.seek(at)
    remaining = length
    view = memoryview(buffer)
    while remaining:
        read = source.readinto(view[:min(remaining, len(buffer))])
        if not read:
            raise SplitError(f"{source.name} ended {remaining} bytes early")
        out.write(view[:read])
        crc = zlib.crc32(view[:read], crc)
        remaining -= read
    return crc
