"""Which files of a Hub repository serving needs: a pure function of the file list.

The weights (by format preference), every `*.json` (model configs, sharded indexes,
tokenizer and sentence-transformers settings), the tokenizer's vocabulary files, and the
external-data files of the chosen ONNX models. `--include` adds files, `--exclude` removes them,
last. Patterns are fnmatch globs matched against the whole path, `*` crossing `/` (as in
huggingface_hub's allow_patterns).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from fnmatch import fnmatchcase
from typing import Literal

Preference = Literal["onnx", "torch"]

WEIGHT_SUFFIXES = (".onnx", ".safetensors")
TOKENIZER_FILES = frozenset({
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.txt", "vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model",
    "tokenizer.model",
})
# Weights SnoozeML does not load, named in "nothing servable" messages.
UNSERVABLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf", ".tflite")


def select_files(
    files: Iterable[str],
    prefer: Preference | None = None,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
) -> list[str]:
    """The repository paths to download, sorted.

    `prefer="onnx"` takes ONNX only, from the `onnx/` folder when there is one (its
    `model.onnx` alone when present, the other variants being left to `--include`).
    `prefer="torch"` takes safetensors only. With no preference: safetensors plus the ONNX
    files at the top of the repository, or the ONNX preference when there are neither.
    """
    visible = sorted(f for f in files if not any(p.startswith(".") for p in f.split("/")))
    chosen = set(_weights(visible, prefer))
    chosen.update(f for f in visible if _is_support_file(f))
    chosen.update(f for f in visible if _matches(f, include))
    chosen.update(external_data_companions(visible, chosen))
    return sorted(f for f in chosen if not _matches(f, exclude))


def has_weights(files: Iterable[str]) -> bool:
    return any(f.endswith(WEIGHT_SUFFIXES) for f in files)


def external_data_companions(files: Iterable[str], chosen: Iterable[str]) -> set[str]:
    """Files named after a chosen ONNX model (`model.onnx_data`, `model.onnx.data`…): its
    external data by the exporters' conventions. Others are found once the model is read."""
    models = [f for f in chosen if f.endswith(".onnx")]
    return {f for f in files for m in models if f != m and f.startswith(m)}


def unservable_hint(files: Iterable[str]) -> str:
    """A sentence naming weights SnoozeML cannot load, or "" when there are none."""
    others = sorted(f for f in files if f.endswith(UNSERVABLE_SUFFIXES))
    if not others:
        return ""
    shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
    return f"it has {shown}, which SnoozeML does not load (it serves ONNX and safetensors)"


def _weights(files: Sequence[str], prefer: Preference | None) -> list[str]:
    onnx = [f for f in files if f.endswith(".onnx")]
    safetensors = [f for f in files if f.endswith(".safetensors")]
    if prefer == "onnx":
        return _preferred_onnx(onnx)
    if prefer == "torch":
        return safetensors
    top_level_onnx = [f for f in onnx if "/" not in f]
    return (safetensors + top_level_onnx) or _preferred_onnx(onnx)


def _preferred_onnx(onnx: Sequence[str]) -> list[str]:
    for folder in ("onnx/", ""):
        here = [f for f in onnx if f.startswith(folder) and "/" not in f[len(folder):]]
        if here:
            canonical = f"{folder}model.onnx"
            return [canonical] if canonical in here else here
    return list(onnx)


def _is_support_file(path: str) -> bool:
    return path.endswith(".json") or path.rsplit("/", 1)[-1] in TOKENIZER_FILES


def _matches(path: str, patterns: Sequence[str]) -> bool:
    return any(fnmatchcase(path, _glob(pattern)) for pattern in patterns)


def _glob(pattern: str) -> str:
    """As huggingface_hub reads patterns: `\\` is `/`, and `folder/` means all of `folder/`."""
    pattern = pattern.replace("\\", "/")
    return pattern + "*" if pattern.endswith("/") else pattern


def literal_pattern(path: str) -> str:
    """An fnmatch pattern matching exactly `path` (its `*`, `?` and `[` made literal)."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in path)
