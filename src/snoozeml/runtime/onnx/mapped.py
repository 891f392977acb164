"""An entry's weights mapped into the process (runtime/onnx/cache.py makes the entries): one
read-only mapping of `weights.bin`, and an OrtValue over each tensor in it that a session takes
in place through `SessionOptions.add_initializer`."""

from __future__ import annotations

import contextlib
import mmap

import numpy as np
import onnxruntime as ort

from snoozeml.runtime.onnx.cache_entry import RETYPED, STORAGE, Entry


class MappedWeights:
    """`weights.bin` mapped read-only, and one OrtValue per tensor over the mapping. Keep it
    alive as long as any session built on its values."""

    def __init__(self, entry: Entry) -> None:
        self.bytes = entry.weights_bytes
        self.packed_bytes = entry.packed_bytes
        self._packed = [(slot.offset, slot.length) for slot in entry.slots if slot.packed]
        self._map: mmap.mmap | None = None
        self.values: dict[str, ort.OrtValue] = {}
        if not entry.slots:
            return
        with entry.weights.open("rb") as file:
            # Populated now: the load, not the first request, pays for the page faults, and the
            # load's measured memory includes the weights.
            flags = mmap.MAP_PRIVATE | getattr(mmap, "MAP_POPULATE", 0)
            self._map = mmap.mmap(file.fileno(), entry.weights_bytes, flags=flags,
                                  prot=mmap.PROT_READ)
        for slot in entry.slots:
            storage = np.dtype(STORAGE[slot.onnx_type])
            array = np.frombuffer(self._map, dtype=storage, count=slot.length // storage.itemsize,
                                  offset=slot.offset).reshape(slot.shape)
            self.values[slot.name] = (
                ort.OrtValue.ortvalue_from_numpy_with_onnx_type(array, slot.onnx_type)
                if slot.onnx_type in RETYPED else ort.OrtValue.ortvalue_from_numpy(array)
            )

    def add_to(self, options: ort.SessionOptions) -> None:
        for name, value in self.values.items():
            options.add_initializer(name, value)

    def release_packed(self) -> None:
        """Drop the pages of the tensors a pre-packing session has copied from this process
        (they stay in the page cache). Safe even if a session still reads one: a page read
        again is faulted back in from the file."""
        if self._map is None:
            return
        page = mmap.PAGESIZE
        for offset, length in self._packed:
            start = -(-offset // page) * page
            end = (offset + length) // page * page
            if end > start:
                self._map.madvise(mmap.MADV_DONTNEED, start, end - start)

    def close(self) -> None:
        """Unmap, once no session uses the values (the caller's promise)."""
        self.values.clear()
        mapping, self._map = self._map, None
        if mapping is not None:
            with contextlib.suppress(BufferError):  # an array still alive unmaps when it goes
                mapping.close()
