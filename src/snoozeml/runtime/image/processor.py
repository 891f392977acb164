"""A Hugging Face image classifier's own preprocessing: its folder's preprocessor_config.json
through transformers' AutoImageProcessor, so that an answer is what the processor and the
model give in process."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from snoozeml.config.image import ImageConfig
from snoozeml.logs import log_event
from snoozeml.runtime.base import Instance
from snoozeml.runtime.image.instance import ImageInstance, Pictures, with_images_blocking

PREPROCESSOR_CONFIG = "preprocessor_config.json"
PIXEL_VALUES = "pixel_values"


def processor_pictures(folder: Path) -> Pictures:
    """The folder's image processor as a function of RGB pictures (float32 pixel_values)."""
    from transformers import AutoImageProcessor

    processor: Any = AutoImageProcessor.from_pretrained(str(folder))

    def pictures(images: Sequence[Image.Image]) -> np.ndarray:
        values = processor(images=list(images), return_tensors="np")[PIXEL_VALUES]
        return np.ascontiguousarray(values, dtype=np.float32)

    return pictures


def with_folder_images_blocking(inner: Instance, folder: Path,
                                config: ImageConfig | None) -> Instance:
    """A Hugging Face image classifier taking images: through its preprocessor_config.json
    when the folder has one, else as its entry's `[models.image]` says; without either it
    takes pixel_values only. The instance is closed when the processor cannot be built."""
    if not (folder / PREPROCESSOR_CONFIG).is_file():
        return inner if config is None else with_images_blocking(inner, config)
    try:
        pictures = processor_pictures(folder)
    except Exception as exc:
        inner.close()
        raise RuntimeError(f"{folder / PREPROCESSOR_CONFIG}: transformers' AutoImageProcessor "
                           f"cannot read it: {exc}") from exc
    log_event("image_model", model=inner.metadata.name, input=PIXEL_VALUES,
              preprocessing=PREPROCESSOR_CONFIG)
    limit = config.max_image_pixels if config is not None else ImageConfig().max_image_pixels
    return ImageInstance(inner, PIXEL_VALUES, pictures, limit)
