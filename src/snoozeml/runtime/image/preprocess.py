"""An ONNX model's preprocessing, as its entry's `[models.image]` describes it: the steps
torchvision's usual transforms take on a PIL image, in numpy.

    Resize(resize)            shortest side to `resize`, keeping the aspect ratio (the long
                              side truncated, as torchvision computes it), with Pillow's
                              filter; [height, width] resizes to exactly that
    CenterCrop(crop)          offsets rounded as torchvision's; padded with zeros when smaller
    ToTensor, Normalize       x * scale, then (x - mean) / std per channel
    channels, layout          RGB or BGR; NCHW or NHWC

`plan_preprocess` checks the entry against the model's input at load, so every answer has the
shape the model takes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from PIL import Image

from snoozeml.config.image import ImageConfig
from snoozeml.datatypes import OIP_TO_NUMPY, TensorSpec

_FILTERS = {
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "nearest": Image.Resampling.NEAREST,
}
_NUMBERS = ("FP32", "FP16", "FP64", "UINT8")


@dataclass(frozen=True, slots=True)
class Preprocess:
    """Pictures to the model's input tensor: [N, 3, H, W] (NCHW) or [N, H, W, 3]."""

    resize: int | tuple[int, int] | None  # a side, or (height, width)
    crop: tuple[int, int]  # (height, width) of the answer
    resample: Image.Resampling
    multiply: np.ndarray  # scale / std, per channel (float64)
    add: np.ndarray  # -mean / std, per channel
    channels_first: bool
    bgr: bool
    dtype: np.dtype[np.generic]

    def __call__(self, images: Sequence[Image.Image]) -> np.ndarray:
        height, width = self.crop
        shape = (3, height, width) if self.channels_first else (height, width, 3)
        batch = np.empty((len(images), *shape), dtype=np.float32)
        # mean and std are in RGB order; BGR reverses the channels with them.
        order = slice(None, None, -1) if self.bgr else slice(None)
        multiply = self.multiply[order].astype(np.float32)
        add = self.add[order].astype(np.float32)
        if self.channels_first:  # each channel's plane, with its own scalars
            multiply, add = multiply[:, None, None], add[:, None, None]
        for i, image in enumerate(images):
            pixels = np.asarray(center_crop(self.resized(image), self.crop))[..., order]
            if self.channels_first:
                pixels = pixels.transpose(2, 0, 1)
            np.multiply(pixels, multiply, out=batch[i])
            batch[i] += add
        return batch if self.dtype == batch.dtype else batch.astype(self.dtype)

    def resized(self, image: Image.Image) -> Image.Image:
        if self.resize is None:
            return image
        size = resized_size(image.size, self.resize)
        return image if size == image.size else image.resize(size, self.resample)


def resized_size(size: tuple[int, int], resize: int | tuple[int, int]) -> tuple[int, int]:
    """(width, height) after torchvision's Resize: the shortest side to `resize`, the other
    truncated to keep the aspect ratio; a (height, width) pair as it is."""
    if isinstance(resize, tuple):
        return resize[1], resize[0]
    width, height = size
    short, long = (width, height) if width <= height else (height, width)
    new_long = int(resize * long / short)
    return (resize, new_long) if width <= height else (new_long, resize)


def center_crop(image: Image.Image, crop: tuple[int, int]) -> Image.Image:
    """torchvision's CenterCrop on a PIL image: zero padding first when the image is smaller."""
    height, width = crop
    w, h = image.size
    if w < width or h < height:
        padded = Image.new(image.mode, (max(w, width), max(h, height)))
        padded.paste(image, ((width - w) // 2 if width > w else 0,
                             (height - h) // 2 if height > h else 0))
        image = padded
        w, h = image.size
        if (w, h) == (width, height):
            return image
    top = round((h - height) / 2.0)
    left = round((w - width) / 2.0)
    if (left, top, w, h) == (0, 0, width, height):
        return image
    return image.crop((left, top, left + width, top + height))


def plan_preprocess(config: ImageConfig, spec: TensorSpec) -> Preprocess:
    """The preprocessing the entry describes, for the model input `spec`. RuntimeError,
    saying why, when the two do not fit (the load fails)."""
    if spec.datatype not in _NUMBERS:
        raise RuntimeError(f"[models.image] feeds {spec.name!r}, which takes {spec.datatype}; "
                           f"images become one of {list(_NUMBERS)}")
    if len(spec.shape) != 4:
        raise RuntimeError(f"[models.image] feeds {spec.name!r}, whose shape "
                           f"{list(spec.shape)} is not [N, 3, H, W] or [N, H, W, 3]")
    layout = config.layout or _layout_of(spec)
    dims = spec.shape[2:] if layout == "NCHW" else spec.shape[1:3]
    channels = spec.shape[1] if layout == "NCHW" else spec.shape[3]
    if channels not in (3, -1):
        raise RuntimeError(f"{spec.name!r} takes {channels} channels ({layout}); images give 3")
    crop = _crop(config, spec.name, (dims[0], dims[1]))
    resize = tuple(config.resize) if isinstance(config.resize, list) else config.resize
    mean = np.asarray(config.mean, dtype=np.float64)
    std = np.asarray(config.std, dtype=np.float64)
    return Preprocess(
        resize=resize,  # type: ignore[arg-type]  # a pair from a list of two, checked
        crop=crop, resample=_FILTERS[config.interpolation],
        multiply=config.scale / std, add=-mean / std,
        channels_first=layout == "NCHW", bgr=config.channels == "BGR",
        dtype=OIP_TO_NUMPY[spec.datatype])


def _layout_of(spec: TensorSpec) -> str:
    if spec.shape[1] == 3 and spec.shape[3] != 3:
        return "NCHW"
    if spec.shape[3] == 3 and spec.shape[1] != 3:
        return "NHWC"
    raise RuntimeError(f"cannot tell the layout of {spec.name!r} from its shape "
                       f"{list(spec.shape)}: set layout = \"NCHW\" or \"NHWC\" in [models.image]")


def _crop(config: ImageConfig, name: str, model: tuple[int, int]) -> tuple[int, int]:
    """The answer's (height, width): the entry's crop, else an exact resize, else the model's
    own fixed size; they must agree with the model's fixed dimensions."""
    if config.crop is not None:
        crop = (config.crop, config.crop) if isinstance(config.crop, int) \
            else (config.crop[0], config.crop[1])
    elif isinstance(config.resize, list):
        crop = (config.resize[0], config.resize[1])
    elif model[0] > 0 and model[1] > 0:
        crop = model
    else:
        raise RuntimeError(f"{name!r} takes images of any size: set crop (or resize = "
                           "[height, width]) in [models.image], so that a batch's images agree")
    if any(want > 0 and want != got for want, got in zip(model, crop, strict=True)):
        raise RuntimeError(f"{name!r} takes {model[0]}x{model[1]} images (height x width); "
                           f"[models.image] gives {crop[0]}x{crop[1]}")
    return crop
