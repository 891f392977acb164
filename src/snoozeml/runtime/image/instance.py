"""A loaded model that also takes encoded images: an `image` input (BYTES, one encoded image a
row) next to the tensor it feeds, which requests may still send themselves.

The decoding and preprocessing is the blocking step that `validate_inputs` hands back: the
engine runs it on its preparation pool, off the event loop and beside the model's own runs,
and queues the request with the tensor in the place of its images. A request whose images
cannot be decoded fails there alone, before it joins a batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
from PIL import Image

from snoozeml.config.image import ImageConfig
from snoozeml.datatypes import ModelMetadata, TensorSpec
from snoozeml.errors import InvalidInput
from snoozeml.logs import log_event
from snoozeml.runtime.base import NO_PARAMETERS, Arrays, InputParameters, Instance, Prepare
from snoozeml.runtime.image.decode import IMAGE, check_elements, decode_images
from snoozeml.runtime.image.preprocess import plan_preprocess

Pictures = Callable[[Sequence[Image.Image]], np.ndarray]  # RGB pictures -> the model's tensor


class ImageInstance:
    """`inner`, whose input `feed` may come from encoded images through `pictures`."""

    def __init__(self, inner: Instance, feed: str, pictures: Pictures, max_pixels: int) -> None:
        self._inner = inner
        self._feed = feed
        self._pictures = pictures
        self._max_pixels = max_pixels
        graph = inner.metadata
        self._metadata = ModelMetadata(
            name=graph.name, platform=graph.platform,
            inputs=(*(replace(s, optional=True) for s in graph.inputs),
                    TensorSpec(IMAGE, "BYTES", (-1,), True)),
            outputs=graph.outputs,
            input_sets=((IMAGE,), tuple(s.name for s in graph.inputs)),
        )

    @property
    def metadata(self) -> ModelMetadata:
        return self._metadata

    def validate_inputs(self, inputs: Arrays,
                        parameters: InputParameters = NO_PARAMETERS) -> Prepare | None:
        """Images: one a row, none empty, and not with the tensor they feed; their decoding
        is the step handed back. A tensor: the model's own checks."""
        if IMAGE not in inputs:
            return self._inner.validate_inputs(inputs, parameters)
        if self._feed in inputs:
            raise InvalidInput(f"send {IMAGE!r} or {self._feed!r}, not both")
        check_elements(inputs[IMAGE])

        def prepare_blocking() -> None:
            images = decode_images(inputs.pop(IMAGE), self._max_pixels)
            inputs[self._feed] = self._pictures(images)
            self._inner.validate_inputs(inputs, parameters)

        return prepare_blocking

    def run_blocking(self, inputs: Arrays, outputs: Sequence[str] | None) -> Arrays:
        return self._inner.run_blocking(inputs, outputs)

    def run_batch_blocking(
        self, requests: Sequence[Arrays], outputs: Sequence[str] | None
    ) -> list[Arrays]:
        return self._inner.run_batch_blocking(requests, outputs)

    def upgrade_bytes(self, rows: int) -> int:
        return self._inner.upgrade_bytes(rows)

    def upgrade_blocking(self) -> bool:
        return self._inner.upgrade_blocking()

    def close(self) -> None:
        self._inner.close()


def with_images_blocking(inner: Instance, config: ImageConfig) -> ImageInstance:
    """An ONNX model that takes images as its entry's `[models.image]` describes them. The
    instance is closed, and RuntimeError raised, when the entry does not fit the model."""
    try:
        spec = _fed(inner.metadata, config.input)
        preprocess = plan_preprocess(config, spec)
    except BaseException:
        inner.close()
        raise
    log_event("image_model", model=inner.metadata.name, input=spec.name,
              resize=preprocess.resize, crop=list(preprocess.crop),
              layout="NCHW" if preprocess.channels_first else "NHWC",
              channels=config.channels, interpolation=config.interpolation)
    return ImageInstance(inner, spec.name, preprocess, config.max_image_pixels)


def _fed(metadata: ModelMetadata, name: str | None) -> TensorSpec:
    names = [s.name for s in metadata.inputs]
    if name is None:
        if len(metadata.inputs) != 1:
            raise RuntimeError(f"the model takes {names}: name the one images feed with "
                               "input = \"...\" in [models.image]")
        return metadata.inputs[0]
    spec = metadata.input(name)
    if spec is None:
        raise RuntimeError(f"[models.image] input = {name!r}, but the model takes {names}")
    others = [n for n in names if n != name]
    if others:
        raise RuntimeError(f"images feed {name!r} alone, but the model also takes {others}")
    return spec
