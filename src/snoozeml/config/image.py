"""`[models.NAME.image]`: how a model that takes encoded images prepares them (runtime/image/).

An ONNX model's entry describes the preprocessing its training used (resize, centre crop,
scale, mean and std, layout, channel order); a Hugging Face image classifier's folder has its
own preprocessor_config.json, and its table holds only the limit.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    StrictStr,
    field_validator,
)

Side = Annotated[StrictInt, Field(ge=1)]
Number = StrictFloat | StrictInt


class ImageConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # The tensor the images feed (None: the model's one input).
    input: StrictStr | None = None
    # The shortest side after resizing, keeping the aspect ratio; [height, width]: exactly that.
    resize: Side | list[Side] | None = None
    # The centre crop: a side, or [height, width] (None: the model's own height and width).
    crop: Side | list[Side] | None = None
    interpolation: Literal["bilinear", "bicubic", "nearest"] = "bilinear"
    scale: Number = 1 / 255
    mean: list[Number] = [0.0, 0.0, 0.0]
    std: list[Number] = [1.0, 1.0, 1.0]
    # None: read from the model's input shape ([N, 3, H, W] or [N, H, W, 3]).
    layout: Literal["NCHW", "NHWC"] | None = None
    channels: Literal["RGB", "BGR"] = "RGB"
    # An image larger than this (width x height, from its header) is a 400 before decoding.
    max_image_pixels: StrictInt = Field(default=40_000_000, ge=1)

    @field_validator("resize", "crop")
    @classmethod
    def _two_sides(cls, value: int | list[int] | None) -> int | list[int] | None:
        if isinstance(value, list) and len(value) != 2:
            raise ValueError("must be one side or [height, width]")
        return value

    @field_validator("mean", "std")
    @classmethod
    def _three_channels(cls, value: list[float]) -> list[float]:
        if len(value) != 3:
            raise ValueError("must have one value per channel (3)")
        return value

    @field_validator("std")
    @classmethod
    def _no_zero(cls, value: list[float]) -> list[float]:
        if any(v == 0 for v in value):
            raise ValueError("must not be 0")
        return value
