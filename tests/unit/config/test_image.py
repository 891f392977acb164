"""`[models.image]` (config/image.py): the preprocessing keys of a model that takes images, their
defaults, and the problems a wrong value is reported as."""

from __future__ import annotations

from pathlib import Path

from config_files import problems_of, write

from snoozeml.config.settings import load_config


def test_image_table_reads_every_key(tmp_path: Path, model_file: Path) -> None:
    path = write(tmp_path, """
        [[models]]
        name = "m"
        path = "models/tiny.onnx"
        [models.image]
        input = "pixel_values"
        resize = 256
        crop = [224, 200]
        interpolation = "bicubic"
        mean = [0.485, 0.456, 0.406]
        std = [0.229, 0.224, 0.225]
        layout = "NHWC"
        channels = "BGR"
        scale = 1.0
        max_image_pixels = 1000
    """)
    image = load_config(path, {}).models[0].image
    assert image is not None
    assert (image.input, image.resize, image.crop) == ("pixel_values", 256, [224, 200])
    assert (image.interpolation, image.layout, image.channels) == ("bicubic", "NHWC", "BGR")
    assert (image.mean, image.std) == ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    assert (image.scale, image.max_image_pixels) == (1.0, 1000)


def test_image_defaults_are_pillow_bilinear_unit_scale_and_forty_megapixels(
    tmp_path: Path, model_file: Path
) -> None:
    path = write(tmp_path, """
        [[models]]
        name = "m"
        path = "models/tiny.onnx"
        [models.image]
        crop = 224
    """)
    config = load_config(path, {})
    image = config.models[0].image
    assert image is not None
    assert (image.interpolation, image.scale) == ("bilinear", 1 / 255)
    assert (image.mean, image.std) == ([0, 0, 0], [1, 1, 1])
    assert (image.layout, image.channels) == (None, "RGB")
    assert image.max_image_pixels == 40_000_000
    assert load_config(write(tmp_path, """
        [[models]]
        name = "m"
        path = "models/tiny.onnx"
    """), {}).models[0].image is None


def test_wrong_image_keys_are_problems_naming_the_key(tmp_path: Path, model_file: Path) -> None:
    path = write(tmp_path, """
        [[models]]
        name = "m"
        path = "models/tiny.onnx"
        [models.image]
        crop = [1, 2, 3]
        std = [0.5, 0, 0.5]
        mean = [0.5]
        interpolation = "lanczos"
        resize = 0
        colour = "red"
    """)
    problems = "\n".join(problems_of(path))
    for key in ("image.crop", "image.std", "image.mean", "image.interpolation",
                "image.resize", "image.colour"):
        assert f"models[0].{key}" in problems, key
