"""What the scan says about a text sequence classifier (a cross-encoder when it has one label).

A sequence classifier with `tokenize = true` takes `text` and `text_pair` over the Open Inference
Protocol; with one label it is a reranker, which the rerank routes serve. A torch folder is one
when its config.json's architectures name a `*ForSequenceClassification`; an ONNX file is one
when the config.json beside (or above) its tokenizer says so, or, with no config.json, when its
graph has a 2-D float `logits` output. Its entry gets `task = "text-classification"` so that it
is served as one wherever the entry is moved. Pure: reads JSON and graph headers only.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from snoozeml.datatypes import TensorSpec
from snoozeml.runtime.onnx.text import check_token_inputs
from snoozeml.runtime.onnx.text_classifier import check_logits_output
from snoozeml.runtime.text.logits import LOGITS
from snoozeml.runtime.text.settings import labels_in, read_json

RERANK_ROUTES = "/v1/rerank, /v2/rerank and /rerank"
_FLOATS = ("FP32", "FP16", "FP64")


def architectures_in(folder: Path) -> list[str]:
    """The architectures config.json in `folder` names (none when it has no such file)."""
    config = read_json(folder / "config.json")
    raw = config.get("architectures") if isinstance(config, dict) else None
    return [a for a in raw if isinstance(a, str)] if isinstance(raw, list) else []


def label_count_in(folder: Path) -> int | None:
    """config.json's labels (as the daemon counts them); None when there is no config.json."""
    config = read_json(folder / "config.json")
    return labels_in(config) if isinstance(config, dict) else None


def serves_as(labels: int | None) -> tuple[str | None, list[str]]:
    """What a classifier that takes text is served as: the role for the command's summary
    (None when it is not a reranker) and the entry's comment lines saying so."""
    pairs = "over OIP it takes text and text_pair (BYTES [N] each) and answers logits"
    if labels == 1:
        role = f"a reranker on {RERANK_ROUTES}"
        return role, [f"{role}: a cross-encoder (one label); {pairs} [N, 1]"]
    if labels is None:
        return None, [f"a text classifier: {pairs}; the rerank routes serve it if it has "
                      "one label"]
    return None, [f"a text classifier with {labels} labels: {pairs} [N, {labels}]; the "
                  "rerank routes serve only a one-label model"]


def onnx_classifier_evidence(folder: Path, outputs: Sequence[TensorSpec]) -> str | None:
    """Why an ONNX graph whose tokenizer is in `folder` is a text classifier, or None when it
    is not one (then it is an embedding model, if it takes text at all)."""
    architectures = architectures_in(folder)
    if architectures:
        classifiers = [a for a in architectures if a.endswith("ForSequenceClassification")]
        return f"config.json names {', '.join(classifiers)}" if classifiers else None
    logits = next((s for s in outputs if s.name == LOGITS), None)
    if logits is not None and logits.datatype in _FLOATS and len(logits.shape) == 2:
        return f"the graph outputs {LOGITS} {logits.datatype} {list(logits.shape)}"
    return None


def onnx_labels(folder: Path, outputs: Sequence[TensorSpec]) -> int | None:
    """config.json's labels, else the `logits` output's fixed width, else None."""
    labels = label_count_in(folder)
    if labels is not None:
        return labels
    logits = next((s for s in outputs if s.name == LOGITS), None)
    width = logits.shape[-1] if logits is not None and logits.shape else -1
    return width if width > 0 else None


def check_classifier_graph(inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> None:
    """RuntimeError, saying why, for a classifier graph the daemon cannot feed text into."""
    check_token_inputs(inputs)
    check_logits_output(outputs)
