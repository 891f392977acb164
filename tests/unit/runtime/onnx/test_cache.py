"""The ONNX weights cache and the load paths built on it (runtime/onnx/cache.py,
runtime/onnx/backend.py),
with real onnxruntime on generated models: what a cached load answers, when an entry is used,
rebuilt or refused, and the pre-packing upgrade's swap under concurrent runs."""

from __future__ import annotations

import json
import multiprocessing
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_models import reference_session, write_mlp

from snoozeml.config.settings import ModelConfig
from snoozeml.runtime.base import LoadPlan
from snoozeml.runtime.onnx import cache as onnx_cache
from snoozeml.runtime.onnx.backend import SESSION_BYTES, OnnxBackend
from snoozeml.runtime.onnx.cache import (
    MANIFEST,
    CacheError,
    build_blocking,
    entry_key,
    find_blocking,
    iter_entries,
)
from snoozeml.runtime.onnx.cache_entry import STORAGE, WEIGHTS
from snoozeml.runtime.onnx.instance import OnnxInstance, wants_prepack
from snoozeml.runtime.onnx.split import split_blocking


def spec(path: Path, prepack: str = "auto", **extra: object) -> ModelConfig:
    return ModelConfig.model_validate({"name": path.stem, "path": path, "format": "onnx",
                                       "device": "cpu", "prepack": prepack, **extra})


def write_matmul(path: Path, seed: int = 0, external: bool = False) -> Path:
    """x [N, 256] -> MatMul w [256, 512] -> Add b -> Relu -> MatMul v [512, 64] -> y: weights
    that pre-packing copies (w, v) beside one it does not (b)."""
    rng = np.random.default_rng(seed)
    tensors = [
        numpy_helper.from_array(rng.standard_normal((256, 512), dtype=np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal(512, dtype=np.float32), "b"),
        numpy_helper.from_array(rng.standard_normal((512, 64), dtype=np.float32), "v"),
    ]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"]),
         helper.make_node("Relu", ["a"], ["r"]), helper.make_node("MatMul", ["r", "v"], ["y"])],
        "matmul", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 64])], tensors)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    if external:
        onnx.save(model, str(path), save_as_external_data=True, location=path.name + ".data",
                  size_threshold=0)
    else:
        onnx.save(model, str(path))
    return path


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


def rows(count: int, width: int = 256, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((count, width), dtype=np.float32)


def run(instance: OnnxInstance, x: np.ndarray) -> np.ndarray:
    return instance.run_blocking({"x": x}, None)["y"]


@pytest.fixture
def closing() -> Iterator[list[OnnxInstance]]:
    made: list[OnnxInstance] = []
    yield made
    for instance in made:
        instance.close()


def load(backend: OnnxBackend, model: ModelConfig, closing: list[OnnxInstance]) -> OnnxInstance:
    """A load as the engine does one: its plan, the load, then the work it left for later."""
    plan = backend.load_plan_blocking(model, backend.file_sizes_blocking(model))
    instance = backend.load_blocking(model)
    closing.append(instance)
    if plan.background:
        backend.background_blocking(model)
    return instance


# --- answers ------------------------------------------------------------------------------


@pytest.mark.parametrize("prepack", ["on", "off"])
@pytest.mark.parametrize("external", [False, True])
def test_a_model_served_from_its_cache_answers_bit_for_bit_as_without_it(
    tmp_path: Path, cache: Path, closing: list[OnnxInstance], prepack: str, external: bool
) -> None:
    path = write_matmul(tmp_path / "m.onnx", external=external)
    x = rows(16)
    plain = load(OnnxBackend(None), spec(path, prepack), closing)
    first = load(OnnxBackend(cache), spec(path, prepack), closing)  # then writes the entry
    again = load(OnnxBackend(cache), spec(path, prepack), closing)  # maps it
    assert len(list(iter_entries(cache))) == 1
    expected = run(plain, x)
    assert np.array_equal(run(first, x), expected)
    assert np.array_equal(run(again, x), expected)


def test_prepack_off_answers_as_onnxruntime_does_unpacked(
    tmp_path: Path, cache: Path, closing: list[OnnxInstance]
) -> None:
    import onnxruntime as ort

    path = write_matmul(tmp_path / "m.onnx")
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.add_session_config_entry("session.disable_prepacking", "1")
    unpacked = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    x = rows(8)
    build_blocking(cache, path)
    off = load(OnnxBackend(cache), spec(path, "off"), closing)
    assert np.array_equal(run(off, x), unpacked.run(["y"], {"x": x})[0])
    assert off.upgrade_bytes(64) == 0


def test_auto_upgrades_to_the_prepacked_answers_once_a_batch_has_rows(
    tmp_path: Path, cache: Path, closing: list[OnnxInstance]
) -> None:
    path = write_matmul(tmp_path / "m.onnx")
    x = rows(16)
    packed = run(load(OnnxBackend(None), spec(path), closing), x)
    build_blocking(cache, path)
    auto = load(OnnxBackend(cache), spec(path, "auto"), closing)
    assert auto.upgrade_bytes(1) == 0  # one row: as fast unpacked
    # w and v are copied by pre-packing; b is not (and stays mapped).
    assert auto.upgrade_bytes(2) == (256 * 512 + 512 * 64) * 4
    assert auto.upgrade_blocking() is True
    assert auto.upgrade_bytes(16) == 0
    assert auto.upgrade_blocking() is False
    assert np.array_equal(run(auto, x), packed)


@pytest.mark.parametrize(("policy", "batch", "expected"), [
    ("on", 1, True), ("on", 64, True), ("off", 1, False), ("off", 64, False),
    ("auto", 1, False), ("auto", 2, True), ("auto", 64, True),
])
def test_wants_prepack(policy: str, batch: int, expected: bool) -> None:
    assert wants_prepack(policy, batch) is expected


def test_the_swap_loses_no_run_under_concurrent_traffic(
    tmp_path: Path, cache: Path, closing: list[OnnxInstance]
) -> None:
    path = write_mlp(tmp_path / "mlp.onnx", dims=(64, 512, 512, 64))
    build_blocking(cache, path)
    auto = load(OnnxBackend(cache), spec(path, "auto"), closing)
    reference = load(OnnxBackend(None), spec(path, "off"), closing)
    packed = load(OnnxBackend(None), spec(path, "on"), closing)
    x = rows(1, 64)  # one row: unpacked and packed sessions may round differently
    answers: list[np.ndarray] = []
    errors: list[BaseException] = []
    started, swapped, after_swap = threading.Event(), threading.Event(), threading.Event()

    def traffic() -> None:
        runs_after = 0
        try:
            while runs_after < 5:  # keeps running until five runs began after the swap
                was_swapped = swapped.is_set()
                answers.append(run(auto, x))
                started.set()
                runs_after += was_swapped
        except BaseException as exc:  # the test's own boundary: reported below
            errors.append(exc)
        finally:
            started.set()
            after_swap.set()

    thread = threading.Thread(target=traffic)
    thread.start()
    started.wait()
    try:
        assert auto.upgrade_blocking() is True
    finally:
        swapped.set()
        after_swap.wait()
        thread.join()
    assert not errors
    before, after = run(reference, x), run(packed, x)
    # Every answer is whole and is exactly one of the two sessions' answer.
    assert all(np.array_equal(a, before) or np.array_equal(a, after) for a in answers)
    assert np.array_equal(answers[-1], after)


def test_close_waits_for_an_upgrade_and_an_upgrade_after_close_does_nothing(
    tmp_path: Path, cache: Path
) -> None:
    path = write_matmul(tmp_path / "m.onnx")
    build_blocking(cache, path)
    auto = OnnxBackend(cache).load_blocking(spec(path, "auto"))
    closer = threading.Thread(target=auto.close)
    upgrader = threading.Thread(target=auto.upgrade_blocking)
    upgrader.start()
    closer.start()
    upgrader.join()
    closer.join()
    assert auto.upgrade_blocking() is False


# --- when an entry is used ----------------------------------------------------------------


def test_a_changed_model_file_invalidates_its_entry(tmp_path: Path, cache: Path,
                                                    closing: list[OnnxInstance]) -> None:
    path = write_matmul(tmp_path / "m.onnx", seed=0)
    x = rows(4)
    first = run(load(OnnxBackend(cache), spec(path, "on"), closing), x)
    old_key = entry_key(path)
    write_matmul(path, seed=1)  # same name, new weights
    assert entry_key(path) != old_key
    with pytest.raises(CacheError, match="no entry yet"):
        find_blocking(cache, path)
    second = run(load(OnnxBackend(cache), spec(path, "on"), closing), x)
    assert not np.array_equal(first, second)
    expected = run(load(OnnxBackend(None), spec(path, "on"), closing), x)
    assert np.array_equal(second, expected)
    # The old version's entry is gone: nothing would ever find it again.
    assert [entry.name for entry in iter_entries(cache)] == [entry_key(path)]


def test_changed_external_data_invalidates_the_entry(tmp_path: Path, cache: Path,
                                                     closing: list[OnnxInstance]) -> None:
    path = write_matmul(tmp_path / "m.onnx", external=True)
    load(OnnxBackend(cache), spec(path, "on"), closing)
    data = tmp_path / "m.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[:4] = b"\0\0\0\0"
    data.write_bytes(bytes(raw))
    with pytest.raises(CacheError, match=r"external data .* changed"):
        find_blocking(cache, path)


def test_an_entry_from_another_onnxruntime_version_is_ignored_and_rebuilt(
    tmp_path: Path, cache: Path, closing: list[OnnxInstance]
) -> None:
    path = write_matmul(tmp_path / "m.onnx")
    load(OnnxBackend(cache), spec(path, "on"), closing)
    manifest_path = cache / entry_key(path) / MANIFEST
    manifest = json.loads(manifest_path.read_text())
    manifest["onnxruntime"] = "0.0.1"
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(CacheError, match=r"written by onnxruntime 0\.0\.1"):
        find_blocking(cache, path)
    x = rows(4)
    rebuilt = load(OnnxBackend(cache), spec(path, "on"), closing)
    assert json.loads(manifest_path.read_text())["onnxruntime"] != "0.0.1"
    assert np.array_equal(run(rebuilt, x),
                          run(load(OnnxBackend(None), spec(path, "on"), closing), x))


@pytest.mark.parametrize("damage", ["flip", "truncate", "no-manifest", "bad-json"])
def test_a_corrupt_or_half_written_entry_is_detected_and_rebuilt(
    tmp_path: Path, cache: Path, closing: list[OnnxInstance], damage: str,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_matmul(tmp_path / "m.onnx")
    x = rows(4)
    load(OnnxBackend(cache), spec(path, "on"), closing)
    folder = cache / entry_key(path)
    weights = folder / WEIGHTS
    if damage == "flip":  # same size, same mtime: only the checksum can tell
        stat = weights.stat()
        raw = bytearray(weights.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        weights.write_bytes(bytes(raw))
        import os

        os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        # A new process has verified nothing yet (this one verified the entry it wrote).
        monkeypatch.setattr(onnx_cache, "_verified", set())
    elif damage == "truncate":
        with weights.open("r+b") as file:
            file.truncate(weights.stat().st_size // 2)
    elif damage == "no-manifest":  # a build that died before its last write
        (folder / MANIFEST).unlink()
    else:
        (folder / MANIFEST).write_text("{not json")
    with pytest.raises(CacheError):
        find_blocking(cache, path)
    served = load(OnnxBackend(cache), spec(path, "on"), closing)
    assert np.array_equal(run(served, x),
                          run(load(OnnxBackend(None), spec(path, "on"), closing), x))
    find_blocking(cache, path)  # rebuilt and valid


def test_an_entry_that_cannot_be_written_leaves_the_default_load_and_is_not_retried(
    tmp_path: Path, closing: list[OnnxInstance], caplog: pytest.LogCaptureFixture
) -> None:
    path = write_matmul(tmp_path / "m.onnx")
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder should be")
    backend = OnnxBackend(blocker)
    x = rows(4)
    served = load(backend, spec(path, "on"), closing)
    assert np.array_equal(run(served, x),
                          run(load(OnnxBackend(None), spec(path, "on"), closing), x))
    assert "onnx_cache_unusable" in caplog.text
    sizes = backend.file_sizes_blocking(spec(path))
    # The same file would fail the same way: its next loads do not try again.
    assert backend.load_plan_blocking(spec(path), sizes) == LoadPlan("default", sizes.transient)


def _build_in_child(cache: str, model: str, barrier: multiprocessing.synchronize.Barrier,
                    results: multiprocessing.queues.Queue[str]) -> None:
    from snoozeml.runtime.onnx.cache import build_blocking, find_blocking

    barrier.wait()
    entry = build_blocking(Path(cache), Path(model))
    find_blocking(Path(cache), Path(model))
    results.put(str(entry.folder))


def test_two_processes_building_the_same_entry_both_end_with_a_valid_one(
    tmp_path: Path, cache: Path, closing: list[OnnxInstance]
) -> None:
    path = write_mlp(tmp_path / "mlp.onnx", dims=(64, 512, 512, 64))
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(2)
    results = context.Queue()
    children = [context.Process(target=_build_in_child, args=(str(cache), str(path), barrier,
                                                              results)) for _ in range(2)]
    for child in children:
        child.start()
    for child in children:
        child.join(120)
    assert [child.exitcode for child in children] == [0, 0]
    folders = {results.get(timeout=5) for _ in children}
    assert folders == {str(cache / entry_key(path))}
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]  # no leftovers
    x = rows(8, 64)
    served = load(OnnxBackend(cache), spec(path, "on"), closing)
    assert np.array_equal(run(served, x),
                          run(load(OnnxBackend(None), spec(path, "on"), closing), x))


def test_small_tensors_and_graph_inputs_stay_in_the_graph(tmp_path: Path, cache: Path) -> None:
    path = write_mlp(tmp_path / "mlp.onnx", dims=(8, 512, 4))
    model = onnx.load(str(path))
    # An initializer also listed as a graph input may be overridden by a caller: it stays.
    model.graph.input.append(helper.make_tensor_value_info("w1", TensorProto.FLOAT, [512, 4]))
    onnx.save(model, str(path))
    entry = build_blocking(cache, path)
    assert {slot.name for slot in entry.slots} == {"w0", "b0"}  # b1 is 16 bytes
    # Gemm's B is copied by pre-packing; its bias is read at every run.
    assert {slot.name for slot in entry.slots if slot.packed} == {"w0"}
    assert all(slot.offset % onnx_cache.ALIGN == 0 for slot in entry.slots)


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


def write_mixed(path: Path) -> Path:
    """Initializers of several kinds: FP16, INT64 and BOOL weights (moved), one kept in
    float_data rather than raw bytes (stays), one a Loop body reads from the outer scope
    (moved: it is a main-graph initializer), and a string constant (stays)."""
    rng = np.random.default_rng(3)
    half = numpy_helper.from_array(rng.standard_normal((32, 32)).astype(np.float16), "half")
    index = numpy_helper.from_array(np.arange(512, dtype=np.int64) % 32, "index")
    mask = numpy_helper.from_array(rng.random(2048) > 0.5, "mask")
    typed = helper.make_tensor("typed", TensorProto.FLOAT, [16, 16],
                               rng.standard_normal(256).astype(np.float32).tolist())
    outer = numpy_helper.from_array(rng.standard_normal((32, 32)).astype(np.float32), "outer")
    words = numpy_helper.from_array(np.array(["a", "b"], dtype=object), "words")
    body = helper.make_graph(
        [helper.make_node("MatMul", ["s_in", "outer"], ["s_mm"]),
         helper.make_node("Tanh", ["s_mm"], ["s_out"]),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("s_in", TensorProto.FLOAT, ["N", 32])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("s_out", TensorProto.FLOAT, ["N", 32])])
    nodes = [
        helper.make_node("Cast", ["x"], ["x16"], to=TensorProto.FLOAT16),
        helper.make_node("MatMul", ["x16", "half"], ["h16"]),
        helper.make_node("Cast", ["h16"], ["h"], to=TensorProto.FLOAT),
        helper.make_node("Constant", [], ["trips"], value=numpy_helper.from_array(
            np.array(2, dtype=np.int64))),
        helper.make_node("Constant", [], ["go"], value=numpy_helper.from_array(
            np.array(True))),
        helper.make_node("Loop", ["trips", "go", "h"], ["looped"], body=body),
        helper.make_node("Gather", ["looped", "index"], ["picked"], axis=1),
        helper.make_node("ReduceSum", ["picked"], ["y"], keepdims=0,
                         axes=None),
        helper.make_node("Cast", ["mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("ReduceSum", ["mask_f"], ["count"], keepdims=0),
        helper.make_node("ReduceSum", ["typed"], ["typed_sum"], keepdims=0),
        helper.make_node("Size", ["words"], ["word_count"]),
    ]
    graph = helper.make_graph(
        nodes, "mixed", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, []),
         helper.make_tensor_value_info("count", TensorProto.FLOAT, []),
         helper.make_tensor_value_info("typed_sum", TensorProto.FLOAT, []),
         helper.make_tensor_value_info("word_count", TensorProto.INT64, [])],
        [half, index, mask, typed, outer, words])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_every_kind_of_initializer_survives_the_split(tmp_path: Path, cache: Path,
                                                      closing: list[OnnxInstance]) -> None:
    path = write_mixed(tmp_path / "mixed.onnx")
    split = tmp_path / "split"
    split.mkdir()
    itemsizes = {kind: np.dtype(name).itemsize for kind, name in STORAGE.items()}
    moved, _, _ = split_blocking(path, split / "graph.onnx", split / WEIGHTS, itemsizes,
                                 onnx_cache.ALIGN, onnx_cache.MIN_MAPPED)
    assert {m.name for m in moved} == {"half", "index", "mask", "outer"}
    assert all(m.offset % onnx_cache.ALIGN == 0 for m in moved)
    x = rows(3, 32)
    # The split graph is the same model: onnxruntime reads it (and weights.bin) as it is.
    split_answers = reference_session(split / "graph.onnx").run(None, {"x": x})
    original = reference_session(path).run(None, {"x": x})
    for got, expected in zip(split_answers, original, strict=True):
        assert np.array_equal(got, expected)
    # And the entry (the optimized graph, mapped) answers as the model loaded the default way.
    build_blocking(cache, path)
    cached = load(OnnxBackend(cache), spec(path, "on"), closing).run_blocking({"x": x}, None)
    plain = load(OnnxBackend(None), spec(path, "on"), closing).run_blocking({"x": x}, None)
    assert cached.keys() == plain.keys()
    for name in plain:
        assert np.array_equal(cached[name], plain[name]), name
    assert int(cached["word_count"]) == 2


def mapped_rss(folder: Path) -> int:
    """The resident bytes of this process's mappings of `folder`'s weights.bin (smaps)."""
    target = str(folder / WEIGHTS)
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if line.endswith(target):
            inside = True
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1]) * 1024
            inside = False
    return total


def test_after_the_upgrade_only_the_weights_it_did_not_pack_stay_resident(
    tmp_path: Path, cache: Path, closing: list[OnnxInstance]
) -> None:
    path = write_matmul(tmp_path / "m.onnx")
    entry = build_blocking(cache, path)
    auto = load(OnnxBackend(cache), spec(path, "auto"), closing)
    x = rows(8)
    run(auto, x)
    assert mapped_rss(entry.folder) >= entry.weights_bytes - 4096  # populated at load
    assert auto.upgrade_blocking()
    for _ in range(3):
        run(auto, x)
    # w and v went (their pre-packed copies serve); b, read at every run, is still there:
    # had a released weight still been read, its pages would be back.
    kept = sum(-(-slot.length // 4096) * 4096 for slot in entry.slots if not slot.packed)
    assert 0 < mapped_rss(entry.folder) <= kept
