"""The class labels an ONNX-ML classifier carries: `classlabels_strings` (or
`classlabels_int64s`) of a LinearClassifier, SVMClassifier or TreeEnsembleClassifier node, for
the graph output its scores (the node's second output) reach, directly or through nodes that
keep the classes in place (Identity, Cast, Normalizer, Softmax); and for a ZipMap output, its
`classlabels_*` attribute, which names its columns in order (runtime/onnx/ml_outputs.py serves
that output as the [N, C] tensor the ZipMap reads).

Read once per load, and only from a file that holds the bytes "classlabels_": onnx (a heavy
import) parses nothing else.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from snoozeml.runtime.files import EXTERNAL_SCAN_LIMIT

if TYPE_CHECKING:
    from onnx import GraphProto, NodeProto

ML_DOMAIN = "ai.onnx.ml"
CLASSIFIERS = frozenset({"LinearClassifier", "SVMClassifier", "TreeEnsembleClassifier"})
# Nodes whose output holds the same classes, in the same order, as their first input.
KEEPS_CLASSES = frozenset({"Identity", "Cast", "Normalizer", "Softmax"})
_MARK = b"classlabels_"


def classifier_labels_blocking(path: Path) -> dict[str, tuple[str, ...]]:
    """Graph output name -> its classes' labels, for each output a classifier's scores
    reach; empty for a model without one. Labels are an extra: a file that cannot be read
    here (it loaded in onnxruntime) has none, and the model serves without them."""
    try:
        if path.stat().st_size > EXTERNAL_SCAN_LIMIT or not _holds_mark(path):
            return {}
        import onnx  # heavy: only for a file that names class labels

        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception:  # labels are optional; the load itself has succeeded
        return {}
    return graph_labels(graph)


def graph_labels(graph: GraphProto) -> dict[str, tuple[str, ...]]:
    """What `classifier_labels_blocking` finds, from a parsed graph."""
    outputs = {value.name for value in graph.output}
    found: dict[str, tuple[str, ...]] = {}
    for node in graph.node:
        if node.domain == ML_DOMAIN and node.op_type == "ZipMap" and node.output and \
                node.output[0] in outputs and _labels(node):
            found[node.output[0]] = _labels(node)
            continue
        if node.domain != ML_DOMAIN or node.op_type not in CLASSIFIERS or len(node.output) < 2:
            continue
        labels = _labels(node)
        if labels:
            found.update((name, labels) for name in reached(graph, node.output[1])
                         if name in outputs)
    return found


def _labels(node: NodeProto) -> tuple[str, ...]:
    for attribute in node.attribute:
        if attribute.name == "classlabels_strings":
            return tuple(value.decode("utf-8", "replace") for value in attribute.strings)
        if attribute.name == "classlabels_int64s":
            return tuple(str(value) for value in attribute.ints)
    return ()


def reached(graph: GraphProto, start: str) -> Iterator[str]:
    """`start` and every value the nodes that keep classes make of it, transitively."""
    seen = {start}
    pending = [start]
    while pending:
        name = pending.pop()
        yield name
        for node in graph.node:
            keeps = node.op_type in KEEPS_CLASSES and node.input and node.output
            if keeps and node.input[0] == name and node.output[0] not in seen:
                seen.add(node.output[0])
                pending.append(node.output[0])


def _holds_mark(path: Path) -> bool:
    with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as view:
        return view.find(_MARK) != -1
