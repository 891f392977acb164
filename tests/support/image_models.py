"""Models that take images, encoded images, and the reference preprocessing they are held to.

The ONNX "echo" model answers its pixel tensor as it is (`pixels`) next to four class scores
(`scores`: each channel's mean and their sum), so a served answer shows exactly what the
daemon fed the model. The reference below is written from torchvision's definitions with
Pillow and numpy (Resize(int) on a PIL image, CenterCrop, ToTensor, Normalize), independently of
the daemon's code.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
FILTERS = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC,
           "nearest": Image.Resampling.NEAREST}


def write_echo_model(path: Path, height: int | None = 24, width: int | None = 20,
                     layout: str = "NCHW") -> Path:
    """pixels = the input; scores [N, 4] = each channel's mean, and their sum. Height and
    width None: any size."""
    h: int | str = height or "h"
    w: int | str = width or "w"
    shape: list[int | str] = ["n", 3, h, w] if layout == "NCHW" else ["n", h, w, 3]
    axes = [2, 3] if layout == "NCHW" else [1, 2]
    nodes = [
        helper.make_node("Identity", ["pixel_values"], ["pixels"]),
        helper.make_node("ReduceMean", ["pixel_values", "axes"], ["means"], keepdims=0),
        helper.make_node("ReduceSum", ["means", "last"], ["total"], keepdims=1),
        helper.make_node("Concat", ["means", "total"], ["scores"], axis=1),
    ]
    graph = helper.make_graph(
        nodes, "echo",
        [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, shape),
         helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["n", 4])],
        [numpy_helper.from_array(np.array(axes, dtype=np.int64), "axes"),
         numpy_helper.from_array(np.array([1], dtype=np.int64), "last")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)],
                              producer_name="snoozeml-tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


# --- images ---------------------------------------------------------------------------------


def picture(width: int, height: int, seed: int, mode: str = "RGB") -> Image.Image:
    """A smooth random picture (gradients and blobs: JPEG keeps it close), in `mode`."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    channels = []
    for _ in range(4):
        fx, fy = rng.uniform(0.01, 0.08, 2).tolist()
        phase = rng.uniform(0, 6)
        channels.append(127.5 + 127.5 * np.sin(x * fx + y * fy + phase))
    rgba = np.stack(channels, axis=-1).clip(0, 255).astype(np.uint8)
    image = Image.fromarray(rgba, "RGBA")
    return image if mode == "RGBA" else image.convert(mode)


def encoded(image: Image.Image, fmt: str, **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def rotated_jpeg(image: Image.Image, orientation: int = 6) -> bytes:
    """A JPEG of `image` stored sideways with the EXIF orientation that turns it back up
    (6: the stored picture is turned 90 degrees clockwise to display)."""
    stored = image.transpose(Image.Transpose.ROTATE_90)  # counter-clockwise: 6 undoes it
    exif = Image.Exif()
    exif[0x0112] = orientation
    return encoded(stored, "JPEG", quality=95, exif=exif.tobytes())


def decoded(data: bytes) -> Image.Image:
    """What Pillow decodes from `data`, upright and RGB, by the book (the reference's own)."""
    from PIL import ImageOps

    image = Image.open(io.BytesIO(data))
    image.load()
    return (ImageOps.exif_transpose(image) or image).convert("RGB")


# --- the reference preprocessing ------------------------------------------------------------


def reference(images: Sequence[Image.Image], resize: int | None, crop: tuple[int, int],
              mean: Sequence[float] = (0, 0, 0), std: Sequence[float] = (1, 1, 1),
              interpolation: str = "bilinear", layout: str = "NCHW",
              bgr: bool = False) -> np.ndarray:
    """torchvision's Resize(resize) (on a PIL image), CenterCrop(crop), ToTensor, Normalize."""
    rows = []
    for image in images:
        if resize is not None:
            w, h = image.size
            size = (resize, int(resize * h / w)) if w <= h else (int(resize * w / h), resize)
            image = image.resize(size, FILTERS[interpolation])
        w, h = image.size
        top, left = round((h - crop[0]) / 2.0), round((w - crop[1]) / 2.0)
        image = image.crop((left, top, left + crop[1], top + crop[0]))
        x = np.asarray(image, dtype=np.float32) / np.float32(255)
        x = (x - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
        if bgr:
            x = x[..., ::-1]
        rows.append(x.transpose(2, 0, 1) if layout == "NCHW" else x)
    return np.stack(rows).astype(np.float32)


def write_image_classifier(path: Path, classes: int = 5, side: int = 32, seed: int = 0) -> Path:
    """logits [N, classes] = each channel's mean pooled through a random linear head, from
    pixel_values FP32 [N, 3, side, side]: a classifier whose answer moves with the picture."""
    rng = np.random.default_rng(seed)
    nodes = [
        helper.make_node("GlobalAveragePool", ["pixel_values"], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["flat"]),
        helper.make_node("Gemm", ["flat", "weight", "bias"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes, "classifier",
        [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT,
                                       ["n", 3, side, side])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", classes])],
        [numpy_helper.from_array(rng.normal(0, 3, (3, classes)).astype(np.float32), "weight"),
         numpy_helper.from_array(rng.normal(0, 1, classes).astype(np.float32), "bias")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)],
                              producer_name="snoozeml-tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path
