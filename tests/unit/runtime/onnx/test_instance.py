"""A real ONNX instance (runtime/onnx/instance.py): a batch answers each request its own rows,
an output that ignores the rows is unsplittable, what onnxruntime rejects is the input's
fault while a failure inside it is not; and the pre-packing upgrade: when it is wanted, what
it answers, its swap under concurrent runs, and the mapped weights it lets go."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from model_specs import onnx_spec
from onnx_loads import load, rows, run, spec, write_matmul
from onnx_models import reference_session, write_mlp, write_run_failure_model

from snoozeml.errors import InvalidInput
from snoozeml.runtime.base import Unsplittable
from snoozeml.runtime.onnx.backend import OnnxBackend
from snoozeml.runtime.onnx.cache import build_blocking
from snoozeml.runtime.onnx.cache_entry import WEIGHTS
from snoozeml.runtime.onnx.instance import OnnxInstance, wants_prepack


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
