"""The parameters of a repository load (HTTP's JSON `parameters`, gRPC's
`map<string, ModelRepositoryParameter>`): `path` adds a model that models.toml does not have,
from a file or folder on the daemon's machine; `model_type` narrows its format (onnx,
safetensors, pytorch, as ModelMesh names them)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from snoozeml.errors import InvalidInput

_KNOWN = ("path", "model_type")


@dataclass(frozen=True, slots=True)
class LoadParameters:
    path: str | None = None
    model_type: str | None = None


def load_parameters(parameters: Any) -> LoadParameters:
    if not isinstance(parameters, Mapping):
        raise InvalidInput("'parameters' must be an object")
    for key in parameters:
        if key == "config" or str(key).startswith("file:"):
            raise InvalidInput(f"parameter {key!r} is not supported: give the model's files "
                               "on this machine with the 'path' parameter")
        if key not in _KNOWN:
            raise InvalidInput(f"unknown parameter {str(key)[:100]!r} (a load takes "
                               f"{' and '.join(repr(k) for k in _KNOWN)})")
    values = {}
    for key in _KNOWN:
        value = parameters.get(key)
        if key in parameters and (not isinstance(value, str) or not value.strip()):
            raise InvalidInput(f"parameter {key!r} must be a non-empty string")
        values[key] = value
    if values["model_type"] is not None and values["path"] is None:
        raise InvalidInput("parameter 'model_type' goes with 'path'")
    return LoadParameters(**values)


def grpc_parameters(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """A gRPC parameter map as plain values (a string parameter as a str, and so on)."""
    plain: dict[str, Any] = {}
    for key, parameter in parameters.items():
        choice = parameter.WhichOneof("parameter_choice")
        plain[key] = getattr(parameter, choice) if choice is not None else None
    return plain
