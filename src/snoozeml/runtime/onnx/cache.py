"""A load-ready copy of an ONNX model's weights, made once, mapped at every load after it.

onnxruntime's default load copies every weight out of the protobuf, then pre-packs MatMul/Gemm
weights into a second copy: 2x the model's memory at the peak and ~3 ms per MiB on this machine.
An entry of this cache holds the model's graph with its large main-graph initializers moved into
one file of raw little-endian tensors, each at an aligned offset. A load maps that file read-only
and hands onnxruntime each tensor in place (`SessionOptions.add_initializer`): no copy, no parse
of the weights, and pages the kernel may drop and read back instead of swapping.

Entry layout, under `<cache_dir>/<key>/`: `graph.onnx`, `weights.bin` and `manifest.json`,
written last. The key hashes the model file's identity (path, device, inode, size, mtime) and
the onnxruntime version, so a changed model file or another onnxruntime version never finds an
old entry. The manifest records the external data files too (their identity is checked at
every lookup) and a CRC-32 of both files, checked at the first use of an entry in each process.

Safe to share: an entry is built in a private temporary folder and renamed into place, so a
reader sees a whole entry or none; when two builders race, one rename wins and the other uses
the winner's entry. A bad entry is moved aside and deleted, never rewritten in place (a file
that is mapped elsewhere may be unlinked, never truncated: that would crash its readers).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import threading
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime as ort

from snoozeml.logs import log_event
from snoozeml.runtime.files import external_data_paths
from snoozeml.runtime.onnx.cache_entry import GRAPH, STORAGE, WEIGHTS, Entry, Slot
from snoozeml.runtime.onnx.mapped import MappedWeights
from snoozeml.runtime.onnx.split import SplitError, split_blocking

if TYPE_CHECKING:
    from onnx import ModelProto

FORMAT = 1
MANIFEST = "manifest.json"
MIN_MAPPED = 1024  # bytes: smaller tensors stay in the graph, where they cost nothing to load
ALIGN = 4096  # every mapped tensor starts on a page: aligned for any kernel, and for madvise


class CacheError(Exception):
    """An entry that cannot be used: missing, stale, foreign, corrupt or half-written."""


# --- identity ---------------------------------------------------------------------------------


def _identity(path: Path) -> dict[str, Any]:
    stat = path.stat()
    return {"path": str(path.resolve()), "dev": stat.st_dev, "ino": stat.st_ino,
            "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def entry_key(model: Path) -> str:
    """The folder name of `model`'s entry: changes with the file and with onnxruntime."""
    text = json.dumps([FORMAT, ort.__version__, _identity(model)], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


# --- lookup -----------------------------------------------------------------------------------

# Entries whose checksums this process has verified, by the identity of their weights file: a
# rehydration maps a verified entry without reading it through again.
_verified: set[tuple[str, int, int, int]] = set()
_verified_lock = threading.Lock()


def find_blocking(cache_dir: Path, model: Path, *, verify: bool = True) -> Entry:
    """The valid entry for `model`; raises CacheError saying why there is none. With `verify`,
    an entry first used by this process has its checksums read through."""
    folder = cache_dir / entry_key(model)
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CacheError("no entry yet") from None
    except (OSError, ValueError) as exc:
        raise CacheError(f"unreadable manifest: {exc}") from exc
    try:
        entry = _check_manifest(folder, model, manifest)
        if verify:
            _verify(entry, manifest)
    except (KeyError, TypeError, ValueError) as exc:
        raise CacheError(f"malformed entry: {exc}") from exc
    except OSError as exc:  # a file missing, or moved away by another process meanwhile
        raise CacheError(f"unreadable entry: {exc}") from exc
    return entry


def _check_manifest(folder: Path, model: Path, manifest: dict[str, Any]) -> Entry:
    if manifest.get("format") != FORMAT:
        raise CacheError(f"entry format {manifest.get('format')!r}, not {FORMAT}")
    if manifest.get("onnxruntime") != ort.__version__:
        raise CacheError(f"written by onnxruntime {manifest.get('onnxruntime')}, "
                         f"not {ort.__version__}")
    if manifest["source"] != _identity(model):
        raise CacheError("the model file changed")
    for recorded in manifest["externals"]:
        try:
            current = _identity(Path(recorded["path"]))
        except OSError as exc:
            raise CacheError(f"external data {recorded['path']}: {exc.strerror}") from exc
        if current != recorded:
            raise CacheError(f"external data {recorded['path']} changed")
    graph_bytes = (folder / GRAPH).stat().st_size
    weights_bytes = (folder / WEIGHTS).stat().st_size
    if graph_bytes != manifest["graph"]["size"] or weights_bytes != manifest["weights"]["size"]:
        raise CacheError("a file of the entry has the wrong size (half-written or truncated)")
    slots = _slots(manifest)
    for slot in slots:
        if slot.offset < 0 or slot.offset + slot.length > weights_bytes:
            raise CacheError(f"tensor {slot.name!r} lies outside weights.bin")
    return Entry(folder, slots, weights_bytes, graph_bytes)


def _slots(manifest: dict[str, Any]) -> tuple[Slot, ...]:
    """The manifest's tensor table."""
    return tuple(Slot(t["name"], int(t["type"]), tuple(t["shape"]), int(t["offset"]),
                      int(t["length"]), bool(t["packed"])) for t in manifest["tensors"])


def _weights_identity(entry: Entry) -> tuple[str, int, int, int]:
    stat = entry.weights.stat()
    return (str(entry.folder), stat.st_ino, stat.st_size, stat.st_mtime_ns)


def _verify(entry: Entry, manifest: dict[str, Any]) -> None:
    identity = _weights_identity(entry)
    with _verified_lock:
        if identity in _verified:
            return
    if _crc_file(entry.graph) != manifest["graph"]["crc32"]:
        raise CacheError("graph.onnx does not match its checksum")
    if _crc_file(entry.weights) != manifest["weights"]["crc32"]:
        raise CacheError("weights.bin does not match its checksum")
    with _verified_lock:
        _verified.add(identity)


def _crc_file(path: Path) -> int:
    crc = 0
    with path.open("rb") as file:
        while chunk := file.read(1 << 22):
            crc = zlib.crc32(chunk, crc)
    return crc


# --- building ---------------------------------------------------------------------------------


def build_blocking(cache_dir: Path, model: Path) -> Entry:
    """Write `model`'s entry (replacing a bad one) and return it; returns the entry another
    builder put in place first when one raced this one."""
    folder = cache_dir / entry_key(model)
    cache_dir.mkdir(parents=True, exist_ok=True)
    source = _identity(model)
    temporary = cache_dir / f".{folder.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp"
    temporary.mkdir()
    try:
        manifest = _write(model, temporary)
        if _identity(model) != source:
            raise CacheError("the model file changed while it was read")
        manifest.update(format=FORMAT, onnxruntime=ort.__version__, source=source,
                        optimized=_optimize(temporary, manifest))
        (temporary / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
        ours = _put_in_place(temporary, folder, model)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    _forget_others(cache_dir, folder.name, str(source["path"]))
    if not ours:  # another builder's entry, verified by _put_in_place
        return find_blocking(cache_dir, model)
    entry = find_blocking(cache_dir, model, verify=False)
    with _verified_lock:  # its checksums were computed from the bytes just written
        _verified.add(_weights_identity(entry))
    return entry


def _write(model: Path, folder: Path) -> dict[str, Any]:
    """graph.onnx and weights.bin in `folder`; the manifest's tensors, files and checksums."""
    import onnx

    itemsizes = {kind: np.dtype(name).itemsize for kind, name in STORAGE.items()}
    try:
        moved, crc, externals = split_blocking(model, folder / GRAPH, folder / WEIGHTS,
                                               itemsizes, ALIGN, MIN_MAPPED)
    except SplitError as exc:
        raise CacheError(f"cannot split the model: {exc}") from exc
    graph = onnx.load(str(folder / GRAPH), load_external_data=False)  # small: weights moved
    left = external_data_paths(graph, folder) - {(folder / WEIGHTS).resolve()}
    if left:
        raise CacheError(f"tensors outside the main graph's initializers are in external "
                         f"data ({', '.join(sorted(p.name for p in left))})")
    packed = _packed_by_cpu_provider(graph)
    return {
        "tensors": [{"name": m.name, "type": m.data_type, "shape": list(m.shape),
                     "offset": m.offset, "length": m.length, "packed": m.name in packed}
                    for m in moved],
        "weights": {"size": (folder / WEIGHTS).stat().st_size, "crc32": crc},
        "graph": {"size": (folder / GRAPH).stat().st_size, "crc32": _crc_file(folder / GRAPH)},
        "externals": [_identity(path) for path in externals],
    }


def _optimize(folder: Path, manifest: dict[str, Any]) -> bool:
    """Replace the entry's graph by onnxruntime's optimized one, and its weights by that
    graph's (fused ones included), split again; update `manifest`. Returns whether it did:
    when onnxruntime cannot save the model optimized, the entry keeps the graph as written.

    A session still optimizes the graph at load, but most of the work is done: MiniLM's
    export (685 nodes, 350 optimized) maps in 25 ms instead of 56 ms. The level saved is
    ORT_ENABLE_EXTENDED: fusions that hold on any CPU. The layout changes of ORT_ENABLE_ALL,
    which depend on the machine's instruction set, are left to each load."""
    work = folder / "optimized"
    final = folder / "final"
    entry = Entry(folder, _slots(manifest), manifest["weights"]["size"],
                  manifest["graph"]["size"])
    try:
        work.mkdir()
        final.mkdir()
        weights = MappedWeights(entry)
        try:
            options = ort.SessionOptions()
            options.intra_op_num_threads = 1
            options.log_severity_level = 4
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
            options.add_session_config_entry("session.disable_prepacking", "1")
            options.optimized_model_filepath = str(work / GRAPH)
            options.add_session_config_entry(
                "session.optimized_model_external_initializers_file_name", "optimized.data")
            options.add_session_config_entry(
                "session.optimized_model_external_initializers_min_size_in_bytes",
                str(MIN_MAPPED))
            weights.add_to(options)
            session = ort.InferenceSession(str(folder / GRAPH), options,
                                           providers=["CPUExecutionProvider"])
            del session, options
        finally:
            weights.close()
        split = _write(work / GRAPH, final)
    except Exception as exc:  # an op onnxruntime cannot save, a full disk: keep the graph
        log_event("onnx_cache_unoptimized", logging.INFO, folder=str(folder),
                  error=f"{type(exc).__name__}: {exc}")
        shutil.rmtree(final, ignore_errors=True)
        return False
    finally:
        shutil.rmtree(work, ignore_errors=True)
    os.replace(final / GRAPH, folder / GRAPH)
    os.replace(final / WEIGHTS, folder / WEIGHTS)
    shutil.rmtree(final, ignore_errors=True)
    manifest.update(tensors=split["tensors"], weights=split["weights"], graph=split["graph"])
    return True


def _put_in_place(temporary: Path, folder: Path, model: Path) -> bool:
    """Rename the new entry into place; True when it is ours that is there now. An entry
    already in place is kept when valid (another builder won the race), else replaced."""
    for _ in range(2):
        try:
            temporary.rename(folder)
            return True
        except OSError:
            pass
        try:
            find_blocking(folder.parent, model)
            return False
        except CacheError:
            _move_aside(folder)
    raise CacheError(f"could not put the entry in place at {folder}")


# (domain, op) whose input 1, a constant 2-D FP32 weight, onnxruntime's CPU kernels pre-pack
# (MLAS SGEMM) and then never read again; the Fused* ones are what its optimizer makes of
# MatMul/Gemm with an activation (FusedGemm and FusedMatMul derive from Gemm and MatMul).
_PACKED_B = {("", "MatMul"), ("", "Gemm"), ("ai.onnx", "MatMul"), ("ai.onnx", "Gemm"),
             ("com.microsoft", "FusedMatMul"), ("com.microsoft", "FusedGemm")}


def _packed_by_cpu_provider(proto: ModelProto) -> set[str]:
    """Initializers that a pre-packing session copies and then never reads again: 2-D float32
    weights used only as the B input of the ops in _PACKED_B, in the main graph. Anything else
    may be read at every run (tests/unit/runtime/onnx/test_instance.py checks this through
    smaps)."""
    candidates = {t.name for t in proto.graph.initializer
                  if t.data_type == 1 and len(t.dims) == 2}
    for node, graph_level in _all_nodes(proto):
        for position, name in enumerate(node.input):
            if name in candidates and not (
                graph_level and (node.domain, node.op_type) in _PACKED_B and position == 1
            ):
                candidates.discard(name)
    return candidates


def _all_nodes(proto: ModelProto) -> Iterator[tuple[Any, bool]]:
    """Every node, with whether it is in the main graph (a subgraph may read outer names)."""
    for node in proto.graph.node:
        yield node, True
        for attribute in node.attribute:
            for graph in ([attribute.g] if attribute.HasField("g") else []) + list(
                    attribute.graphs):
                yield from _subgraph_nodes(graph)
    for function in proto.functions:
        for node in function.node:
            yield node, False


def _subgraph_nodes(graph: Any) -> Iterator[tuple[Any, bool]]:
    for node in graph.node:
        yield node, False
        for attribute in node.attribute:
            for inner in ([attribute.g] if attribute.HasField("g") else []) + list(
                    attribute.graphs):
                yield from _subgraph_nodes(inner)


def _move_aside(folder: Path) -> None:
    """Take a bad (or stale-format) entry out of the way without touching its files' bytes:
    another process may have them mapped."""
    if not folder.exists():
        return
    trash = folder.with_name(f".{folder.name}.{uuid.uuid4().hex}.old")
    with contextlib.suppress(OSError):  # someone else moved it first
        folder.rename(trash)
    shutil.rmtree(trash, ignore_errors=True)


def _forget_others(cache_dir: Path, keep: str, source: str) -> None:
    """Delete the entries of earlier versions of the same model file: nothing finds them any
    more. (A process still mapping one keeps its pages: unlinked files stay readable.)"""
    for manifest in cache_dir.glob(f"*/{MANIFEST}"):
        if manifest.parent.name == keep:
            continue
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            if json.loads(manifest.read_text(encoding="utf-8"))["source"]["path"] == source:
                _move_aside(manifest.parent)


def iter_entries(cache_dir: Path) -> Iterator[Path]:
    """The entry folders under `cache_dir` (for tools and tests)."""
    return (manifest.parent for manifest in cache_dir.glob(f"*/{MANIFEST}"))
