"""Find servable models in a folder, reading metadata only (never the weights).

Two kinds of model are found:

- ONNX: every `.onnx` file that is not another model's external data. Its inputs and outputs come
  from `onnx.load(..., load_external_data=False)`; batching is on when every input and output has
  a dynamic first dimension. With a tokenizer.json beside it (or above it: the Hub's
  `onnx/model.onnx`) and a graph that takes token ids, it takes text: `tokenize = true`, with
  the pooling of its sentence-transformers files, or, for a sequence classifier (a
  cross-encoder), `task = "text-classification"` (hub/classifiers.py). ZipMap outputs read as
  the tensors served (runtime/onnx/ml_outputs.py); an output with no tensor form is skipped.
- safetensors: a Hugging Face folder (`config.json` plus `*.safetensors` or a sharded index) is
  one torch model, its task read from the config's architectures (a sequence classifier with
  a tokenizer takes text pairs, and reranks with one label); a `.safetensors` file outside
  such a folder is a plain state dict, whose module and tensors the user has to declare.

Hidden folders (such as the `.cache/huggingface` that downloads leave behind) are skipped.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from snoozeml.datatypes import ONNX_TO_OIP, TensorSpec
from snoozeml.hub.classifiers import (
    architectures_in,
    check_classifier_graph,
    label_count_in,
    onnx_classifier_evidence,
    onnx_labels,
    serves_as,
)
from snoozeml.hub.images import hf_image_notes, onnx_image
from snoozeml.runtime.files import external_data_paths
from snoozeml.runtime.onnx.ml_outputs import NoTensorForm, served_form
from snoozeml.runtime.onnx.text import plan_graph
from snoozeml.runtime.text.settings import (
    DEFAULT_POOLING,
    TOKENIZER_FILE,
    Pooling,
    beside_or_above,
    sentence_transformers,
)

Format = Literal["onnx", "torch"]
Task = Literal["feature-extraction", "text-classification", "image-classification"]

DEFAULT_MAX_BATCH_SIZE = 32

_NAME_RULE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
_GENERIC_STEMS = {"model"}


@dataclass(frozen=True)
class ScannedModel:
    """One model found on disk, as it will be written into models.toml."""

    name: str
    path: Path  # absolute
    format: Format
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    max_batch_size: int | None = None  # None: no [models.batching] (the daemon's defaults)
    batching_note: str | None = None
    task: Task | None = None
    tokenize: bool = False
    pooling: Pooling | None = None
    normalize: bool | None = None
    max_length: int | None = None
    role: str | None = None  # what it serves as, for the summary ("a reranker on /v1/rerank…")
    notes: tuple[str, ...] = ()  # comment lines written into the entry, for the reader
    image: dict[str, Any] | None = None  # [models.image] (hub/images.py)


@dataclass(frozen=True)
class Skipped:
    """A file that looked like a model but is not one SnoozeML can serve, and why."""

    path: Path
    reason: str


@dataclass(frozen=True)
class ScanResult:
    models: list[ScannedModel] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)


def scan_directory(path: Path) -> list[ScannedModel]:
    """The models found under `path` (a folder, or a single model file), in path order."""
    return scan(path).models


def scan(path: Path, base_name: str | None = None) -> ScanResult:
    """Like scan_directory, also reporting what was skipped.

    `base_name` prefixes every model name (pull uses the repository's name); without it, names
    come from the paths below `path`, and from `path`'s own name for a model at its top.
    """
    root = path.resolve()
    found: list[tuple[Path, ScannedModel]] = []
    skipped: list[Skipped] = []
    onnx_files: list[Path] = []
    for folder, files, place in _walk(root):
        if place == "hf":
            found.append((folder, _hf_model(folder)))
        for name in files:
            if name.endswith(".onnx"):
                onnx_files.append(folder / name)
            elif name.endswith(".safetensors") and place == "plain":
                found.append((folder / name, _plain_state_dict(folder / name)))

    headers: list[tuple[Path, Any]] = []
    external: set[Path] = set()
    for file in onnx_files:
        try:
            header = _load_onnx_header(file)
            external.update(external_data_paths(header, file.parent))
            headers.append((file, served_form(header)))  # ZipMap outputs as tensors
        except NotOnnx as exc:
            skipped.append(Skipped(file, f"not a readable ONNX model ({exc})"))
        except NoTensorForm as exc:  # runtime/onnx/ml_outputs.py: how to export it instead
            skipped.append(Skipped(file, str(exc)))
    # A file that another model keeps its tensors in is data, not a model, whatever its name.
    found.extend((file, _onnx_model(file, header)) for file, header in headers
                 if file.resolve() not in external)

    found.sort(key=lambda item: item[0].as_posix())
    naming_root = root.parent if root.is_file() else root
    return ScanResult(models=_named(naming_root, found, base_name), skipped=skipped)


# --- walking ---------------------------------------------------------------------------

Place = Literal["hf", "inside-hf", "plain"]


def _walk(root: Path) -> Iterator[tuple[Path, list[str], Place]]:
    """(folder, its file names, where it stands): "hf" for a Hugging Face model folder,
    "inside-hf" for a folder within one (its weights belong to that model), else "plain"."""
    if root.is_file():
        yield root.parent, [root.name], "plain"
        return
    hf_folders: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        folder = Path(dirpath)
        files = sorted(f for f in filenames if not f.startswith("."))
        place: Place = "plain"
        if any(folder.is_relative_to(hf) for hf in hf_folders):
            place = "inside-hf"
        elif _is_hf_folder(folder, files):
            hf_folders.append(folder)
            place = "hf"
        yield folder, files, place


def _is_hf_folder(folder: Path, files: Iterable[str]) -> bool:
    names = set(files)
    if "config.json" not in names or not (folder / "config.json").is_file():
        return False
    return any(n.endswith((".safetensors", ".safetensors.index.json")) for n in names)


# --- ONNX ------------------------------------------------------------------------------


class NotOnnx(Exception):
    """A `.onnx` file that does not parse as a model (internal to the scan)."""


def _load_onnx_header(file: Path) -> Any:
    """The model without its external tensors: graph, inputs, outputs, embedded weights."""
    import onnx  # heavy import, only when there is an ONNX file to read
    from google.protobuf.message import DecodeError

    try:
        model = onnx.load(str(file), load_external_data=False)
    except (OSError, DecodeError, ValueError) as exc:
        raise NotOnnx(_first_line(exc)) from exc
    if not model.graph.output:  # an empty file parses as an empty ModelProto
        raise NotOnnx("it has no graph outputs")
    return model


def external_data_files(file: Path) -> set[Path]:
    """The resolved paths of the files an ONNX model keeps its tensors in (empty if it keeps
    them inside, or does not parse)."""
    try:
        return external_data_paths(_load_onnx_header(file), file.parent)
    except NotOnnx:
        return set()


def _tensor_spec(value: Any) -> TensorSpec:
    from onnx import TensorProto

    tensor_type = value.type.tensor_type
    type_name = TensorProto.DataType.Name(tensor_type.elem_type).lower()
    datatype = ONNX_TO_OIP.get(f"tensor({type_name})", type_name.upper())
    shape = tuple(
        dim.dim_value if dim.HasField("dim_value") else -1 for dim in tensor_type.shape.dim
    )
    return TensorSpec(value.name, datatype, shape)


def _onnx_model(file: Path, model: Any) -> ScannedModel:
    initializer_names = {t.name for t in model.graph.initializer}
    inputs = tuple(
        _tensor_spec(v) for v in model.graph.input if v.name not in initializer_names
    )
    outputs = tuple(_tensor_spec(v) for v in model.graph.output)
    blocker = next(
        (t for t in (*inputs, *outputs) if not t.shape or t.shape[0] != -1), None
    )
    if blocker is None:
        max_batch_size = DEFAULT_MAX_BATCH_SIZE
        note = "on: every input and output has a dynamic first dimension"
    else:
        max_batch_size = 0
        first = "it is a scalar" if not blocker.shape else f"it is fixed to {blocker.shape[0]}"
        note = f"off: the first dimension of {blocker.name!r} is not dynamic ({first})"
    notes = [
        f"{label} {t.name} {t.datatype} {list(t.shape)}"
        for label, group in (("input: ", inputs), ("output:", outputs))
        for t in group
    ]
    text = _onnx_text(file, inputs, outputs, notes) or onnx_image(file, inputs, notes)
    return ScannedModel(name="", path=file, format="onnx", inputs=inputs, outputs=outputs,
                        max_batch_size=max_batch_size, batching_note=note, notes=tuple(notes),
                        **text)


def _onnx_text(
    file: Path, inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...],
    notes: list[str],
) -> dict[str, Any] | None:
    """The entry's text keys for an ONNX file that can take text (tokenize = true): one with a
    tokenizer.json beside it, or in the folder above it (the Hub's `onnx/model.onnx`;
    runtime/text/settings.tokenizer_folder finds it there too), and a graph that
    runtime/onnx/text.py can feed and pool, or runtime/onnx/text_classifier.py can feed and
    classify (then with task and role). None for any other."""
    folder = beside_or_above(file)
    if not (folder / TOKENIZER_FILE).is_file():
        return None
    where = "beside it" if folder == file.parent else "in the folder above"
    evidence = onnx_classifier_evidence(folder, outputs)
    if evidence is not None:
        try:
            check_classifier_graph(inputs, outputs)
        except RuntimeError as exc:
            notes.append(f"tokenize is off although tokenizer.json is {where}: {exc}")
            return None
        role, lines = serves_as(onnx_labels(folder, outputs))
        notes.append(f"tokenize = true: tokenizer.json is {where}, so the model accepts text")
        notes.append(f"task = \"text-classification\": {evidence}")
        notes.extend(lines)
        return {"tokenize": True, "task": "text-classification", "role": role}
    found: list[str] = []
    pooling, normalize, max_length = _sentence_transformers(folder, found)
    try:
        plan = plan_graph(inputs, outputs, pooling or DEFAULT_POOLING, pooling_set=False)
    except RuntimeError as exc:
        notes.append(f"tokenize is off although tokenizer.json is {where}: {exc}")
        return None
    notes.append(f"tokenize = true: tokenizer.json is {where}, so the model accepts text")
    notes.extend(found)
    if plan.pooling != (pooling or DEFAULT_POOLING):
        notes.append(f"pooling = \"model\": the graph has no token-level output to pool; its "
                     f"{plan.source} is the embedding")
        pooling = plan.pooling
    return {"tokenize": True, "pooling": pooling, "normalize": normalize,
            "max_length": max_length}


# --- safetensors -----------------------------------------------------------------------


def _task_of(architectures: list[str]) -> Task | None:
    for arch in architectures:
        if arch.endswith("ForSequenceClassification"):
            return "text-classification"
        if arch.endswith("ForImageClassification"):
            return "image-classification"
        if arch.endswith("Model") and not arch.endswith(("LMHeadModel", "PreTrainedModel")):
            return "feature-extraction"
    return None


def _hf_model(folder: Path) -> ScannedModel:
    architectures = architectures_in(folder)
    task = _task_of(architectures)
    notes: list[str] = []
    if task is not None:
        notes.append(f"task from config.json architectures: {', '.join(architectures)}")
    elif architectures:
        notes.append(f"config.json architectures {', '.join(architectures)} match no task "
                     "SnoozeML serves (feature-extraction, text-classification, "
                     "image-classification): set task by hand")
    else:
        notes.append("config.json names no architectures: set task by hand")
    tokenize = (folder / "tokenizer.json").is_file()
    if tokenize:
        notes.append("tokenize = true: tokenizer.json is present, so the model accepts text")
    notes.extend(hf_image_notes(folder, task))
    role: str | None = None
    if task == "text-classification":
        role, lines = serves_as(label_count_in(folder)) if tokenize else (
            None, ["no tokenizer.json: it takes token ids, not text, so it scores no text "
                   "pairs and does not rerank"])
        notes.extend(lines)
    pooling, normalize, max_length = _sentence_transformers(folder, notes) \
        if task == "feature-extraction" else (None, None, None)
    return ScannedModel(
        name="", path=folder, format="torch", task=task, tokenize=tokenize, role=role,
        pooling=pooling, normalize=normalize, max_length=max_length, notes=tuple(notes),
    )


def _sentence_transformers(
    folder: Path, notes: list[str]
) -> tuple[Pooling | None, bool | None, int | None]:
    """Pooling, normalisation and length from a sentence-transformers layout, if it is one."""
    found = sentence_transformers(folder)
    if found is None:
        return None, None, None
    notes.append("pooling, normalize and max_length from the sentence-transformers files")
    if found.unsupported:
        notes.append(f"sentence-transformers modules SnoozeML does not run: "
                     f"{', '.join(found.unsupported)}; the embeddings will differ from the "
                     "library's")
    return found.pooling, found.normalize, found.max_length


def _plain_state_dict(file: Path) -> ScannedModel:
    notes = (
        "a plain state dict: fill in module (a factory returning the torch.nn.Module,",
        "\"package.module:function\") and the inputs and outputs it takes, for example:",
        "module = \"my_package.models:build\"",
        "inputs = [{ name = \"x\", datatype = \"FP32\", shape = [-1, 4] }]",
        "outputs = [{ name = \"y\", datatype = \"FP32\", shape = [-1, 2] }]",
    )
    return ScannedModel(name="", path=file, format="torch", notes=notes)


# --- names -----------------------------------------------------------------------------


def sanitise_name(text: str) -> str:
    """`text` made to fit the config's name rule (letters, digits, `_`, `-`, `.`)."""
    name = re.sub(r"[^A-Za-z0-9_.\-]+", "-", text)
    name = re.sub(r"^[^A-Za-z0-9]+", "", name).rstrip("-.")
    return name if _NAME_RULE.match(name) else "model"


def unique_name(name: str, taken: set[str]) -> str:
    """`name`, or `name-2`, `name-3`… whichever is not in `taken` (compared case-sensitively)."""
    candidate, n = name, 1
    while candidate in taken:
        n += 1
        candidate = f"{name}-{n}"
    return candidate


def _words(root: Path, path: Path, base_name: str | None) -> list[str]:
    rel = path.relative_to(root) if path != root and path.is_relative_to(root) else Path()
    parts = list(rel.parts)
    if parts and path.is_file():
        parts[-1] = parts[-1].removesuffix(".onnx").removesuffix(".safetensors")
    words = ([base_name] if base_name else []) + parts
    if len(words) > 1 and words[-1].lower() in _GENERIC_STEMS:
        words.pop()
    deduped: list[str] = []
    for word in words:
        if not deduped or deduped[-1].lower() != word.lower():
            deduped.append(word)
    if not deduped or (base_name is None and [w.lower() for w in deduped] == ["model"]):
        return [root.name]
    return deduped


def _named(root: Path, found: list[tuple[Path, ScannedModel]],
           base_name: str | None) -> list[ScannedModel]:
    taken: set[str] = set()
    named: list[ScannedModel] = []
    for path, model in found:
        name = unique_name(sanitise_name("-".join(_words(root, path, base_name))), taken)
        taken.add(name)
        named.append(replace(model, name=name))
    return named


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
