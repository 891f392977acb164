"""The ONNX backend (runtime/onnx/backend.py) on its own: which errors are out of memory (real
onnxruntime failures included), which device a model counts against, what its files
weigh (external data as weights, not as load transient), and the load plan that follows the
path the next load takes (with or without a cache entry)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from allocator_failures import ALLOCATOR_FAILURES
from model_specs import onnx_spec, spec_on
from onnx import TensorProto, helper, numpy_helper
from onnx_loads import spec, write_matmul
from onnx_models import write_corrupt_model, write_mlp

from snoozeml.runtime.base import FileSizes, LoadPlan
from snoozeml.runtime.files import EXTERNAL_SCAN_LIMIT
from snoozeml.runtime.onnx.backend import OnnxBackend
from snoozeml.runtime.onnx.cache import entry_key
from snoozeml.runtime.onnx.sessions import SESSION_BYTES


@pytest.mark.parametrize(("error", "expected"), ALLOCATOR_FAILURES)
def test_onnx_is_out_of_memory(error: BaseException, expected: bool) -> None:
    assert OnnxBackend().is_out_of_memory(error) is expected


def _allocating_session(tmp_path: Path) -> ort.InferenceSession:
    """A real onnxruntime session whose output shape is its INT64 input's values."""
    graph = helper.make_graph(
        [helper.make_node("ConstantOfShape", ["shape"], ["y"],
                          value=numpy_helper.from_array(np.array([1.0], np.float32)))],
        "allocate",
        [helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", "cols"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = tmp_path / "allocate.onnx"
    path.write_bytes(model.SerializeToString())
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_a_real_onnxruntime_allocation_failure_is_out_of_memory(tmp_path: Path) -> None:
    session = _allocating_session(tmp_path)
    with pytest.raises(Exception) as info:  # noqa: PT011 - the class is onnxruntime's own
        session.run(None, {"shape": np.array([10**6, 10**6], np.int64)})  # 4 TB of float32
    assert OnnxBackend().is_out_of_memory(info.value), info.value


def test_a_real_onnxruntime_input_error_is_not_out_of_memory(tmp_path: Path) -> None:
    session = _allocating_session(tmp_path)
    with pytest.raises(Exception) as info:  # noqa: PT011
        session.run(None, {"shape": np.array([2.0, 3.0], np.float32)})  # wrong dtype
    assert not OnnxBackend().is_out_of_memory(info.value), info.value


def test_an_onnx_model_counts_against_the_host_when_onnxruntime_has_no_cuda() -> None:
    spec = spec_on("cuda:0", fmt="onnx")
    has_cuda = "CUDAExecutionProvider" in ort.get_available_providers()
    assert OnnxBackend().memory_device(spec, ["cuda:0"]) == ("cuda:0" if has_cuda else "cpu")


@pytest.mark.parametrize(("device", "gpus"), [
    pytest.param("cpu", ["cuda:0"], id="cpu"),
    pytest.param("mps", ["cuda:0"], id="mps"),
    pytest.param("auto", [], id="auto-without-gpus"),
    pytest.param("cuda:3", ["cuda:0"], id="a-gpu-that-is-not-there"),
])
def test_an_onnx_model_counts_against_the_host_off_the_gpus(device: str,
                                                            gpus: list[str]) -> None:
    assert OnnxBackend().memory_device(spec_on(device, fmt="onnx"), gpus) == "cpu"


# A fresh interpreter: what the backend imports, and when, is the point.
FIRST_LOAD = """
import json, sys
from pathlib import Path
from snoozeml.config.settings import ModelConfig
from snoozeml.runtime.onnx.backend import OnnxBackend

spec = ModelConfig(name="mlp", path=Path(sys.argv[1]), format="onnx", device="cpu")
backend = OnnxBackend(Path(sys.argv[2]))
seen = {"built": "onnxruntime" in sys.modules}
backend.file_sizes_blocking(spec)
seen["device"] = backend.memory_device(spec, [])
seen["sized"] = "onnxruntime" in sys.modules
backend.prepare_blocking(spec)
seen["prepared"] = "onnxruntime" in sys.modules
instance = backend.load_blocking(spec)
seen["outputs"] = [o.name for o in instance.metadata.outputs]
instance.close()
print(json.dumps(seen))
"""


def test_onnxruntime_is_imported_at_the_first_load_not_when_a_model_is_built_or_sized(
    tmp_path: Path,
) -> None:
    path = write_mlp(tmp_path / "mlp.onnx")
    result = subprocess.run(
        [sys.executable, "-c", FIRST_LOAD, str(path), str(tmp_path / "cache")],
        capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen == {"built": False, "device": "cpu", "sized": False, "prepared": True,
                    "outputs": ["y"]}


def test_a_single_file_onnx_model_holds_its_file_and_peaks_at_twice_it(tmp_path: Path) -> None:
    path = write_mlp(tmp_path / "mlp.onnx", dims=(64, 256, 64))
    size = path.stat().st_size
    assert OnnxBackend().file_sizes_blocking(onnx_spec(path)) == FileSizes(size, size)


def test_external_data_counts_as_weights_but_not_as_load_transient(tmp_path: Path) -> None:
    write_mlp(tmp_path / "inline.onnx", dims=(64, 512, 64))
    model = onnx.load(str(tmp_path / "inline.onnx"))
    onnx.save_model(model, str(tmp_path / "external.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    graph_bytes = (tmp_path / "external.onnx").stat().st_size
    data_bytes = (tmp_path / "weights.bin").stat().st_size
    assert data_bytes > 100_000 > graph_bytes

    sizes = OnnxBackend().file_sizes_blocking(onnx_spec(tmp_path / "external.onnx"))
    assert sizes == FileSizes(graph_bytes + data_bytes, graph_bytes)


def test_an_unreadable_onnx_file_is_sized_by_its_bytes_and_fails_later_at_load(
    tmp_path: Path,
) -> None:
    path = write_corrupt_model(tmp_path / "broken.onnx")
    size = path.stat().st_size
    assert OnnxBackend().file_sizes_blocking(onnx_spec(path)) == FileSizes(size, size)


def test_a_large_onnx_file_is_not_read_for_external_data(tmp_path: Path) -> None:
    # Sparse: as big as the limit says without writing it. It would not parse either; the
    # point is that it is never parsed (a parse would cost as much as a load).
    path = tmp_path / "large.onnx"
    with path.open("wb") as file:
        file.truncate(EXTERNAL_SCAN_LIMIT + 1)
    (tmp_path / "weights.bin").write_bytes(b"\0" * 1000)
    size = EXTERNAL_SCAN_LIMIT + 1
    assert OnnxBackend().file_sizes_blocking(onnx_spec(path)) == FileSizes(size, size)


def test_the_load_plan_follows_the_path_the_next_load_takes(tmp_path: Path,
                                                           cache: Path) -> None:
    path = write_matmul(tmp_path / "m.onnx")
    backend = OnnxBackend(cache)
    sizes = backend.file_sizes_blocking(spec(path))
    default = LoadPlan("default", sizes.transient)
    # No entry yet: the default load, with the entry written afterwards.
    assert backend.load_plan_blocking(spec(path), sizes) == \
        LoadPlan("default", sizes.transient, background=True, background_bytes=sizes.weights)
    backend.background_blocking(spec(path))
    graph = 2 * (cache / entry_key(path) / "graph.onnx").stat().st_size + SESSION_BYTES
    weights = (cache / entry_key(path) / "weights.bin").stat().st_size
    assert backend.load_plan_blocking(spec(path, "auto"), sizes) == \
        LoadPlan("mapped", graph, least=weights)
    packed = (256 * 512 + 512 * 64) * 4
    assert backend.load_plan_blocking(spec(path, "on"), sizes) == \
        LoadPlan("mapped", graph + packed, least=weights)
    assert backend.load_plan_blocking(spec(path, weights_cache=False), sizes) == default
    assert OnnxBackend(None).load_plan_blocking(spec(path), sizes) == default
