"""The image examples of docs/images.md (examples/curl/image.sh, examples/python/images.py,
examples/typescript/src/image.ts) against a real daemon serving an ONNX image classifier with
a [models.image] table and a labels file: each prints the three best classes of each image as
the reference preprocessing and onnxruntime in this process give them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from daemon import Daemon
from example_toolchains import TOOLCHAINS, ci
from image_models import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    decoded,
    encoded,
    picture,
    reference,
    write_image_classifier,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TSX = EXAMPLES / "typescript/node_modules/.bin/tsx"
ANIMALS = ("cat", "dog", "fish", "owl", "yak")
CONFIG = """\
[[models]]
name = "classifier"
path = "classifier.onnx"
labels = "animals.txt"
[models.image]
resize = 36
crop = 32
mean = [0.485, 0.456, 0.406]
std = [0.229, 0.224, 0.225]
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Path]]:
    folder = tmp_path_factory.mktemp("images-example")
    write_image_classifier(folder / "classifier.onnx")
    (folder / "animals.txt").write_text("\n".join(ANIMALS) + "\n")
    (folder / "photo.jpg").write_bytes(encoded(picture(640, 480, seed=11), "JPEG", quality=90))
    (folder / "scan.png").write_bytes(encoded(picture(45, 71, seed=12, mode="L"), "PNG"))
    (folder / "models.toml").write_text(CONFIG)
    daemon = Daemon(folder / "models.toml")
    try:
        daemon.start()
        yield daemon, folder
    finally:
        daemon.stop()


def best_three(folder: Path, names: Sequence[str]) -> list[list[tuple[int, str, float]]]:
    """(index, label, score) of each image's three best classes, in this process."""
    pixels = reference([decoded((folder / name).read_bytes()) for name in names], 36, (32, 32),
                       IMAGENET_MEAN, IMAGENET_STD)
    session = ort.InferenceSession(str(folder / "classifier.onnx"),
                                   providers=["CPUExecutionProvider"])
    logits = session.run(["logits"], {"pixel_values": pixels})[0]
    return [[(int(i), ANIMALS[i], float(row[i])) for i in np.argsort(-row, kind="stable")[:3]]
            for row in logits]


def assert_classes(printed: Sequence[str], want: list[tuple[int, str, float]]) -> None:
    """The same classes in the same order, each score as %f within float32 rounding."""
    assert [s.split(":", 1)[1] for s in printed] == [f"{i}:{label}" for i, label, _ in want]
    for text, (_, _, score) in zip(printed, want, strict=True):
        assert re.fullmatch(r"-?\d+\.\d{6}", text.split(":")[0]), text
        assert abs(float(text.split(":")[0]) - score) <= 2e-6, (text, score)


def require(folder: str) -> None:
    """Skip, or under CI fail, when this machine lacks what the example needs, as
    test_examples.py does."""
    lacking = TOOLCHAINS[folder].missing()
    if not lacking:
        return
    reason = (f"the {folder} example needs {', '.join(lacking)}, missing here; "
              f"get it: {TOOLCHAINS[folder].get}")
    if ci():
        pytest.fail(f"{reason} (CI=true: every example must run)")
    pytest.skip(reason)


def run(command: Sequence[str], cwd: Path, daemon: Daemon) -> list[str]:
    env = {**os.environ, "SNOOZE_URL": daemon.url}
    env.pop("SNOOZE_API_KEY", None)
    done = subprocess.run(list(command), cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_curl_sends_a_jpeg_as_raw_bytes_and_as_base64(served: tuple[Daemon, Path]) -> None:
    require("curl")
    daemon, folder = served
    lines = run([str(EXAMPLES / "curl/image.sh"), str(folder / "photo.jpg")], folder, daemon)
    (want,) = best_three(folder, ["photo.jpg"])
    assert len(lines) == 2
    for line in lines:
        (output,) = json.loads(line)["outputs"]
        assert output["shape"] == [1, 3]
        assert_classes(output["data"], want)


def test_tritonclient_sends_each_image_file_as_it_is(served: tuple[Daemon, Path]) -> None:
    daemon, folder = served
    names = ["photo.jpg", "scan.png"]
    lines = run([sys.executable, str(EXAMPLES / "python/images.py"),
                 *(str(folder / n) for n in names)], folder, daemon)
    for line, name, want in zip(lines, names, best_three(folder, names), strict=True):
        match = re.fullmatch(rf"{re.escape(name)}: (.*) \(best index (\d+)\)", line)
        assert match, line
        assert_classes(match.group(1).split(" "), want)
        assert int(match.group(2)) == want[0][0]


def test_typescript_fetch_sends_the_binary_extension(served: tuple[Daemon, Path]) -> None:
    require("typescript")
    if not TSX.exists():
        pytest.fail(f"{TSX} is missing: run `make examples-deps` first")
    daemon, folder = served
    names = ["photo.jpg", "scan.png"]
    lines = run([str(TSX), "src/image.ts", *(str(folder / n) for n in names)],
                EXAMPLES / "typescript", daemon)
    for line, name, want in zip(lines, names, best_three(folder, names), strict=True):
        assert line.startswith(f"{name}: ")
        assert_classes(line.removeprefix(f"{name}: ").split(" "), want)
