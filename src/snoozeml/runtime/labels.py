"""Class labels for a model's outputs, which the classification extension names each class
with (engine/requests/classification.py). Found once per load, from one of three places:

1. the entry's `labels` file: one label per line, in class order. It goes to the numeric
   outputs with as many classes (an output of shape [N, C] has C classes per row, [C] has C),
   else to those whose class count the model leaves open; a file that fits no output fails the
   load, saying what the outputs have.
2. an ONNX-ML classifier's own labels (runtime/onnx/class_labels.py), for the output its
   scores reach;
3. a Hugging Face `config.json`'s `id2label` (the model's folder; for an ONNX file, the
   folder holding it or the one above, as the Hub lays out `onnx/model.onnx`), for the numeric
   outputs with exactly that many classes.

The entry's file, when set, is the only source. The others are what the model's files say
anyway: where they fit nothing, the model serves without labels.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from snoozeml.config.settings import ModelConfig
from snoozeml.datatypes import ModelMetadata, TensorSpec
from snoozeml.runtime.base import NO_PARAMETERS, Arrays, InputParameters, Instance, Prepare
from snoozeml.runtime.text.settings import read_json

Labels = dict[str, tuple[str, ...]]  # output name -> its classes' labels, by index
# The datatypes with scores to rank (engine/requests/classification.py refuses the others).
_NOT_NUMERIC = frozenset({"BOOL", "BYTES"})


class LabelsError(Exception):
    """The entry's labels file cannot be read, or fits none of the model's outputs."""


def class_count(spec: TensorSpec) -> int | None:
    """Classes per row of an output: its dimensions after the first (all of them for a
    vector), multiplied; None when one of them is dynamic."""
    dims = spec.shape[1:] if len(spec.shape) >= 2 else spec.shape
    return None if any(d < 0 for d in dims) else math.prod(dims)


def fit_file_labels(metadata: ModelMetadata, labels: Sequence[str], source: str) -> Labels:
    """The numeric outputs the entry's labels go to (pure; see the module's rule 1)."""
    numeric = [spec for spec in metadata.outputs if spec.datatype not in _NOT_NUMERIC]
    exact = [spec.name for spec in numeric if class_count(spec) == len(labels)]
    open_ = [spec.name for spec in numeric if class_count(spec) is None]
    names = exact or open_
    if not names:
        counts = ", ".join(f"{spec.name}: {class_count(spec)}" for spec in numeric)
        raise LabelsError(
            f"{source} has {len(labels)} labels, but no output of model {metadata.name!r} "
            f"has {len(labels)} classes ({counts or 'no numeric output'}); an output of shape "
            "[N, C] has C classes")
    return {name: tuple(labels) for name in names}


def fit_found_labels(metadata: ModelMetadata, classifier: Mapping[str, tuple[str, ...]],
                     id2label: tuple[str, ...] | None) -> Labels:
    """The outputs the labels of the model's own files go to (pure; rules 2 and 3): a
    classifier's to its output unless their counts differ, id2label's to the other numeric
    outputs with exactly as many classes."""
    found: Labels = {}
    for spec in metadata.outputs:
        count = class_count(spec)
        own = classifier.get(spec.name)
        if own and count in (None, len(own)):
            found[spec.name] = own
        elif id2label and spec.datatype not in _NOT_NUMERIC and count == len(id2label):
            found[spec.name] = id2label
    return found


def labelled(metadata: ModelMetadata, labels: Mapping[str, tuple[str, ...]]) -> ModelMetadata:
    """`metadata` with each output of `labels` carrying its labels."""
    return replace(metadata, outputs=tuple(
        replace(spec, labels=labels[spec.name]) if spec.name in labels else spec
        for spec in metadata.outputs))


def id2label(config: object) -> tuple[str, ...] | None:
    """A Hugging Face config's `id2label` as labels by index; None unless its keys are
    exactly 0 to n - 1."""
    raw = config.get("id2label") if isinstance(config, dict) else None
    if not isinstance(raw, dict) or not raw:
        return None
    try:
        pairs = {int(key): str(value) for key, value in raw.items()}
    except (TypeError, ValueError):
        return None
    if sorted(pairs) != list(range(len(pairs))):
        return None
    return tuple(pairs[index] for index in range(len(pairs)))


# --- reading the files ------------------------------------------------------------------------


def read_labels_file_blocking(path: Path) -> tuple[str, ...]:
    """One label per line, surrounding blanks and trailing empty lines dropped (an empty line
    inside is a class without a label)."""
    try:
        lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    except OSError as exc:
        raise LabelsError(f"cannot read labels file {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise LabelsError(f"labels file {path} is not UTF-8 text ({exc.reason} at byte "
                          f"{exc.start})") from exc
    while lines and not lines[-1]:
        lines.pop()
    if not lines:
        raise LabelsError(f"labels file {path} has no labels")
    return tuple(lines)


def hub_labels_blocking(path: Path) -> tuple[str, ...] | None:
    """`id2label` of the config.json of a model folder, or beside or above a model file."""
    folders = [path] if path.is_dir() else [path.parent, path.parent.parent]
    for folder in folders:
        config = read_json(folder / "config.json")
        if isinstance(config, dict):
            return id2label(config)
    return None


def find_labels_blocking(spec: ModelConfig, metadata: ModelMetadata) -> Labels:
    """Each output's labels, from the entry's file or else the model's own files. Raises
    LabelsError when the entry's file cannot be read or fits no output."""
    if spec.labels is not None:
        return fit_file_labels(metadata, read_labels_file_blocking(spec.labels), str(spec.labels))
    classifier: Labels = {}
    if spec.format == "onnx" and spec.path.suffix == ".onnx":
        from snoozeml.runtime.onnx.class_labels import classifier_labels_blocking

        classifier = classifier_labels_blocking(spec.path)
    return fit_found_labels(metadata, classifier, hub_labels_blocking(spec.path))


def with_labels_blocking(instance: Instance, spec: ModelConfig) -> Instance:
    """The loaded instance, its metadata naming its outputs' labels when it has any. When the
    entry's labels do not fit, closes the instance and raises LabelsError: the load fails."""
    try:
        found = find_labels_blocking(spec, instance.metadata)
    except BaseException:
        instance.close()
        raise
    if not found:
        return instance
    return LabelledInstance(instance, labelled(instance.metadata, found))


class LabelledInstance:
    """A loaded instance whose metadata carries its outputs' labels; everything else is the
    instance's own (a model without labels is not wrapped)."""

    def __init__(self, inner: Instance, metadata: ModelMetadata) -> None:
        self.inner = inner
        self._metadata = metadata

    @property
    def metadata(self) -> ModelMetadata:
        return self._metadata

    def validate_inputs(self, inputs: Arrays,
                        parameters: InputParameters = NO_PARAMETERS) -> Prepare | None:
        return self.inner.validate_inputs(inputs, parameters)

    def run_blocking(self, inputs: Arrays, outputs: Sequence[str] | None) -> Arrays:
        return self.inner.run_blocking(inputs, outputs)

    def run_batch_blocking(
        self, requests: Sequence[Arrays], outputs: Sequence[str] | None
    ) -> list[Arrays]:
        return self.inner.run_batch_blocking(requests, outputs)

    def upgrade_bytes(self, rows: int) -> int:
        return self.inner.upgrade_bytes(rows)

    def upgrade_blocking(self) -> bool:
        return self.inner.upgrade_blocking()

    def close(self) -> None:
        self.inner.close()
