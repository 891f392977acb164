"""An ONNX model's preprocessing from its entry (runtime/image/preprocess.py), held to the
reference written from torchvision's definitions (tests/support/image_models.py), and the
entries that do not fit their model, refused at load."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from image_models import IMAGENET_MEAN, IMAGENET_STD, picture, reference
from PIL import Image

from snoozeml.config.image import ImageConfig
from snoozeml.datatypes import TensorSpec
from snoozeml.runtime.image.preprocess import center_crop, plan_preprocess, resized_size

NCHW = TensorSpec("pixel_values", "FP32", (-1, 3, 24, 20))
NHWC = TensorSpec("pixel_values", "FP32", (-1, 24, 20, 3))
ANY = TensorSpec("pixel_values", "FP32", (-1, 3, -1, -1))
SIZES = [(37, 23), (23, 37), (20, 24), (64, 64), (301, 199), (15, 11)]


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic", "nearest"])
def test_resize_crop_normalise_equal_the_reference(interpolation: str) -> None:
    images = [picture(w, h, seed=i) for i, (w, h) in enumerate(SIZES)]
    config = ImageConfig(resize=26, crop=[24, 20], mean=list(IMAGENET_MEAN),
                         std=list(IMAGENET_STD), interpolation=interpolation)  # type: ignore[arg-type]
    got = plan_preprocess(config, NCHW)(images)
    want = reference(images, 26, (24, 20), IMAGENET_MEAN, IMAGENET_STD, interpolation)
    assert got.shape == (len(SIZES), 3, 24, 20)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("spec", "options", "expected"), [
    (NHWC, {}, {"layout": "NHWC"}),
    (NCHW, {"channels": "BGR"}, {"bgr": True}),
    (NHWC, {"channels": "BGR"}, {"layout": "NHWC", "bgr": True}),
    (ANY, {"crop": 16}, {"crop": (16, 16)}),
])
def test_layouts_channel_orders_and_crops(spec: TensorSpec, options: dict[str, Any],
                                          expected: dict[str, Any]) -> None:
    images = [picture(w, h, seed=i) for i, (w, h) in enumerate(SIZES)]
    config = ImageConfig(resize=30, mean=list(IMAGENET_MEAN), std=list(IMAGENET_STD), **options)
    got = plan_preprocess(config, spec)(images)
    want = reference(images, 30, expected.get("crop", (24, 20)), IMAGENET_MEAN, IMAGENET_STD,
                     layout=expected.get("layout", "NCHW"), bgr=expected.get("bgr", False))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_an_exact_resize_and_the_model_size_need_no_crop() -> None:
    images = [picture(w, h, seed=i) for i, (w, h) in enumerate(SIZES)]
    got = plan_preprocess(ImageConfig(resize=[24, 20]), ANY)(images)
    want = np.stack([np.asarray(im.resize((20, 24), Image.Resampling.BILINEAR), np.float32)
                     .transpose(2, 0, 1) / 255 for im in images])
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_unit_scale_into_a_uint8_model_keeps_the_pixels() -> None:
    spec = TensorSpec("x", "UINT8", (-1, 8, 8, 3))
    image = picture(8, 8, seed=1)
    got = plan_preprocess(ImageConfig(scale=1), spec)([image])
    assert got.dtype == np.uint8
    assert np.array_equal(got[0], np.asarray(image))


def test_torchvision_sizes_and_offsets() -> None:
    assert resized_size((640, 480), 256) == (341, 256)  # 256 * 640 / 480 = 341.33
    assert resized_size((480, 641), 256) == (256, 341)
    assert resized_size((50, 50), (10, 20)) == (20, 10)
    small = picture(10, 6, seed=1)
    padded = np.asarray(center_crop(small, (8, 14)))
    assert padded.shape == (8, 14, 3)
    assert np.array_equal(padded[1:7, 2:12], np.asarray(small))  # (14-10)//2, (8-6)//2
    assert not padded[0].any()
    assert not padded[:, :2].any()


@pytest.mark.parametrize(("config", "spec", "said"), [
    (ImageConfig(), ANY, "set crop"),
    (ImageConfig(crop=32), NCHW, "takes 24x20 images"),
    (ImageConfig(crop=8), TensorSpec("x", "FP32", (-1, 3, -1, 3)), "cannot tell the layout"),
    (ImageConfig(crop=8), TensorSpec("x", "BYTES", (-1,)), "images become one of"),
    (ImageConfig(crop=8), TensorSpec("x", "FP32", (-1, 8, 8)), "is not"),
    (ImageConfig(crop=8, layout="NCHW"), TensorSpec("x", "FP32", (-1, 1, 8, 8)), "1 channels"),
])
def test_entries_that_do_not_fit_the_model_fail_its_load(config: ImageConfig, spec: TensorSpec,
                                                         said: str) -> None:
    with pytest.raises(RuntimeError, match=said):
        plan_preprocess(config, spec)
