"""A plain safetensors state dict, loaded strictly into the torch.nn.Module a user's factory
(`module = "package.module:factory"`) returns, with its inputs and outputs declared in the
config. Batches stack rows along axis 0 (runtime/stacking.py).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from snoozeml.config.settings import ModelConfig
from snoozeml.datatypes import OIP_TO_NUMPY, ModelMetadata, TensorSpec
from snoozeml.heap import drop_attribute_blocking
from snoozeml.runtime.base import NO_PARAMETERS, Arrays, InputParameters
from snoozeml.runtime.stacking import run_stacked_blocking
from snoozeml.runtime.torch.env import DTYPES, PLATFORM, require, torch_device


class StateDictInstance:
    """A plain safetensors state dict loaded strictly into the module a factory returns."""

    def __init__(self, spec: ModelConfig) -> None:
        load_file = require("safetensors.torch").load_file
        if not spec.module:
            raise RuntimeError(
                "a plain .safetensors model needs `module = \"package.module:factory\"`"
            )
        if not spec.inputs or not spec.outputs:
            raise RuntimeError("a plain .safetensors model needs `inputs` and `outputs` declared")
        factory = import_factory(spec.module, spec.path.parent)
        module = factory()
        if not isinstance(module, torch.nn.Module):
            raise RuntimeError(f"{spec.module} returned {type(module).__name__}, not a "
                               "torch.nn.Module")
        self.device = torch_device(spec.device)
        state = load_file(str(spec.path))
        try:
            module.load_state_dict(state, strict=True)
        except RuntimeError as exc:
            raise RuntimeError(f"the weights do not match {spec.module}: {exc}") from exc
        del state
        self.model = module.to(device=self.device, dtype=DTYPES[spec.dtype]).eval()
        self.dtype = DTYPES[spec.dtype]
        for tensor in (*spec.inputs, *spec.outputs):
            if tensor.datatype not in OIP_TO_NUMPY:
                raise RuntimeError(f"tensor {tensor.name!r}: unknown datatype "
                                   f"{tensor.datatype!r}")
        self._metadata = ModelMetadata(
            spec.name, PLATFORM,
            tuple(TensorSpec(t.name, t.datatype, tuple(t.shape)) for t in spec.inputs),
            tuple(TensorSpec(t.name, t.datatype, tuple(t.shape)) for t in spec.outputs),
        )

    @property
    def metadata(self) -> ModelMetadata:
        return self._metadata

    def validate_inputs(self, inputs: Arrays,
                        parameters: InputParameters = NO_PARAMETERS) -> None:
        pass  # nothing beyond the declared metadata, which the engine checks requests against

    def run_blocking(self, inputs: Arrays, outputs: Sequence[str] | None) -> Arrays:
        args = []
        for spec in self._metadata.inputs:
            # Writable (binary inputs are read-only views of the body, which torch warns about).
            array = np.require(inputs[spec.name], requirements=["C", "W"])
            tensor = torch.from_numpy(array).to(self.device)
            if tensor.is_floating_point():
                tensor = tensor.to(self.dtype)
            args.append(tensor)
        with torch.inference_mode():
            result = self.model(*args)
        names = [s.name for s in self._metadata.outputs]
        if isinstance(result, dict):
            values = [result[n] for n in names]
        elif isinstance(result, list | tuple):
            values = list(result)
        else:
            values = [result]
        if len(values) != len(names):
            raise RuntimeError(f"the module returned {len(values)} outputs for {len(names)} "
                               "declared")
        produced: Arrays = {}
        for spec, value in zip(self._metadata.outputs, values, strict=True):
            produced[spec.name] = _as_declared(spec, value.detach().cpu())
        wanted = outputs or names
        return {n: produced[n] for n in wanted}

    def run_batch_blocking(
        self, requests: Sequence[Arrays], outputs: Sequence[str] | None
    ) -> list[Arrays]:
        """Rows stacked along axis 0 and run once; see runtime/stacking.py."""
        return run_stacked_blocking(self.run_blocking, requests, outputs)

    def upgrade_bytes(self, rows: int) -> int:
        return 0  # loaded in its final form: nothing left for later

    def upgrade_blocking(self) -> bool:
        return False

    def close(self) -> None:
        drop_attribute_blocking(self, "model")
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def _as_declared(spec: TensorSpec, tensor: Any) -> np.ndarray:
    """An output in the datatype and rank its declaration promises clients."""
    if len(tensor.shape) != len(spec.shape):
        raise RuntimeError(f"output {spec.name!r} has shape {list(tensor.shape)}; it is declared "
                           f"as {list(spec.shape)}")
    if spec.datatype == "BF16":
        return np.asarray(tensor.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16))
    if tensor.dtype in (torch.bfloat16, torch.float16):
        tensor = tensor.float()  # numpy has no bfloat16; float32 holds both exactly
    return np.asarray(tensor.numpy().astype(OIP_TO_NUMPY[spec.datatype], copy=False))


def import_factory(target: str, folder: Path) -> Any:
    """The callable `target` ("package.module:factory") names; a module next to the weights
    (in `folder`) is importable."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise RuntimeError(f"module = {target!r} must look like 'package.module:factory'")
    if str(folder) not in sys.path:
        sys.path.append(str(folder))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise RuntimeError(f"cannot import module {module_name!r}: {exc}") from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise RuntimeError(f"module {module_name!r} has no callable {attr!r}")
    return factory
