"""Which scanned models take encoded images, and the `[models.image]` table of an ONNX image
model, read from the Hugging Face preprocessor_config.json beside it (or in the folder above:
the Hub's `onnx/model.onnx`). A Hugging Face image classifier's folder needs no table: the
daemon reads its preprocessor_config.json through transformers itself.

The image processors' forms read here: `size` as {"height", "width"} (an exact resize),
{"shortest_edge"} (the shortest side, with a centre crop of `crop_size` when do_center_crop is
on, or ConvNeXt's `crop_pct`), or a bare side; `resample` as Pillow's filter number; rescaling
and normalising as the processor's flags say. Hugging Face centres its crop with floor
division where torchvision rounds: an odd margin may sit one pixel apart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from snoozeml.config.image import ImageConfig
from snoozeml.datatypes import TensorSpec
from snoozeml.runtime.text.settings import read_json

PREPROCESSOR_CONFIG = "preprocessor_config.json"
_FILTERS = {0: "nearest", 2: "bilinear", 3: "bicubic"}  # PIL.Image.Resampling's numbers
_FLOATS = ("FP32", "FP16", "FP64")


def image_table(processor: Mapping[str, Any]) -> dict[str, Any]:
    """The `[models.image]` keys that do what an image processor's config says. ValueError,
    saying why, for a config whose steps have no such key."""
    table: dict[str, Any] = {}
    crop_size = processor.get("crop_size")
    cropping = bool(processor.get("do_center_crop", False)) and crop_size is not None
    size = processor.get("size")
    if processor.get("do_resize", True) and size is not None:
        table.update(_resize(size, cropping, processor.get("crop_pct")))
    if cropping:
        table["crop"] = _side(crop_size, "crop_size")
    resample = processor.get("resample", 2)
    if resample not in _FILTERS:
        raise ValueError(f"resample = {resample} is a filter SnoozeML does not run (it runs "
                         "nearest 0, bilinear 2, bicubic 3)")
    table["interpolation"] = _FILTERS[resample]
    table["scale"] = float(processor.get("rescale_factor", 1 / 255)) \
        if processor.get("do_rescale", True) else 1.0
    if processor.get("do_normalize", True):
        for key, name in (("mean", "image_mean"), ("std", "image_std")):
            values = processor.get(name)
            if not isinstance(values, list) or len(values) != 3:
                raise ValueError(f"{name} is {values!r}, not one value per RGB channel")
            table[key] = [float(v) for v in values]
    return table


def _resize(size: object, cropping: bool, crop_pct: object) -> dict[str, Any]:
    if isinstance(size, int):
        return {"resize": size if cropping else [size, size]}
    if isinstance(size, dict) and "height" in size and "width" in size:
        return {"resize": [int(size["height"]), int(size["width"])]}
    if isinstance(size, dict) and "shortest_edge" in size:
        edge = int(size["shortest_edge"])
        if isinstance(crop_pct, float) and not cropping:  # ConvNeXt's processor
            if edge >= 384:
                return {"resize": [edge, edge]}
            return {"resize": int(edge / crop_pct), "crop": edge}
        return {"resize": edge}
    raise ValueError(f"size = {size!r} is not a form SnoozeML reads")


def _side(value: object, name: str) -> int | list[int]:
    if isinstance(value, int):
        return value
    if isinstance(value, dict) and "height" in value and "width" in value:
        return [int(value["height"]), int(value["width"])]
    raise ValueError(f"{name} = {value!r} is not a form SnoozeML reads")


def onnx_image(file: Path, inputs: Sequence[TensorSpec], notes: list[str]) -> dict[str, Any]:
    """{"image": table} for an ONNX file with a preprocessor_config.json beside or above it
    and one 4-D float input that the table fits; {} otherwise, with a note saying why when
    there is a preprocessor config."""
    found = next((folder / PREPROCESSOR_CONFIG for folder in (file.parent, file.parent.parent)
                  if (folder / PREPROCESSOR_CONFIG).is_file()), None)
    if found is None:
        return {}
    where = "beside it" if found.parent == file.parent else "in the folder above"
    if len(inputs) != 1 or len(inputs[0].shape) != 4 or inputs[0].datatype not in _FLOATS:
        notes.append(f"no [models.image] although {PREPROCESSOR_CONFIG} is {where}: images feed "
                     "one float input [N, 3, H, W] or [N, H, W, 3]")
        return {}
    try:
        table = image_table(_json_object(found))
        from snoozeml.runtime.image.preprocess import plan_preprocess  # Pillow, only here

        plan_preprocess(ImageConfig(**table), inputs[0])
    except (ValueError, RuntimeError) as exc:
        notes.append(f"no [models.image] although {PREPROCESSOR_CONFIG} is {where}: {exc}")
        return {}
    notes.append(f"[models.image] from the {PREPROCESSOR_CONFIG} {where}: the model takes "
                 "encoded images as its 'image' input")
    return {"image": table}


def hf_image_notes(folder: Path, task: str | None) -> list[str]:
    """What the entry of a Hugging Face image classifier says about its images."""
    if task != "image-classification":
        return []
    if (folder / PREPROCESSOR_CONFIG).is_file():
        return [f"images: {PREPROCESSOR_CONFIG} is present, so the model takes encoded images "
                "as its 'image' input, prepared as transformers' AutoImageProcessor does"]
    return [f"no {PREPROCESSOR_CONFIG}: the model takes pixel_values only (or add a "
            "[models.image] table)"]


def _json_object(path: Path) -> Mapping[str, Any]:
    value = read_json(path)
    if not isinstance(value, dict):
        raise ValueError(f"{path.name} is not a JSON object")
    return value
