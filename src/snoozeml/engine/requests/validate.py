"""Checks of a decoded request against the model's own metadata. Pure; raises InvalidInput."""

from __future__ import annotations

from snoozeml.datatypes import ModelMetadata
from snoozeml.engine.requests.classification import check_classifiable
from snoozeml.engine.requests.request import InferRequest
from snoozeml.errors import InvalidInput


def _shape_text(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def check_request(request: InferRequest, metadata: ModelMetadata) -> None:
    """Every input known, present once, of the model's datatype, rank and fixed dimensions;
    every requested output known, and numeric where it asks for classification."""
    model = metadata.name
    expected = [spec.name for spec in metadata.inputs]
    seen: set[str] = set()
    for tensor in request.inputs:
        spec = metadata.input(tensor.name)
        if spec is None:
            raise InvalidInput(
                f"unknown input {tensor.name!r} for model {model!r}; expected {expected}"
            )
        if tensor.name in seen:
            raise InvalidInput(f"input {tensor.name!r} is given more than once")
        seen.add(tensor.name)
        if tensor.datatype != spec.datatype:
            raise InvalidInput(
                f"input {tensor.name!r}: datatype {tensor.datatype} does not match the model's "
                f"{spec.datatype}"
            )
        fits = len(tensor.shape) == len(spec.shape) and all(
            want < 0 or want == got for want, got in zip(spec.shape, tensor.shape, strict=True)
        )
        if not fits:
            raise InvalidInput(
                f"input {tensor.name!r}: shape {_shape_text(tensor.shape)} does not match the "
                f"model's {_shape_text(spec.shape)} (-1 is any size)"
            )
    if metadata.input_sets:
        if not any(seen.issuperset(group) for group in metadata.input_sets):
            choices = " or ".join(str(list(group)) for group in metadata.input_sets)
            raise InvalidInput(f"model {model!r} takes {choices}; got {sorted(seen)}")
    else:
        required = [spec.name for spec in metadata.inputs if not spec.optional]
        missing = [name for name in required if name not in seen]
        if missing:
            raise InvalidInput(
                f"missing input {missing[0]!r} for model {model!r}; expected {expected}"
            )
    if request.outputs:
        known = [spec.name for spec in metadata.outputs]
        wanted: set[str] = set()
        for output in request.outputs:
            if output.name not in known:
                raise InvalidInput(
                    f"unknown output {output.name!r} for model {model!r}; expected {known}"
                )
            if output.name in wanted:
                raise InvalidInput(f"output {output.name!r} is requested more than once")
            wanted.add(output.name)
            spec = metadata.output(output.name)
            if output.classification is not None and spec is not None:
                check_classifiable(output.name, spec.datatype)
