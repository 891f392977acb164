"""Raw tensor bytes, shared by the HTTP binary extension and gRPC raw contents.

Little-endian, row-major, no padding; BOOL is one byte per element; each BYTES element is a
4-byte little-endian length followed by its bytes.
"""

from __future__ import annotations

import math
import struct

import numpy as np

from snoozeml.datatypes import OIP_TO_NUMPY
from snoozeml.errors import InvalidInput

_LENGTH = struct.Struct("<I")


def serialize_bytes(array: np.ndarray) -> bytes:
    """Length-prefixed elements of a BYTES tensor (str elements are UTF-8 encoded)."""
    parts: list[bytes] = []
    for value in array.reshape(-1):
        item = value if isinstance(value, bytes) else str(value).encode("utf-8")
        parts.append(_LENGTH.pack(len(item)))
        parts.append(item)
    return b"".join(parts)


def deserialize_bytes(raw: bytes | memoryview, name: str, count: int) -> list[bytes]:
    """The elements of a BYTES tensor that holds `count`: at most count + 1 are read, so that
    a tensor with more is refused without reading them all (16 MB of empty elements are four
    million objects, seconds of the event loop, for a shape that may say one)."""
    data = bytes(raw)
    unpack = _LENGTH.unpack_from
    items: list[bytes] = []
    offset = 0
    end = len(data)
    while offset < end and len(items) <= count:
        if offset + 4 > end:
            raise InvalidInput(f"input {name!r}: BYTES data ends inside an element's length")
        (length,) = unpack(data, offset)
        start = offset + 4
        offset = start + length
        if offset > end:
            raise InvalidInput(
                f"input {name!r}: a BYTES element of {length} bytes runs past the end of the data"
            )
        items.append(data[start:offset])
    return items


def raw_to_array(
    name: str, datatype: str, shape: tuple[int, ...], raw: bytes | memoryview
) -> np.ndarray:
    """The numpy array for one tensor's raw bytes, checking the size against the shape."""
    count = math.prod(shape)
    if datatype == "BYTES":
        items = deserialize_bytes(raw, name, count)
        if len(items) != count:
            found = len(items) if len(items) < count else f"more than {count}"
            raise InvalidInput(
                f"input {name!r}: shape {list(shape)} needs {count} elements, the BYTES data "
                f"has {found}"
            )
        array = np.empty(count, dtype=object)
        array[:] = items
        return array.reshape(shape)
    dtype = OIP_TO_NUMPY[datatype].newbyteorder("<")
    expected = count * dtype.itemsize
    if len(raw) != expected:
        raise InvalidInput(
            f"input {name!r}: {datatype} {list(shape)} needs {expected} bytes of binary data, "
            f"got {len(raw)}"
        )
    array = np.frombuffer(raw, dtype=dtype)
    if datatype == "BOOL" and array.size and array.view(np.uint8).max() > 1:
        raise InvalidInput(f"input {name!r}: BOOL data must be bytes of 0 or 1")
    return array.reshape(shape)


def array_to_raw(datatype: str, array: np.ndarray) -> bytes:
    """The raw bytes of one output tensor."""
    if datatype == "BYTES":
        return serialize_bytes(array)
    if datatype == "BF16" and array.dtype != np.uint16:
        # A float tensor for a BF16 output: keep the upper half of each float32.
        words = np.ascontiguousarray(array, dtype="<f4").view("<u4") >> 16
        return words.astype("<u2").tobytes()
    return np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
