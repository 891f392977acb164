"""ONNX-ML outputs that are not tensors, served as tensors.

skl2onnx and onnxmltools end a classifier with a ZipMap node by default (`to_onnx(model, X)`,
`convert_lightgbm`, the sklearn pipelines): its output, `output_probability`, is a sequence of
per-row maps from class label to probability, `seq(map(string|int64, tensor(float)))`, which
no OIP datatype holds. The map is a view of a tensor: ZipMap reads the classifier's [N, C] FP32
probabilities, columns in class order, and names each column by its `classlabels_strings` or
`classlabels_int64s` attribute. So at load the graph is rewritten: each ZipMap whose output is a
graph output gives way to an Identity of its input under the same name, declared FP32
[N, C]. The model then serves that tensor, in onnxruntime at the speed of any tensor output (no
Python per row), and the labels stay with the model: runtime/onnx/class_labels.py reads them
from the ZipMap of the model's own file, for the classification extension.

The rewritten model is written to a temporary file and the session created from it (a session
made from bytes keeps them for its life; the file is deleted once the session has loaded). Such
a model takes runtime/onnx/sessions.py's "rewritten" path: never the weights cache, whose
entries are the model's file as it is (tree ensembles, the usual ZipMap models, keep their
trees in node attributes, which the cache does not map anyway).

Any other input or output whose type is not a tensor (a sequence of tensors, a map) has no
faithful tensor form here: the load fails naming it, and the converter option that avoids it.
"""

from __future__ import annotations

import mmap
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from snoozeml.runtime.files import EXTERNAL_SCAN_LIMIT

if TYPE_CHECKING:
    from onnx import GraphProto, ModelProto, NodeProto, TypeProto

ML_DOMAIN = "ai.onnx.ml"
MARK = b"ZipMap"
# Identity exists in every opset; a graph that imports no default-domain opset gets this one.
_DEFAULT_OPSET = 13
# The converter option that keeps a classifier's probabilities a tensor.
ZIPMAP_OFF = ("skl2onnx: to_onnx(model, X, options={'zipmap': False}), or "
              "convert_sklearn(..., options={id(model): {'zipmap': False}}); onnxmltools: "
              "convert_lightgbm(..., zipmap=False)")

S = TypeVar("S")
# Whether a file holds the mark, by its identity: asked at every load plan, read once.
_marked: dict[tuple[str, int, int, int], bool] = {}
_marked_lock = threading.Lock()


class NoTensorForm(RuntimeError):
    """An input or output whose type has no tensor form: the model cannot serve."""


def no_tensor_form(kind: str, name: str, onnx_type: str) -> str:
    """The load failure's words for an `kind` ("input", "output") of a non-tensor type."""
    if onnx_type.startswith("seq(map("):
        how = f"export the model without ZipMap ({ZIPMAP_OFF})"
    elif onnx_type.startswith("seq("):
        how = ("a sequence holds one tensor per target (skl2onnx's MultiOutputClassifier): "
               "export one model per target, each with tensor outputs")
    else:
        how = (f"export the model so that every {kind} is a tensor (a DictVectorizer's map "
               "input: export the pipeline after it and feed its columns)")
    return (f"{kind} {name!r} has type {onnx_type}, which has no OIP datatype and no tensor "
            f"form (SnoozeML serves ZipMap outputs as tensors; this is not one): {how}")


def may_rewrite_blocking(path: Path) -> bool:
    """Whether the model's file names a ZipMap, so that its load takes the rewritten path.
    A file that cannot be read here does not (its load says why), nor, until
    `holds_zipmap_after_all_blocking` read it, one over EXTERNAL_SCAN_LIMIT."""
    return _holds_mark(path, limited=True)


def holds_zipmap_after_all_blocking(path: Path) -> bool:
    """After a load found an output with no tensor form: whether a file the mark check did not
    read (over EXTERNAL_SCAN_LIMIT: a large forest) names a ZipMap after all. Remembered, so
    that its next loads take the rewritten path and its weights are never cached."""
    return _holds_mark(path, limited=False)


def _holds_mark(path: Path, limited: bool) -> bool:
    try:
        stat = path.stat()
        key = (str(path), stat.st_ino, stat.st_size, stat.st_mtime_ns)
        with _marked_lock:
            if key in _marked:
                return _marked[key]
        large = stat.st_size > EXTERNAL_SCAN_LIMIT
        if stat.st_size == 0 or large == limited:
            # Too large for the mark check; or, after a load, read by it already.
            return False
        with path.open("rb") as file, \
                mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as view:
            found = view.find(MARK) != -1
    except (OSError, ValueError):
        return False
    with _marked_lock:
        _marked[key] = found
    return found


def session_blocking(source: Path, make: Callable[[Path], S]) -> S | None:
    """`make`'s session of the model with its ZipMap outputs as tensors, made from a
    temporary file deleted once it has loaded; None when the model has no ZipMap output (or
    its file cannot be parsed here: the usual load says why). Raises NoTensorForm."""
    with tempfile.TemporaryDirectory(prefix="snoozeml-onnx-ml-") as folder:
        target = Path(folder) / "model.onnx"
        try:
            if not write_tensor_form_blocking(source, target):
                return None
        except NoTensorForm:
            raise
        except MemoryError:
            raise
        except Exception:  # not a model onnx can parse: onnxruntime's load will say why
            return None
        return make(target)


def write_tensor_form_blocking(source: Path, target: Path) -> bool:
    """Write `source` to `target` with its ZipMap outputs as tensors; False (nothing written)
    when it has none. Raises NoTensorForm for an input or output with no tensor form."""
    import onnx

    model = onnx.load(str(source))  # external data included: the copy is one file
    if not tensor_form(model):
        return False
    onnx.save(model, str(target))
    return True


def tensor_form(model: ModelProto) -> bool:
    """Rewrite `model` in place: each ZipMap graph output becomes the FP32 [N, C] tensor its
    ZipMap reads, under the same name. Returns whether anything changed. Raises NoTensorForm
    for an input or output left with a type that is not a tensor."""
    graph = model.graph
    changed = False
    for position, node in enumerate(graph.node):
        if _is_zipmap(node) and any(out.name == node.output[0] for out in graph.output):
            _replace(graph, position, node)
            changed = True
    if changed:
        _labels_per_row(graph)
    if changed and not any(item.domain in ("", "ai.onnx") for item in model.opset_import):
        import onnx

        model.opset_import.append(onnx.helper.make_opsetid("", _DEFAULT_OPSET))
    _check_tensors(graph)
    return changed


def served_form(model: ModelProto) -> ModelProto:
    """`model` as the daemon serves it: a rewritten copy when it has ZipMap outputs, else
    itself. Raises NoTensorForm for an input or output with no tensor form (`snooze scan`)."""
    if any(_is_zipmap(node) for node in model.graph.node):
        copy = type(model)()
        copy.CopyFrom(model)
        tensor_form(copy)
        return copy
    _check_tensors(model.graph)
    return model


def _labels_per_row(graph: GraphProto) -> None:
    """A classifier's label output has one label per row, whatever the export declares
    (onnxmltools' LightGBM declares [1]): its first dimension becomes dynamic, so that the
    model batches."""
    from snoozeml.runtime.onnx.class_labels import CLASSIFIERS, reached

    outputs = {value.name: value for value in graph.output}
    for node in graph.node:
        if node.domain == ML_DOMAIN and node.op_type in CLASSIFIERS and node.output:
            for name in reached(graph, node.output[0]):
                if name not in outputs:
                    continue
                dims = outputs[name].type.tensor_type.shape.dim
                if len(dims) == 1 and dims[0].HasField("dim_value"):
                    dims[0].dim_param = "N"


def _is_zipmap(node: NodeProto) -> bool:
    return node.op_type == "ZipMap" and node.domain == ML_DOMAIN and \
        len(node.input) == 1 and len(node.output) == 1


def _replace(graph: GraphProto, position: int, node: NodeProto) -> None:
    import onnx

    name = node.output[0]
    classes = _class_count(node)
    graph.node.remove(node)
    graph.node.insert(position, onnx.helper.make_node(
        "Identity", [node.input[0]], [name], name=f"{node.name or name}_as_tensor"))
    for index, value in enumerate(graph.output):
        if value.name == name:
            graph.output.remove(value)
            graph.output.insert(index, onnx.helper.make_tensor_value_info(
                name, onnx.TensorProto.FLOAT, ["N", classes if classes else None]))
            break


def _class_count(node: NodeProto) -> int:
    for attribute in node.attribute:
        if attribute.name == "classlabels_strings":
            return len(attribute.strings)
        if attribute.name == "classlabels_int64s":
            return len(attribute.ints)
    return 0


def _check_tensors(graph: GraphProto) -> None:
    for kind, values in (("input", graph.input), ("output", graph.output)):
        for value in values:
            if not value.type.HasField("tensor_type"):
                raise NoTensorForm(no_tensor_form(kind, value.name, type_name(value.type)))


def type_name(proto: TypeProto) -> str:
    """A type as onnxruntime writes it: tensor(float), seq(map(string,tensor(float)))."""
    import onnx

    kind = proto.WhichOneof("value")
    if kind in ("tensor_type", "sparse_tensor_type"):
        element = onnx.TensorProto.DataType.Name(getattr(proto, kind).elem_type).lower()
        return f"{'sparse_' if kind == 'sparse_tensor_type' else ''}tensor({element})"
    if kind == "sequence_type":
        return f"seq({type_name(proto.sequence_type.elem_type)})"
    if kind == "map_type":
        key = onnx.TensorProto.DataType.Name(proto.map_type.key_type).lower()
        return f"map({key},{type_name(proto.map_type.value_type)})"
    if kind == "optional_type":
        return f"optional({type_name(proto.optional_type.elem_type)})"
    return str(kind)
