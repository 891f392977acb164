"""A corpus of broken model files, the ways real ones break: empty, cut short, not a model at
all, missing the file beside them, lying about their own layout, a folder where a file should be,
unreadable. Each writer makes one broken model in a folder and returns its path; `CORPUS` names
them with what the daemon's reason for the failed load must say.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx_models import write_mlp


def _mlp_bytes(folder: Path) -> bytes:
    return write_mlp(folder / "source" / "mlp.onnx").read_bytes()


def empty(folder: Path) -> Path:
    path = folder / "empty.onnx"
    path.write_bytes(b"")
    return path


def truncated(fraction: float) -> Callable[[Path], Path]:
    def write(folder: Path) -> Path:
        data = _mlp_bytes(folder)
        path = folder / f"truncated-{int(fraction * 100)}.onnx"
        path.write_bytes(data[: int(len(data) * fraction)])
        return path

    return write


def random_bytes(folder: Path) -> Path:
    path = folder / "random.onnx"
    path.write_bytes(np.random.default_rng(7).integers(0, 256, 4096, np.uint8).tobytes())
    return path


def not_a_model(folder: Path) -> Path:
    """A valid protobuf message, but a tensor, not a model."""
    path = folder / "tensor.onnx"
    tensor = numpy_helper.from_array(np.arange(64, dtype=np.float32), "weights")
    path.write_bytes(tensor.SerializeToString())
    return path


def _external_model(folder: Path, name: str) -> tuple[Path, Path]:
    """A one-MatMul model whose 64x64 weight lives in `<name>.data` beside it."""
    weight = numpy_helper.from_array(np.ones((64, 64), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "external",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 64])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = folder / f"{name}.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=f"{name}.data", size_threshold=0)
    return path, folder / f"{name}.data"


def external_missing(folder: Path) -> Path:
    path, data = _external_model(folder, "no-data")
    data.unlink()
    return path


def external_short(folder: Path) -> Path:
    path, data = _external_model(folder, "short-data")
    data.write_bytes(data.read_bytes()[:1000])
    return path


def external_directory(folder: Path) -> Path:
    path, data = _external_model(folder, "dir-data")
    data.unlink()
    data.mkdir()
    return path


def onnx_directory(folder: Path) -> Path:
    """A folder named like a model file, with nothing a model folder holds."""
    path = folder / "folder.onnx"
    path.mkdir()
    (path / "README").write_text("not a model\n")
    return path


def unreadable(folder: Path) -> Path:
    """Mode 000: the daemon runs without the root's right to read it anyway (tests)."""
    path = write_mlp(folder / "unreadable.onnx")
    path.chmod(0)
    return path


MODULE = '''\
from torch import nn


def build() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 3))
'''
TORCH_IO = """inputs = [{ name = "x", datatype = "FP32", shape = [-1, 8] }]
outputs = [{ name = "y", datatype = "FP32", shape = [-1, 3] }]
module = "brokenmodule:build"
"""


def _safetensors(tensors: dict[str, np.ndarray], lie: int = 0) -> bytes:
    """The safetensors layout by hand: an 8-byte header length, a JSON header of offsets, the
    bytes. `lie` moves the last tensor's end offset past what the file holds."""
    header: dict[str, object] = {}
    offset = 0
    blobs = []
    for name, array in tensors.items():
        blob = array.astype(np.float32).tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    last = header[list(tensors)[-1]]
    assert isinstance(last, dict)
    last["data_offsets"] = [last["data_offsets"][0], last["data_offsets"][1] + lie]
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def _state_dict() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {"0.weight": rng.standard_normal((16, 8)), "0.bias": rng.standard_normal(16),
            "2.weight": rng.standard_normal((3, 16)), "2.bias": rng.standard_normal(3)}


def safetensors_lying(folder: Path) -> Path:
    path = folder / "lying" / "weights.safetensors"
    path.parent.mkdir()
    (path.parent / "brokenmodule.py").write_text(MODULE)
    path.write_bytes(_safetensors(_state_dict(), lie=4096))
    return path


def safetensors_truncated(folder: Path) -> Path:
    path = folder / "cut" / "weights.safetensors"
    path.parent.mkdir()
    (path.parent / "brokenmodule.py").write_text(MODULE)
    data = _safetensors(_state_dict())
    path.write_bytes(data[: len(data) // 2])
    return path


def safetensors_header_garbage(folder: Path) -> Path:
    path = folder / "garbage" / "weights.safetensors"
    path.parent.mkdir()
    (path.parent / "brokenmodule.py").write_text(MODULE)
    path.write_bytes(struct.pack("<Q", 40) + b"{this is not json at all, not at all!!}" + b"\0")
    return path


def hf_bad_config(folder: Path) -> Path:
    """A Hugging Face folder whose config.json is not JSON."""
    path = folder / "bad-config"
    path.mkdir()
    (path / "config.json").write_text("{ this is not json")
    (path / "model.safetensors").write_bytes(_safetensors(_state_dict()))
    return path


@dataclass(frozen=True)
class Broken:
    name: str
    write: Callable[[Path], Path]
    says: tuple[str, ...]  # what the reason must contain (lower-cased)
    torch_keys: str = ""  # the extra models.toml lines it needs


CORPUS = [
    Broken("empty", empty, ("empty.onnx", "the file is empty")),
    Broken("truncated-10", truncated(0.10), ("the file is truncated", "ends at byte")),
    Broken("truncated-50", truncated(0.50), ("the file is truncated", "ends at byte")),
    Broken("truncated-99", truncated(0.99), ("the file is truncated", "ends at byte")),
    Broken("random-bytes", random_bytes, ("not an onnx model", "starts no protobuf field")),
    Broken("not-a-model", not_a_model, ("not an onnx model", "another kind")),
    Broken("external-missing", external_missing, ("no-data.data", "no such file")),
    Broken("external-short", external_short, ("short-data.data", "too short", "has 1000")),
    Broken("external-directory", external_directory, ("dir-data.data", "not a regular file")),
    Broken("onnx-directory", onnx_directory, ("folder.onnx", "no config.json")),
    Broken("unreadable", unreadable, ("unreadable.onnx", "permission denied")),
    Broken("safetensors-lying", safetensors_lying,
           ("lying/weights.safetensors", "not a valid safetensors file", "offset"), TORCH_IO),
    Broken("safetensors-truncated", safetensors_truncated,
           ("cut/weights.safetensors", "not a valid safetensors file"), TORCH_IO),
    Broken("safetensors-garbage", safetensors_header_garbage,
           ("garbage/weights.safetensors", "invalid json"), TORCH_IO),
    Broken("hf-bad-config", hf_bad_config, ("bad-config/config.json", "not valid json")),
]
