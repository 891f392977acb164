"""The runtime layer on its own, without an engine: what each backend says about memory (out of
memory, which device, sizes from files), real ONNX and torch instances answering batches, the
and the one walk over an ONNX model's external tensors. (That the runtime imports nothing above
it is test_architecture.py's.)
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_models import (
    reference_session,
    write_corrupt_model,
    write_mlp,
    write_run_failure_model,
)

from snoozeml.config.settings import ModelConfig, TensorConfig
from snoozeml.errors import InvalidInput
from snoozeml.runtime.base import FileSizes, Unsplittable
from snoozeml.runtime.files import EXTERNAL_SCAN_LIMIT, external_data_paths
from snoozeml.runtime.onnx.backend import OnnxBackend
from snoozeml.runtime.registry import backend_for
from snoozeml.runtime.unavailable import UnavailableBackend


@pytest.fixture
def torch_backend() -> Any:
    """A TorchBackend class (torch is a dev dependency; skipped where it is missing)."""
    pytest.importorskip("torch")
    from snoozeml.runtime.torch.backend import TorchBackend

    return TorchBackend


def onnx_spec(path: Path, device: str = "cpu") -> ModelConfig:
    return ModelConfig(name=path.stem, path=path, format="onnx", device=device)


# --- is_out_of_memory ----------------------------------------------------------------------


class OutOfMemoryError(RuntimeError):
    """Named like torch.cuda.OutOfMemoryError, which is matched by name."""


ALLOCATOR_FAILURES = [
    pytest.param(MemoryError(), True, id="MemoryError"),
    pytest.param(MemoryError("cannot allocate array"), True, id="MemoryError-with-text"),
    pytest.param(RuntimeError(
        "[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status code returned while "
        "running MatMul node. Status Message: bfc_arena.cc:376 Failed to allocate memory for "
        "requested buffer of size 4000000000000"
    ), True, id="onnxruntime-arena"),
    pytest.param(RuntimeError("std::bad_alloc"), True, id="bad_alloc"),
    pytest.param(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), True,
                 id="cuda-out-of-memory"),
    pytest.param(RuntimeError("CUDA failure 2: cudaErrorMemoryAllocation"), True,
                 id="cudaErrorMemoryAllocation"),
    pytest.param(ValueError("shapes (2,3) and (4,5) not aligned"), False, id="a-normal-error"),
    pytest.param(RuntimeError("Failed to load model with error: file not found"), False,
                 id="a-failure-that-is-not-memory"),
    pytest.param(KeyError("memory"), False, id="a-mention-of-memory-alone"),
]


@pytest.mark.parametrize(("error", "expected"), ALLOCATOR_FAILURES)
def test_onnx_is_out_of_memory(error: BaseException, expected: bool) -> None:
    assert OnnxBackend().is_out_of_memory(error) is expected


@pytest.mark.parametrize(("error", "expected"), [
    *ALLOCATOR_FAILURES,
    pytest.param(OutOfMemoryError("CUDA error"), True, id="a-class-named-OutOfMemoryError"),
])
def test_torch_is_out_of_memory(torch_backend: Any, error: BaseException,
                                expected: bool) -> None:
    assert torch_backend().is_out_of_memory(error) is expected


def test_torch_is_out_of_memory_knows_torchs_own_class_under_any_name(
    torch_backend: Any,
) -> None:
    import torch

    base = getattr(torch, "OutOfMemoryError", None)
    if base is None:
        pytest.skip("this torch has no top-level OutOfMemoryError")

    class DeviceFull(base):
        pass

    assert torch_backend().is_out_of_memory(DeviceFull("no room"))


def test_an_unavailable_backend_never_runs_out_of_memory() -> None:
    assert not UnavailableBackend("missing extra").is_out_of_memory(MemoryError())


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


# --- which device a model counts against -----------------------------------------------------

def _spec(device: str, fmt: Literal["onnx", "torch"] = "torch") -> ModelConfig:
    return ModelConfig(name="m", path=Path("m"), format=fmt, device=device)


@pytest.mark.parametrize(("spec", "gpus", "device"), [
    pytest.param(_spec("cpu"), ["cuda:0"], "cpu", id="cpu-stays-on-the-host"),
    pytest.param(_spec("mps"), ["cuda:0"], "cpu", id="mps-shares-the-host-memory"),
    pytest.param(_spec("auto"), [], "cpu", id="auto-without-gpus"),
    pytest.param(_spec("cuda"), [], "cpu", id="cuda-without-gpus-is-inert"),
    pytest.param(_spec("auto"), ["cuda:0", "cuda:1"], "cuda:0", id="auto-takes-the-first-gpu"),
    pytest.param(_spec("cuda"), ["cuda:0", "cuda:1"], "cuda:0", id="cuda-means-cuda-0"),
    pytest.param(_spec("cuda:1"), ["cuda:0", "cuda:1"], "cuda:1", id="a-named-gpu"),
    pytest.param(_spec("cuda:3"), ["cuda:0", "cuda:1"], "cpu", id="a-gpu-that-is-not-there"),
])
def test_torch_memory_device(torch_backend: Any, spec: ModelConfig, gpus: list[str],
                             device: str) -> None:
    assert torch_backend().memory_device(spec, gpus) == device


def test_an_onnx_model_counts_against_the_host_when_onnxruntime_has_no_cuda() -> None:
    spec = _spec("cuda:0", fmt="onnx")
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
    assert OnnxBackend().memory_device(_spec(device, fmt="onnx"), gpus) == "cpu"


def test_an_unavailable_model_counts_against_the_host() -> None:
    assert UnavailableBackend("no").memory_device(_spec("cuda:0"), ["cuda:0"]) == "cpu"


# --- sizes from files ---------------------------------------------------------------------------

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


def test_a_torch_folder_counts_its_weight_files_only(torch_backend: Any, tmp_path: Path) -> None:
    folder = tmp_path / "bert"
    (folder / "sub").mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"\0" * 1000)
    (folder / "sub" / "extra.bin").write_bytes(b"\0" * 300)
    (folder / "tokenizer.json").write_bytes(b"{}" * 5000)
    (folder / "README.md").write_text("a long model card " * 100)
    spec = ModelConfig(name="bert", path=folder, format="torch")
    assert torch_backend().file_sizes_blocking(spec) == FileSizes(weights=1300, transient=0)


def test_a_single_safetensors_file_counts_itself(torch_backend: Any, tmp_path: Path) -> None:
    path = tmp_path / "weights.safetensors"
    path.write_bytes(b"\0" * 4096)
    spec = ModelConfig(name="w", path=path, format="torch")
    assert torch_backend().file_sizes_blocking(spec) == FileSizes(weights=4096, transient=0)


def test_an_unavailable_model_is_sized_as_its_format_and_never_raises(tmp_path: Path) -> None:
    # A torch model without the torch extra is sized by its weight files, as with the extra.
    backend = UnavailableBackend("torch models need the extra")
    folder = tmp_path / "bert"
    (folder / "sub").mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"\0" * 1000)
    (folder / "sub" / "config.json").write_bytes(b"\0" * 24)
    single = tmp_path / "w.safetensors"
    single.write_bytes(b"\0" * 77)

    def sizes(path: Path) -> FileSizes:
        return backend.file_sizes_blocking(ModelConfig(name="m", path=path, format="torch"))

    assert sizes(folder) == FileSizes(1000, 0)  # config.json takes no model memory
    assert sizes(single) == FileSizes(77, 0)
    assert sizes(tmp_path / "missing") == FileSizes(0, 0)
    assert sizes(tmp_path / "missing" / "model.safetensors") == FileSizes(0, 0)


# --- the walk over an ONNX model's external tensors ------------------------------------------

def _model_with_tensors_everywhere() -> onnx.ModelProto:
    """x FP32 [2] -> If(cond): then x + then_w, else x * else_c, where then_w is an initializer
    of the then-branch and else_c the value of a Constant node in the else-branch; plus a
    Constant in the main graph (main_c) and an initializer of the main graph (main_w)."""
    def const(name: str, values: list[float]) -> onnx.TensorProto:
        return numpy_helper.from_array(np.array(values, np.float32), name)

    value = [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2])]
    then_branch = helper.make_graph(
        [helper.make_node("Add", ["x", "then_w"], ["out"])], "then", [], value,
        [const("then_w", [1.0, 2.0])],
    )
    else_branch = helper.make_graph(
        [helper.make_node("Constant", [], ["else_c_out"], value=const("else_c", [3.0, 4.0])),
         helper.make_node("Mul", ["x", "else_c_out"], ["out"])], "else", [], value,
    )
    graph = helper.make_graph(
        [
            helper.make_node("Constant", [], ["main_c_out"], value=const("main_c", [5.0, 6.0])),
            helper.make_node("Add", ["x", "main_c_out"], ["shifted"]),
            helper.make_node("Add", ["shifted", "main_w"], ["summed"]),
            helper.make_node("ReduceSum", ["summed"], ["total"], keepdims=0),
            helper.make_node("Greater", ["total", "zero"], ["cond"]),
            helper.make_node("If", ["cond"], ["y"], then_branch=then_branch,
                             else_branch=else_branch),
        ],
        "everywhere",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [const("main_w", [7.0, 8.0]), const("zero", [0.0])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_tensors_in_subgraphs_and_constant_attributes_are_found_external(
    tmp_path: Path,
) -> None:
    # One file per tensor, named after it: which files are found says which tensors were.
    path = tmp_path / "everywhere.onnx"
    onnx.save_model(_model_with_tensors_everywhere(), str(path), save_as_external_data=True,
                    all_tensors_to_one_file=False, size_threshold=0, convert_attribute=True)
    names = {"then_w", "else_c", "main_c", "main_w", "zero"}
    assert names <= {p.name for p in tmp_path.iterdir()}

    found = external_data_paths(onnx.load(str(path), load_external_data=False), tmp_path)

    assert found == {(tmp_path / name).resolve() for name in names}
    # onnxruntime reads them all back: the model is whole.
    [y] = reference_session(path).run(None, {"x": np.array([1.0, 1.0], np.float32)})
    np.testing.assert_array_equal(y, [2.0, 3.0])


def test_files_of_subgraph_and_constant_tensors_count_as_weights(tmp_path: Path) -> None:
    path = tmp_path / "everywhere.onnx"
    onnx.save_model(_model_with_tensors_everywhere(), str(path), save_as_external_data=True,
                    all_tensors_to_one_file=False, size_threshold=0, convert_attribute=True)
    graph_bytes = path.stat().st_size
    data_bytes = sum((tmp_path / name).stat().st_size
                     for name in ("then_w", "else_c", "main_c", "main_w", "zero"))

    sizes = OnnxBackend().file_sizes_blocking(onnx_spec(path))

    assert sizes == FileSizes(graph_bytes + data_bytes, graph_bytes)


def test_a_model_with_every_tensor_inside_has_no_external_files(tmp_path: Path) -> None:
    model = onnx.load(str(write_mlp(tmp_path / "mlp.onnx")))
    assert external_data_paths(model, tmp_path) == set()


# --- ONNX instances --------------------------------------------------------------------------

def test_an_onnx_batch_answers_each_request_its_own_rows(tmp_path: Path) -> None:
    path = write_mlp(tmp_path / "mlp.onnx", dims=(4, 16, 3))
    instance = OnnxBackend().load_blocking(onnx_spec(path))
    reference = reference_session(path)
    rng = np.random.default_rng(3)
    requests = [{"x": rng.standard_normal((rows, 4), dtype=np.float32)} for rows in (2, 0, 1, 5)]

    try:
        answers = instance.run_batch_blocking(requests, None)
    finally:
        instance.close()

    assert len(answers) == len(requests)
    for request, answer in zip(requests, answers, strict=True):
        [expected] = reference.run(None, request)
        assert answer.keys() == {"y"}
        assert answer["y"].shape == expected.shape
        np.testing.assert_allclose(answer["y"], expected, rtol=1e-5, atol=1e-6)


def test_an_onnx_batch_whose_output_ignores_the_rows_is_unsplittable(tmp_path: Path) -> None:
    # y = Reshape(x, [3, -1]): six rows in, three rows out.
    instance = OnnxBackend().load_blocking(onnx_spec(write_run_failure_model(tmp_path / "r.onnx")))
    requests = [{"x": np.ones((rows, 4), np.float32)} for rows in (2, 4)]

    with pytest.raises(Unsplittable, match="'y'"):
        instance.run_batch_blocking(requests, None)


@pytest.mark.parametrize("x", [
    pytest.param(np.ones((2, 4), np.float64), id="a-dtype-the-graph-does-not-take"),
    pytest.param(np.ones((2, 5), np.float32), id="a-width-the-graph-does-not-take"),
])
def test_an_input_onnxruntime_rejects_is_invalid_input(tmp_path: Path, x: np.ndarray) -> None:
    instance = OnnxBackend().load_blocking(onnx_spec(write_mlp(tmp_path / "mlp.onnx",
                                                              dims=(4, 8, 3))))

    with pytest.raises(InvalidInput, match="model 'mlp' rejected the input: ") as info:
        instance.run_blocking({"x": x}, None)

    assert type(info.value.__cause__).__name__ == "InvalidArgument"


def test_a_failure_inside_onnxruntime_is_not_the_inputs_fault(tmp_path: Path) -> None:
    # Reshape to three rows fails for two: onnxruntime's FAIL, a backend failure.
    instance = OnnxBackend().load_blocking(onnx_spec(write_run_failure_model(tmp_path / "r.onnx")))

    with pytest.raises(Exception) as info:  # noqa: PT011 - the class is onnxruntime's own
        instance.run_blocking({"x": np.ones((2, 4), np.float32)}, None)

    assert not isinstance(info.value, InvalidInput)
    assert not OnnxBackend().is_out_of_memory(info.value)


# --- torch instances, in process -------------------------------------------------------------

@pytest.fixture
def clean_imports(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Undo what loading a state dict does to the process: its folder on sys.path, its module
    imported under its own name."""
    monkeypatch.setattr(sys, "path", [*sys.path])
    yield
    sys.modules.pop("mymodel", None)


def test_a_state_dict_batch_answers_each_request_its_own_rows(
    torch_backend: Any, tmp_path: Path, clean_imports: None,
) -> None:
    import torch
    from torch_models import save_state_dict

    module = save_state_dict(tmp_path)
    spec = ModelConfig(
        name="plain", path=tmp_path / "weights.safetensors", format="torch", device="cpu",
        module="mymodel:build",
        inputs=[TensorConfig(name="x", datatype="FP32", shape=[-1, 8])],
        outputs=[TensorConfig(name="y", datatype="FP32", shape=[-1, 3])],
    )
    backend = torch_backend()
    backend.prepare_blocking(spec)
    instance = backend.load_blocking(spec)
    rng = np.random.default_rng(5)
    requests = [{"x": rng.standard_normal((rows, 8), dtype=np.float32)} for rows in (1, 3, 2)]
    for request in requests:
        instance.validate_inputs(request)

    try:
        answers = instance.run_batch_blocking(requests, None)
    finally:
        instance.close()

    for request, answer in zip(requests, answers, strict=True):
        with torch.inference_mode():
            expected = module(torch.from_numpy(request["x"])).numpy()
        np.testing.assert_allclose(answer["y"], expected, rtol=1e-5, atol=1e-6)


def test_a_hugging_face_batch_answers_each_request_as_it_would_alone(
    torch_backend: Any, tmp_path: Path,
) -> None:
    from torch_models import TINY_BERT, save_bert, token_rows

    save_bert(tmp_path / "bert", **TINY_BERT)
    spec = ModelConfig(name="bert", path=tmp_path / "bert", format="torch", device="cpu")
    instance = torch_backend().load_blocking(spec)
    requests = []
    # Token ids share their width (requests of other widths are never batched together).
    for seed, lengths in enumerate([[3, 5], [2], [7, 1, 4]]):
        ids, mask = token_rows(lengths, 7, seed)
        request = {"input_ids": ids, "attention_mask": mask}
        instance.validate_inputs(request)
        requests.append(request)

    try:
        batched = instance.run_batch_blocking(requests, None)
        alone = [instance.run_blocking(request, None) for request in requests]
    finally:
        instance.close()

    for request, together, by_itself in zip(requests, batched, alone, strict=True):
        rows, width = request["input_ids"].shape
        assert together["last_hidden_state"].shape == (rows, width, TINY_BERT["hidden_size"])
        assert together["embedding"].shape == (rows, TINY_BERT["hidden_size"])
        for name in ("last_hidden_state", "embedding"):
            np.testing.assert_allclose(together[name], by_itself[name], rtol=1e-4, atol=1e-5)


def test_hugging_face_validation_refuses_a_token_id_outside_the_vocabulary(
    torch_backend: Any, tmp_path: Path,
) -> None:
    from torch_models import TINY_BERT, save_bert

    save_bert(tmp_path / "bert", **TINY_BERT)
    spec = ModelConfig(name="bert", path=tmp_path / "bert", format="torch", device="cpu")
    instance = torch_backend().load_blocking(spec)
    ids = np.array([[1, TINY_BERT["vocab_size"]]], np.int64)
    try:
        with pytest.raises(InvalidInput, match="outside"):
            instance.validate_inputs({"input_ids": ids, "attention_mask": np.ones_like(ids)})
    finally:
        instance.close()


# --- choosing a backend -------------------------------------------------------------------------

def test_onnx_models_get_the_onnx_backend() -> None:
    assert isinstance(backend_for(_spec("cpu", fmt="onnx")), OnnxBackend)


def test_torch_models_get_the_torch_backend(torch_backend: Any) -> None:
    assert isinstance(backend_for(_spec("cpu")), torch_backend)


def test_torch_models_without_torch_fail_to_load_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    # As if torch were not installed: importing it fails, and runtime/torch/ is imported
    # afresh (monkeypatch puts every module back afterwards).
    monkeypatch.setitem(sys.modules, "torch", None)
    for name in [n for n in sys.modules if n.startswith("snoozeml.runtime.torch")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ImportError, match=r"pip install 'snoozeml\[torch\]'"):
        import snoozeml.runtime.torch.backend  # noqa: F401

    backend = backend_for(ModelConfig(name="m", path=tmp_path / "m", format="torch"))

    assert isinstance(backend, UnavailableBackend)
    assert backend.reason == (
        "serving safetensors models needs PyTorch: pip install 'snoozeml[torch]'"
    )
    with pytest.raises(RuntimeError, match=r"pip install 'snoozeml\[torch\]'"):
        backend.load_blocking(ModelConfig(name="m", path=tmp_path / "m", format="torch"))
    assert backend.file_sizes_blocking(
        ModelConfig(name="m", path=tmp_path / "m", format="torch")
    ) == FileSizes(0, 0)


def test_serving_onnx_alone_never_imports_torch(tmp_path: Path) -> None:
    # A fresh interpreter: this one has torch imported by the tests above.
    path = write_mlp(tmp_path / "mlp.onnx", dims=(4, 8, 3))
    script = (
        "import sys\n"
        "import numpy as np\n"
        "from snoozeml.config.settings import ModelConfig\n"
        "from snoozeml.runtime.registry import backend_for\n"
        f"spec = ModelConfig(name='mlp', path={str(path)!r}, format='onnx', device='cpu')\n"
        "backend = backend_for(spec)\n"
        "backend.file_sizes_blocking(spec)\n"
        "backend.prepare_blocking(spec)\n"
        "instance = backend.load_blocking(spec)\n"
        "instance.run_batch_blocking([{'x': np.ones((2, 4), np.float32)}] * 2, None)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr


def test_a_model_without_a_format_gets_a_backend_that_says_so() -> None:
    backend = backend_for(ModelConfig(name="m", path=Path("m.bin"), format=None))
    assert isinstance(backend, UnavailableBackend)
    assert backend.reason == "model format None is not supported"
