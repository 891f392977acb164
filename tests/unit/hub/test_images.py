"""Image models found by the scan (hub/images.py through hub/scan.py): the `[models.image]`
table read from the image processors' configs, and an ONNX export beside its
preprocessor_config.json written as an entry that, loaded, answers as the processor's steps
say."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hub_layouts import hf_folder
from image_models import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    decoded,
    encoded,
    picture,
    reference,
    write_echo_model,
)
from PIL import Image

from snoozeml.config.settings import load_config
from snoozeml.hub import render_toml, scan_directory
from snoozeml.hub.images import image_table
from snoozeml.runtime.onnx.backend import OnnxBackend

VIT = {"do_normalize": True, "do_rescale": True, "do_resize": True, "image_mean": [0.5] * 3,
       "image_std": [0.5] * 3, "resample": 2, "rescale_factor": 1 / 255,
       "size": {"height": 24, "width": 20}}
CONVNEXT = {"crop_pct": 0.875, "do_normalize": True, "do_rescale": True, "do_resize": True,
            "image_mean": list(IMAGENET_MEAN), "image_std": list(IMAGENET_STD), "resample": 3,
            "rescale_factor": 1 / 255, "size": {"shortest_edge": 224}}
RESNET_CROP = {"do_center_crop": True, "crop_size": {"height": 224, "width": 224},
               "do_resize": True, "size": {"shortest_edge": 256}, "resample": 2,
               "do_normalize": False}


@pytest.mark.parametrize(("processor", "table"), [
    (VIT, {"resize": [24, 20], "interpolation": "bilinear", "scale": 1 / 255,
           "mean": [0.5] * 3, "std": [0.5] * 3}),
    (CONVNEXT, {"resize": 256, "crop": 224, "interpolation": "bicubic", "scale": 1 / 255,
                "mean": list(IMAGENET_MEAN), "std": list(IMAGENET_STD)}),
    ({**CONVNEXT, "size": {"shortest_edge": 384}}, {
        "resize": [384, 384], "interpolation": "bicubic", "scale": 1 / 255,
        "mean": list(IMAGENET_MEAN), "std": list(IMAGENET_STD)}),
    (RESNET_CROP, {"resize": 256, "crop": [224, 224], "interpolation": "bilinear",
                   "scale": 1 / 255}),
    ({"size": 32, "do_rescale": False, "do_normalize": False},
     {"resize": [32, 32], "interpolation": "bilinear", "scale": 1.0}),
])
def test_image_processor_configs_become_image_tables(processor: dict[str, Any],
                                                     table: dict[str, Any]) -> None:
    assert image_table(processor) == table


def test_a_filter_snoozeml_does_not_run_is_said() -> None:
    with pytest.raises(ValueError, match="resample = 1"):
        image_table({**VIT, "resample": 1})


def test_an_onnx_export_beside_its_preprocessor_config_is_written_to_take_images(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "repo"
    (folder / "onnx").mkdir(parents=True)
    write_echo_model(folder / "onnx" / "model.onnx")
    (folder / "preprocessor_config.json").write_text(json.dumps(VIT))
    [model] = scan_directory(folder)
    assert model.image is not None
    assert "[models.image] from the preprocessor_config.json in the folder above" in "\n".join(
        model.notes)
    config = tmp_path / "models.toml"
    config.write_text(render_toml([model], relative_to=tmp_path))
    assert "[models.image]" in config.read_text()
    [spec] = load_config(config, environ={}).models
    instance = OnnxBackend().load_blocking(spec)
    try:
        data = [encoded(picture(37, 23, seed=1), "PNG"), encoded(picture(20, 41, seed=2), "PNG")]
        inputs = {"image": np.array(data, dtype=object)}
        prepare = instance.validate_inputs(inputs)
        assert prepare is not None
        prepare()
        got = instance.run_blocking(inputs, ["pixels"])["pixels"]
    finally:
        instance.close()
    # An exact resize to 24x20 and (x/255 - 0.5) / 0.5, as ViTImageProcessor does.
    resized = [decoded(d).resize((20, 24), Image.Resampling.BILINEAR) for d in data]
    want = reference(resized, None, (24, 20), [0.5] * 3, [0.5] * 3)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_graph_images_cannot_feed_gets_a_note_and_no_table(tmp_path: Path) -> None:
    write_echo_model(tmp_path / "model.onnx", 32, 32)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(VIT))  # 24x20: not 32x32
    [model] = scan_directory(tmp_path)
    assert model.image is None
    assert "no [models.image] although preprocessor_config.json is beside it: 'pixel_values' " \
        "takes 32x32 images" in "\n".join(model.notes)


def test_a_hugging_face_image_classifier_is_said_to_take_images(tmp_path: Path) -> None:
    folder = hf_folder(tmp_path / "vit", ["ViTForImageClassification"], tokenizer=False)
    (folder / "preprocessor_config.json").write_text(json.dumps(VIT))
    [model] = scan_directory(folder)
    assert model.task == "image-classification"
    assert model.image is None  # the daemon reads the folder's processor itself
    assert "takes encoded images as its 'image' input" in "\n".join(model.notes)
