"""What an entry of the ONNX weights cache is (runtime/onnx/cache.py writes and checks them,
runtime/onnx/mapped.py maps them): its files, and where each tensor lives in `weights.bin`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

GRAPH = "graph.onnx"
WEIGHTS = "weights.bin"

# ONNX element types whose raw bytes numpy can view directly; the others stay in the graph.
# (BF16 and the FP8 types ride as same-sized integers and are typed again for onnxruntime.)
STORAGE: dict[int, str] = {
    1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64",
    9: "bool", 10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 16: "uint16",
    17: "uint8", 18: "uint8", 19: "uint8", 20: "uint8",
}
RETYPED = {16, 17, 18, 19, 20}  # BFLOAT16, FLOAT8*: numpy has no such dtype


@dataclass(frozen=True, slots=True)
class Slot:
    """Where one tensor lives in `weights.bin`."""

    name: str
    onnx_type: int
    shape: tuple[int, ...]
    offset: int
    length: int
    packed: bool  # onnxruntime's CPU provider keeps a pre-packed copy and not this one


@dataclass(frozen=True, slots=True)
class Entry:
    folder: Path
    slots: tuple[Slot, ...]
    weights_bytes: int  # the size of weights.bin
    graph_bytes: int

    @property
    def graph(self) -> Path:
        return self.folder / GRAPH

    @property
    def weights(self) -> Path:
        return self.folder / WEIGHTS

    @property
    def packed_bytes(self) -> int:
        """The bytes of the tensors a pre-packing session copies (see Slot.packed)."""
        return sum(slot.length for slot in self.slots if slot.packed)
