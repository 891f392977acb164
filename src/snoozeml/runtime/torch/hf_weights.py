"""A Hugging Face folder's weights assigned straight from its memory-mapped `model.safetensors`.

`from_pretrained` spends most of a small model's load in machinery a plain folder does not need
(key conversions, a thread pool, reports, initialising what it then overwrites). Here the module
is built with its parameters on the meta device, so none is allocated or initialised, while its
buffers are computed by its own `__init__` on the CPU; the checkpoint's tensors, mapped from the
file, then take the parameters' places.

Only an exact fit goes this way, with transformers 5 (whose models set themselves up in
`__init__`, as from_pretrained leaves them): one safetensors file whose keys (after adding or
removing the `base_model_prefix`) name every weight of the model, shape for shape, for a class
transformers does not convert on load. Anything else raises `NotMappable` with the reason, and
the caller loads with `from_pretrained`, which knows sharded and `.bin` checkpoints, renamed
legacy keys, adapters and quantization, and names what is missing or mis-shaped.

The tensors stay mapped while the model is loaded. Deleting the file, or replacing it by a
rename (what the hub pull does), is safe on Linux: the mapping keeps the old inode. Rewriting
it in place is not, exactly as with `from_pretrained`, which maps the file too.
"""

from __future__ import annotations

import importlib
import itertools
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from torch.nn.modules.module import register_module_parameter_registration_hook

from snoozeml.runtime.torch.env import dtype_key, require, transformers_version

WEIGHTS_FILE = "model.safetensors"
# What in a folder needs transformers' own loader.
_NEEDS_FROM_PRETRAINED = {
    "adapter_config.json": "a PEFT adapter (adapter_config.json)",
    "model.safetensors.index.json": "sharded weights (model.safetensors.index.json)",
}


class NotMappable(Exception):
    """The folder needs `from_pretrained`; the message says why."""


@dataclass(frozen=True)
class Mapped:
    model: torch.nn.Module  # on the CPU, not yet in eval mode
    unused: list[str]  # checkpoint keys the model has no place for (from_pretrained's too)


def load_mapped(folder: Path, cls: Any, config: Any, dtype: torch.dtype) -> Mapped:
    """`cls(config)` holding the weights of `folder/model.safetensors`, memory-mapped (floating
    ones as `dtype`). Raises NotMappable for anything but an exact fit."""
    _refuse_folder(folder, config)
    model = _build_without_parameters(cls, config)
    _refuse_conversions(model)
    computed = _non_persistent_buffers(model)
    _refuse_dtype(model, dtype, computed)
    expected = model.state_dict(keep_vars=True)
    state = _renamed(require("safetensors.torch").load_file(str(folder / WEIGHTS_FILE)),
                     expected, getattr(model, "base_model_prefix", ""))
    _refuse_mismatches(model, state, expected)
    try:
        model.load_state_dict({k: _as_wanted(t, expected[k], dtype)
                               for k, t in state.items() if k in expected},
                              strict=False, assign=True)
    except RuntimeError as exc:  # a module's own loading hook refused it
        raise NotMappable(f"load_state_dict: {exc}") from exc
    if _on_meta(model):  # a weight saved once for two places, as save_pretrained writes it
        cast(Any, model).tie_weights()
    missing = _on_meta(model)
    if missing:
        raise NotMappable(f"{len(missing)} weights not in the file ({', '.join(missing[:3])})")
    setattr(model.config, dtype_key(), dtype)  # as from_pretrained records it
    ignored = [re.compile(p) for p in getattr(model, "_keys_to_ignore_on_load_unexpected", None)
               or ()]
    unused = sorted(k for k in state if k not in expected and k not in computed
                    and not any(p.search(k) for p in ignored))
    return Mapped(model, unused)


# --- building without parameters ---------------------------------------------------------------

_building = threading.local()


def _parameter_to_meta(module: torch.nn.Module, name: str, param: Any) -> Any:
    """Installed once for the process (adding and removing a global hook per load would race
    with other threads iterating the hooks); acts only on a thread inside
    `_build_without_parameters`. Swaps each parameter for a meta one as it is registered,
    before the module's own initialisation writes into it."""
    if not getattr(_building, "active", False) or type(param) is not torch.nn.Parameter \
            or param.is_meta:
        return None
    meta = torch.nn.Parameter(param.detach().to("meta"), requires_grad=param.requires_grad)
    meta._is_hf_initialized = True  # type: ignore[attr-defined]  # transformers 5 skips its init
    return meta


register_module_parameter_registration_hook(_parameter_to_meta)


def _build_without_parameters(cls: Any, config: Any) -> torch.nn.Module:
    """`cls(config)` with every parameter on the meta device and every buffer as `__init__`
    computes it (on the CPU: a meta buffer would have no value to restore)."""
    _building.active = True
    try:
        model: torch.nn.Module = cls(config)
    except (RuntimeError, NotImplementedError) as exc:  # e.g. __init__ reads a weight's value
        raise NotMappable(f"cannot build {cls.__name__} without weights: {exc}") from exc
    finally:
        _building.active = False
    return model


# --- checks and renames ----------------------------------------------------------------------


def _refuse_folder(folder: Path, config: Any) -> None:
    """What the folder and config alone show needs from_pretrained (before building anything)."""
    if transformers_version() < (5, 0):
        # transformers 4 picks the attention implementation and the default dtype in
        # from_pretrained, not in the model's __init__: a model built here would differ.
        raise NotMappable("transformers 4")
    for name, what in _NEEDS_FROM_PRETRAINED.items():
        if (folder / name).exists():
            raise NotMappable(what)
    if not (folder / WEIGHTS_FILE).is_file():
        raise NotMappable(f"no {WEIGHTS_FILE} (.bin weights)")
    if getattr(config, "quantization_config", None):
        raise NotMappable("quantized weights")


def _refuse_conversions(model: torch.nn.Module) -> None:
    """transformers 5 renames or transforms some classes' weights on load (ViT's, MoE experts');
    those take from_pretrained. Legacy renames (LayerNorm.gamma) show up as missing weights."""
    name = type(model).__name__
    try:
        conversions = importlib.import_module("transformers.conversion_mapping")
        found = conversions.get_model_conversion_mapping(model, add_legacy=False)
    except (ImportError, AttributeError, TypeError) as exc:  # another transformers 5.x
        raise NotMappable(f"cannot tell whether {name} converts its weights: {exc}") from exc
    if found:
        raise NotMappable(f"{name} converts its weights on load")


def _refuse_dtype(model: torch.nn.Module, dtype: torch.dtype, computed: set[str]) -> None:
    """Below float32, from_pretrained keeps some modules in float32 and builds float buffers in
    `dtype`: models with either take it."""
    if dtype == torch.float32:
        return
    if getattr(model, "_keep_in_fp32_modules", None) or \
            getattr(model, "_keep_in_fp32_modules_strict", None):
        raise NotMappable(f"{type(model).__name__} keeps modules in float32")
    buffers = dict(model.named_buffers())
    if any(name in buffers and buffers[name].is_floating_point() for name in computed):
        raise NotMappable(f"floating-point buffers computed at build, and dtype {dtype}")


def _refuse_mismatches(model: torch.nn.Module, state: dict[str, torch.Tensor],
                       expected: dict[str, Any]) -> None:
    """Shapes that differ, and buffers the file lacks: a buffer is never left on the meta device
    (`__init__` computed it), so this is where one that from_pretrained calls missing
    (BatchNorm's running_mean) is caught."""
    shapes = sorted(k for k, t in state.items() if k in expected and t.shape != expected[k].shape)
    if shapes:
        raise NotMappable(f"shapes differ for {', '.join(shapes[:3])}")
    buffers = {name for name, _ in model.named_buffers()}
    absent = sorted(k for k in expected if k in buffers and k not in state)
    if absent:
        raise NotMappable(f"{len(absent)} buffers not in the file ({', '.join(absent[:3])})")


def _non_persistent_buffers(model: torch.nn.Module) -> set[str]:
    """Buffers `__init__` computes (`position_ids`); old checkpoints may hold them too, and
    from_pretrained ignores those copies."""
    return {f"{path}.{name}" if path else name
            for path, module in model.named_modules()
            for name in module._non_persistent_buffers_set}


def _renamed(state: dict[str, torch.Tensor], expected: dict[str, Any],
             prefix: str) -> dict[str, torch.Tensor]:
    """The checkpoint's keys as the model names them: a head model's checkpoint loaded into its
    base model drops the `prefix.`; a base model's checkpoint loaded into a head model gains it."""
    if not prefix or any(k in expected for k in state):
        return state
    dotted = f"{prefix}."
    if any(k.startswith(dotted) for k in state):
        return {k.removeprefix(dotted): t for k, t in state.items()}
    return {dotted + k: t for k, t in state.items()}


def _as_wanted(tensor: torch.Tensor, like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A floating weight as `dtype`, any other as the model made it (integer buffers). Not "as
    the model made it" for floating weights too: from_pretrained changes torch's default dtype
    process-wide while it builds a model, so a build here, on another loader thread, may see
    float16 for a float32 model."""
    wanted = dtype if like.is_floating_point() else like.dtype
    return tensor if tensor.dtype == wanted else tensor.to(wanted)


def _on_meta(model: torch.nn.Module) -> list[str]:
    tensors = itertools.chain(model.named_parameters(remove_duplicate=False),
                              model.named_buffers(remove_duplicate=False))
    return sorted(name for name, tensor in tensors if tensor.is_meta)
