"""How a text model turns tokens into one embedding: its pooling, normalisation and length.

A model's entry may set `pooling`, `normalize` and `max_length`; what it leaves out comes from
the sentence-transformers files next to its tokenizer, when the folder is a sentence-transformers
model (`modules.json`, the Pooling module's `config.json`, `sentence_bert_config.json`), else
from the defaults: mean pooling, normalised, 512 tokens. That is what
`SentenceTransformer(folder).encode(..., normalize_embeddings=True)` does for the models it
loads from such a folder, so the daemon answers as the library does in-process.

A sentence-transformers model whose modules SnoozeML does not run (a Dense projection, a pooling
mode it lacks) gets no silent approximation: its settings raise `UnsupportedLayout`, and the
model goes FAILED saying which module, unless its entry sets `pooling` itself.

Pure file reading: no torch, no tokenizers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from snoozeml.config.settings import ModelConfig

Pooling = Literal["mean", "cls", "max", "last", "model"]
DEFAULT_POOLING: Pooling = "mean"
DEFAULT_NORMALIZE = True
DEFAULT_MAX_LENGTH = 512
TOKENIZER_FILE = "tokenizer.json"

ST_MODULES = "modules.json"
_ST_TRANSFORMER = "sentence_transformers.models.Transformer"
_ST_POOLING = "sentence_transformers.models.Pooling"
_ST_NORMALIZE = "sentence_transformers.models.Normalize"
# sentence-transformers' pooling flags, and what SnoozeML calls each mode it implements.
_ST_POOLING_MODES: dict[str, Pooling | None] = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_lasttoken": "last",
    "pooling_mode_mean_sqrt_len_tokens": None,
    "pooling_mode_weightedmean_tokens": None,
}


class UnsupportedLayout(Exception):
    """A sentence-transformers folder whose modules SnoozeML does not run; says which."""


@dataclass(frozen=True, slots=True)
class SentenceTransformers:
    """What a sentence-transformers folder says about its embeddings."""

    pooling: Pooling | None  # None: no Pooling module
    normalize: bool  # a Normalize module follows the pooling
    max_length: int | None  # sentence_bert_config.json's max_seq_length
    unsupported: tuple[str, ...]  # modules or pooling modes SnoozeML does not run, by name


@dataclass(frozen=True, slots=True)
class TextSettings:
    pooling: Pooling
    normalize: bool
    max_length: int
    truncate: bool
    source: str  # where the pooling and normalisation came from, for the logs and status
    truncate_query: bool = True  # text pairs: the first text is cut too (longest_first)


def read_json(path: Path) -> Any:
    """The file's JSON, or None when it is missing or not JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def sentence_transformers(folder: Path) -> SentenceTransformers | None:
    """The folder's sentence-transformers settings; None when it is not such a folder."""
    modules = read_json(folder / ST_MODULES)
    if not isinstance(modules, list):
        return None
    kinds = {str(m.get("type")): str(m.get("path", "")) for m in modules if isinstance(m, dict)}
    unsupported = [kind.rsplit(".", 1)[-1] for kind in kinds
                   if kind not in (_ST_TRANSFORMER, _ST_POOLING, _ST_NORMALIZE)]
    pooling: Pooling | None = None
    if _ST_POOLING in kinds:
        settings = read_json(folder / kinds[_ST_POOLING] / "config.json")
        flags = [flag for flag in _ST_POOLING_MODES
                 if isinstance(settings, dict) and settings.get(flag) is True]
        modes = [_ST_POOLING_MODES[flag] for flag in flags]
        if len(flags) == 1 and modes[0] is not None:
            pooling = modes[0]
        else:
            shown = ", ".join(flags) if flags else "no pooling mode"
            unsupported.append(f"Pooling ({shown})")
    bert = read_json(folder / "sentence_bert_config.json")
    length = bert.get("max_seq_length") if isinstance(bert, dict) else None
    max_length = length if isinstance(length, int) and not isinstance(length, bool) \
        and length > 0 else None
    return SentenceTransformers(pooling, _ST_NORMALIZE in kinds, max_length, tuple(unsupported))


def task_of(config: dict[str, Any]) -> str:
    """The task a Hugging Face config implies through its architectures."""
    for arch in config.get("architectures") or []:
        if arch.endswith("ForSequenceClassification"):
            return "text-classification"
        if arch.endswith("ForImageClassification"):
            return "image-classification"
    return "feature-extraction"


def text_task(spec: ModelConfig) -> str | None:
    """The task of a model that takes text: its entry's `task`, else what its config.json's
    architectures say (task_of: a torch folder's, or the one beside an ONNX export's
    tokenizer); None when it has neither."""
    if spec.task is not None:
        return spec.task
    config = hf_config(spec)
    return task_of(config) if config is not None else None


def can_embed(spec: ModelConfig) -> bool:
    """Whether a model's entry makes it a text embedding model (what /v1/embeddings serves and
    /v1/models lists), from its entry and config.json alone: it takes text (`tokenize`), and its
    task is feature-extraction (an ONNX model's, unless its entry or config.json names another;
    a torch folder's only when they say so). The loaded model's metadata has the last word."""
    if not spec.tokenize:
        return False
    task = text_task(spec)
    if spec.format != "torch" and task is None:
        return True
    return task == "feature-extraction"


def can_score_pairs(spec: ModelConfig) -> bool:
    """Whether a model's entry makes it a text sequence classifier, which scores a query and a
    document as one pair (a cross-encoder: what the rerank routes serve), from its entry and
    config.json alone: it takes text (`tokenize`) and its task is text-classification. The
    runtimes serve such a model `text_pair` (runtime/text/pairs.py)."""
    return spec.tokenize and text_task(spec) == "text-classification"


def label_count(spec: ModelConfig) -> int | None:
    """How many labels a sequence classifier's config.json gives it (its `logits` per row):
    `id2label`'s, else `num_labels`, else transformers' default of 2; None without a config.
    A cross-encoder that reranks has 1."""
    config = hf_config(spec)
    return None if config is None else labels_in(config)


def labels_in(config: dict[str, Any]) -> int:
    """A Hugging Face config's label count, as label_count reads it (the scan's too)."""
    id2label = config.get("id2label")
    if isinstance(id2label, dict) and id2label:
        return len(id2label)
    labels = config.get("num_labels")
    if isinstance(labels, int) and not isinstance(labels, bool) and labels > 0:
        return labels
    return 2


def hf_config(spec: ModelConfig) -> dict[str, Any] | None:
    """The Hugging Face config.json of a model: in its folder, or beside its tokenizer (an
    ONNX export's); None when there is none or it is not a JSON object."""
    folder = spec.path if spec.path.is_dir() else tokenizer_folder(spec)
    config = read_json(folder / "config.json")
    return config if isinstance(config, dict) else None


def tokenizer_folder(spec: ModelConfig) -> Path:
    """Where a model's tokenizer (and sentence-transformers files) live: the entry's
    `tokenizer` (a tokenizer.json or its folder); else the model's folder (a torch model), or
    for an ONNX file the folder holding it, or that folder's parent when only it has a
    tokenizer.json (the Hub's `onnx/model.onnx` layout)."""
    if spec.tokenizer is not None:
        return spec.tokenizer.parent if spec.tokenizer.suffix == ".json" else spec.tokenizer
    if spec.path.is_dir():
        return spec.path
    return beside_or_above(spec.path)


def beside_or_above(file: Path) -> Path:
    """The folder of a model file's tokenizer: the file's own, or its parent when only that
    has a tokenizer.json (the Hub's `onnx/model.onnx`)."""
    here = file.parent
    if not (here / TOKENIZER_FILE).is_file() and (here.parent / TOKENIZER_FILE).is_file():
        return here.parent
    return here


def tokenizer_file(spec: ModelConfig) -> Path:
    if spec.tokenizer is not None and spec.tokenizer.suffix == ".json":
        return spec.tokenizer
    return tokenizer_folder(spec) / TOKENIZER_FILE


def text_settings(spec: ModelConfig, pooled: bool = True) -> TextSettings:
    """The entry's settings, completed from the sentence-transformers files or the defaults.
    Raises UnsupportedLayout for a sentence-transformers model SnoozeML cannot pool as the
    library does, unless the entry sets `pooling` itself. `pooled` False is a classifier, whose
    head pools: its modules are not checked, and its max_length defaults to the tokenizer's
    `model_max_length` (tokenizer_config.json), as CrossEncoder's does."""
    folder = tokenizer_folder(spec)
    found = sentence_transformers(folder)
    if pooled and found is not None and found.unsupported and spec.pooling is None:
        raise UnsupportedLayout(
            f"the sentence-transformers model in {folder} uses "
            f"{', '.join(found.unsupported)}, which SnoozeML does not run: its embeddings would "
            "differ from the library's. Set pooling (and normalize) in the model's entry to "
            "serve it anyway")
    source = "sentence-transformers" if found is not None else "defaults"
    if spec.pooling is not None and spec.normalize is not None:
        source = "config"
    pooling = spec.pooling or (found.pooling if found else None) or DEFAULT_POOLING
    normalize = spec.normalize if spec.normalize is not None else \
        (found.normalize if found else DEFAULT_NORMALIZE)
    max_length = spec.max_length or (found.max_length if found else None) \
        or (None if pooled else tokenizer_max_length(folder)) or DEFAULT_MAX_LENGTH
    return TextSettings(pooling, normalize, max_length, spec.truncate, source,
                        spec.truncate_query)


# What transformers writes as model_max_length when the tokenizer has no limit (1e30).
_NO_LIMIT = 1_000_000_000


def tokenizer_max_length(folder: Path) -> int | None:
    """tokenizer_config.json's `model_max_length`; None when it is absent or means no limit."""
    config = read_json(folder / "tokenizer_config.json")
    value = config.get("model_max_length") if isinstance(config, dict) else None
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value < _NO_LIMIT:
        return value
    return None
