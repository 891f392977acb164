"""The ONNX weights cache (runtime/onnx/cache.py) with real onnxruntime on generated models:
what a cached load answers, when an entry is used, rebuilt or refused, and what goes into it.
(The pre-packing upgrade: test_instance.py; the load plan: test_backend.py; the split:
test_split.py.)"""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx_loads import load, rows, run, spec, write_matmul
from onnx_models import write_mlp

from snoozeml.runtime.base import LoadPlan
from snoozeml.runtime.onnx import cache as onnx_cache
from snoozeml.runtime.onnx.backend import OnnxBackend
from snoozeml.runtime.onnx.cache import (
    MANIFEST,
    CacheError,
    build_blocking,
    entry_key,
    find_blocking,
    iter_entries,
)
from snoozeml.runtime.onnx.cache_entry import WEIGHTS
from snoozeml.runtime.onnx.instance import OnnxInstance


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
