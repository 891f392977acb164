"""What is wrong with an `.onnx` file onnxruntime refused, in words a user can act on.

onnxruntime says "Protobuf parsing failed" for a file cut short by a failed copy, for random
bytes and for a protobuf of another kind alike, and "No graph was found" for an empty file. This
walks the file's top level at the protobuf wire level (run only after a failed load: it reads
the field headers, never the weights) and names the first thing that cannot be a ModelProto:
where the file ends too soon, a byte that starts no field, a field of the wrong kind, no graph;
then the external data files the graph names: missing, not a file, too short.

Wire format facts (protobuf encoding): a field is a varint key (number << 3 | wire type), then a
varint (type 0), 8 bytes (1), a varint length and that many bytes (2) or 4 bytes (5); types 3
and 4 (groups) never occur in ONNX. onnx.proto's ModelProto fields and their wire types are
`_MODEL_FIELDS`; numbers it does not list are allowed (newer onnx versions add fields).
"""

from __future__ import annotations

import math
import mmap
import stat
from pathlib import Path

import numpy as np

from snoozeml.runtime.onnx.cache_entry import STORAGE
from snoozeml.runtime.onnx.split import SplitError, external_data, read_varint

_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5
_MODEL_FIELDS = {1: _VARINT, 2: _LENGTH, 3: _LENGTH, 4: _LENGTH, 5: _VARINT, 6: _LENGTH,
                 7: _LENGTH, 8: _LENGTH, 14: _LENGTH, 20: _LENGTH, 25: _LENGTH}
_GRAPH = 7
_LONGEST_FIELD_HEAD = 20  # a key and a length: two varints of at most 10 bytes each
_KINDS = {_VARINT: "a number", _FIXED64: "8 bytes", _LENGTH: "a length-prefixed value",
          _FIXED32: "4 bytes"}


def diagnose_blocking(path: Path) -> str | None:
    """Why `path` is not a loadable ONNX model file, or None when its top level looks sound
    (the problem is deeper, and onnxruntime's own words are the best there are)."""
    try:
        status = path.stat()
        if not stat.S_ISREG(status.st_mode):
            return None  # a folder is reported by the backend; a pipe or device by onnxruntime
        size = status.st_size
        if size == 0:
            return "the file is empty (0 bytes)"
        with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            view = memoryview(data)
            try:
                return _walk(view, size) or _external(view, path)
            finally:
                view.release()
    except OSError as exc:  # onnxruntime says "system error number 13"
        return f"cannot read the file: {exc.strerror or exc}"
    except ValueError:  # not something mmap can map (a device, a pipe)
        return None


def _walk(data: memoryview, size: int) -> str | None:
    position = 0
    graph = False
    while position < size:
        start = position
        try:
            key, position = read_varint(data, position, size)
            number, kind = key >> 3, key & 7
            if number == 0 or kind not in _KINDS:
                return (f"not an ONNX model: byte {start} of {size} starts no protobuf field "
                        "(random bytes, or another kind of file)")
            expected = _MODEL_FIELDS.get(number)
            if expected is not None and expected != kind:
                return (f"not an ONNX model: field {number} holds {_KINDS[kind]} where a "
                        f"model has {_KINDS[expected]} (a protobuf of another kind?)")
            if kind == _VARINT:
                _, position = read_varint(data, position, size)
            elif kind == _LENGTH:
                length, position = read_varint(data, position, size)
                if position + length > size:
                    return (f"the file is truncated: the field at byte {start} needs {length} "
                            f"bytes after byte {position}, but the file ends at byte {size} "
                            "(an interrupted copy or download?)")
                position += length
            else:
                position += 8 if kind == _FIXED64 else 4
                if position > size:
                    return _ends_inside(start, size)
        except SplitError:  # a varint past the end of the file, or longer than 64 bits
            if size - start <= _LONGEST_FIELD_HEAD:
                return _ends_inside(start, size)
            return (f"not an ONNX model: byte {start} of {size} starts no protobuf field "
                    "(random bytes, or another kind of file)")
        graph = graph or number == _GRAPH
    if not graph:
        return "not an ONNX model: a protobuf with no graph in it"
    return None


def _ends_inside(start: int, size: int) -> str:
    return (f"the file is truncated: it ends inside the field that starts at byte {start} "
            f"({size} bytes in all)")


def _external(data: memoryview, model: Path) -> str | None:
    """The first external data file that is missing, not a file, or too short."""
    try:
        refs = external_data(data)
    except (SplitError, ValueError):
        return None
    for ref in refs:
        path = model.parent / ref.location
        length = ref.length
        if length is None and ref.data_type in STORAGE:
            length = math.prod(ref.dims) * np.dtype(STORAGE[ref.data_type]).itemsize
        try:
            status = path.stat()
        except OSError as exc:
            return (f"the external data file {ref.location!r} of tensor {ref.tensor!r} "
                    f"cannot be read: {exc.strerror or exc}")
        if not stat.S_ISREG(status.st_mode):
            return (f"the external data file {ref.location!r} of tensor {ref.tensor!r} is "
                    "not a regular file")
        if length is not None and status.st_size < ref.offset + length:
            return (f"the external data file {ref.location!r} is too short: tensor "
                    f"{ref.tensor!r} needs bytes {ref.offset} to {ref.offset + length}, and "
                    f"the file has {status.st_size}")
    return None
