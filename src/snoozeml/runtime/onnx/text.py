"""ONNX models that take text: an encoder exported from Hugging Face, served with `tokenize = true`.

The graph takes token ids (`input_ids`, `attention_mask`, optionally `token_type_ids`); this
wrapper adds a BYTES input `text`, tokenized here with the model's tokenizer.json, and two
outputs: `embedding` (FP32 [rows, D]) and `token_count` (INT64 [rows], each row's tokens after
truncation, special tokens included). Pooling and normalisation follow
runtime/text/settings.py; what is pooled is decided once, at load (`plan_graph`):

- mean, cls, max, last: the graph's token-level output, `last_hidden_state` or
  `token_embeddings` (the first 3-D float output when neither is there); masked like
  sentence-transformers, padding on the right.
- model: the graph's own pooled output, `sentence_embedding`, else `embedding`, else
  `pooler_output` (a 2-D float output). An entry that leaves `pooling` out gets this too when
  the graph has no token-level output but has one of these.

A graph's own `embedding` or `token_count` output is replaced by this wrapper's. Text requests
of a batch run as one padded batch; each gets its rows, with token-level outputs cut to its own
longest row, exactly as it would be answered alone.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from snoozeml.config.settings import ModelConfig
from snoozeml.datatypes import OIP_TO_NUMPY, ModelMetadata, TensorSpec
from snoozeml.logs import log_event
from snoozeml.runtime.base import (
    NO_PARAMETERS,
    Arrays,
    InputParameters,
    Instance,
    Unsplittable,
)
from snoozeml.runtime.stacking import merge_inputs
from snoozeml.runtime.text.by_length import run_by_length
from snoozeml.runtime.text.settings import (
    Pooling,
    TextSettings,
    UnsupportedLayout,
    read_json,
    text_settings,
    tokenizer_file,
    tokenizer_folder,
)
from snoozeml.runtime.text.tokenizer import (
    TEXT,
    TOKEN_COUNT,
    LengthCheck,
    TokenLimits,
    check_text,
    check_token_ids,
    load_tokenizer,
    token_counts,
    tokenize,
)

EMBEDDING = "embedding"
TOKEN_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
TOKEN_LEVEL_OUTPUTS = ("last_hidden_state", "token_embeddings")
POOLED_OUTPUTS = ("sentence_embedding", "embedding", "pooler_output")
_FLOATS = ("FP32", "FP16", "FP64")


@dataclass(frozen=True, slots=True)
class GraphPlan:
    """What a text model pools: `source` is a graph output, pooled by `pooling`."""

    pooling: Pooling
    source: str
    dimension: int  # the embedding's size; -1 when the graph does not say


def plan_graph(
    inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], pooling: Pooling,
    pooling_set: bool,
) -> GraphPlan:
    """The output to pool for `pooling` (`pooling_set`: the entry chose it, so no fallback to
    the graph's own pooling). RuntimeError, saying why, for a graph text cannot be fed into
    or that has nothing to pool. Pure: the scan uses it too."""
    check_token_inputs(inputs)
    floats = [spec for spec in outputs if spec.datatype in _FLOATS]
    tokens = [spec for spec in floats if len(spec.shape) == 3]
    pooled = {spec.name: spec for spec in floats if len(spec.shape) == 2}
    own = next((pooled[name] for name in POOLED_OUTPUTS if name in pooled), None)
    if pooling != "model":
        token = next((spec for name in TOKEN_LEVEL_OUTPUTS for spec in tokens
                      if spec.name == name), tokens[0] if tokens else None)
        if token is not None:
            return GraphPlan(pooling, token.name, token.shape[-1])
        if own is None or pooling_set:
            raise RuntimeError(
                f"pooling = {pooling!r} needs a token-level output (a 3-D float tensor "
                f"[rows, tokens, hidden], such as last_hidden_state); the graph outputs "
                f"{_shown(outputs)}")
    if own is None:
        raise RuntimeError(f"pooling = \"model\" needs a pooled 2-D float output named one of "
                           f"{list(POOLED_OUTPUTS)}; the graph outputs {_shown(outputs)}")
    return GraphPlan("model", own.name, own.shape[-1])


def check_token_inputs(inputs: Sequence[TensorSpec]) -> None:
    """RuntimeError, saying why, for a graph that text cannot be fed into: one that does not
    take input_ids and attention_mask, or takes more than token ids."""
    names = [spec.name for spec in inputs]
    for needed in ("input_ids", "attention_mask"):
        if needed not in names:
            raise RuntimeError(f"tokenize = true needs a graph that takes {needed!r}; it takes "
                               f"{names}")
    others = [name for name in names if name not in TOKEN_INPUTS]
    if others:
        raise RuntimeError(f"tokenize = true, but the graph also takes {others}, which text "
                           f"cannot provide (only {list(TOKEN_INPUTS)})")


def _shown(specs: Sequence[TensorSpec]) -> str:
    return ", ".join(f"{s.name} {s.datatype} {list(s.shape)}" for s in specs) or "nothing"


def load_text_blocking(spec: ModelConfig, load: Callable[[], Instance],
                       budget: int | None = None) -> OnnxTextInstance:
    """The graph that `load` makes, taking text (a batch's texts in runs by length under
    `budget` padded tokens: runtime/text/by_length.py). The tokenizer and settings are read
    first, so a model without a tokenizer fails before its weights are read."""
    try:
        settings = text_settings(spec)
    except UnsupportedLayout as exc:
        raise RuntimeError(str(exc)) from None
    limits, max_length = token_limits(spec, settings)
    tokenizer = load_tokenizer(tokenizer_file(spec), max_length)
    inner = load()
    try:
        plan = plan_graph(inner.metadata.inputs, inner.metadata.outputs, settings.pooling,
                          spec.pooling is not None)
    except RuntimeError as exc:
        classifies = any(s.name == "logits" for s in inner.metadata.outputs)
        inner.close()
        if classifies:  # a sequence classifier without a config.json that says so
            raise RuntimeError(f"{exc}. A text classifier? Set task = \"text-classification\" "
                               "in the model's entry") from None
        raise
    except BaseException:
        inner.close()
        raise
    log_event("text_model", model=spec.name, pooling=plan.pooling, output=plan.source,
              normalize=settings.normalize, max_length=max_length, settings=settings.source)
    return OnnxTextInstance(inner, tokenizer, settings, max_length, plan, limits, budget)


def token_limits(spec: ModelConfig, settings: TextSettings) -> tuple[TokenLimits, int]:
    """What the Hugging Face config.json beside the tokenizer says the graph takes (token ids
    past it would fail inside onnxruntime, so they are a 400 before queueing), and the
    max_length the settings give, capped at its positions: past them it would fail on every
    request."""
    config = read_json(tokenizer_folder(spec) / "config.json")
    limits = TokenLimits.of(config.get if isinstance(config, dict) else lambda key: None)
    max_length = min(settings.max_length, limits.positions) if limits.positions \
        else settings.max_length
    return limits, max_length


class OnnxTextInstance:
    """An ONNX instance (`inner`) that also takes `text` and pools an `embedding`."""

    def __init__(self, inner: Instance, tokenizer: Any, settings: TextSettings,
                 max_length: int, plan: GraphPlan, limits: TokenLimits,
                 budget: int | None = None) -> None:
        self._inner = inner
        self._budget = budget
        self._tokenizer = tokenizer
        self._lengths = None if settings.truncate else LengthCheck(tokenizer, max_length)
        self._settings = settings
        self._max_length = max_length
        self._plan = plan
        self._limits = limits
        graph = inner.metadata
        self._graph_inputs = {s.name: OIP_TO_NUMPY[s.datatype] for s in graph.inputs}
        # Token-level outputs, cut to each text request's own longest row when split.
        self._per_token = {s.name for s in graph.outputs
                           if len(s.shape) >= 3 and s.shape[1] < 0}
        own = tuple(s for s in graph.outputs if s.name not in (EMBEDDING, TOKEN_COUNT))
        self._graph_outputs = {s.name for s in own}
        self._metadata = ModelMetadata(
            name=graph.name, platform=graph.platform,
            inputs=(*(replace(s, optional=True) for s in graph.inputs),
                    TensorSpec(TEXT, "BYTES", (-1,), True)),
            outputs=(*own, TensorSpec(EMBEDDING, "FP32", (-1, plan.dimension)),
                     TensorSpec(TOKEN_COUNT, "INT64", (-1,))),
            input_sets=((TEXT,), ("input_ids", "attention_mask")),
        )

    @property
    def metadata(self) -> ModelMetadata:
        return self._metadata

    def validate_inputs(self, inputs: Arrays,
                        parameters: InputParameters = NO_PARAMETERS) -> None:
        """Text: a vector of UTF-8 strings (and, with truncate = false, none too long). Token
        ids: shapes that agree, ids the model has, and `token_type_ids` filled with zeros when
        the graph takes them and the request left them out."""
        if TEXT in inputs:
            check_text(inputs, self._lengths)
            return
        check_token_feeds(inputs, self._limits, self._graph_inputs, self._inner)

    def run_blocking(self, inputs: Arrays, outputs: Sequence[str] | None) -> Arrays:
        return self.run_batch_blocking([inputs], outputs)[0]

    def run_batch_blocking(
        self, requests: Sequence[Arrays], outputs: Sequence[str] | None
    ) -> list[Arrays]:
        """Text tokenized, its rows in runs by length (whole when a token-level output is
        wanted); token ids stacked as they are, in one run. Each request gets its own rows
        back."""
        wanted = list(outputs) if outputs else [s.name for s in self._metadata.outputs]
        rows = [_rows(request) for request in requests]
        if TEXT in requests[0]:
            tokenized = tokenize(self._tokenizer, [r[TEXT] for r in requests],
                                 "token_type_ids" in self._graph_inputs)
            feeds, counts, lengths = tokenized.feeds, tokenized.counts, tokenized.lengths
            budget = None if self._per_token.intersection(wanted) else self._budget
            results = run_by_length(feeds, counts, budget,
                                    lambda run: self._run(run, token_counts(run), wanted))
        else:
            feeds = merge_inputs(requests)
            lengths = [int(feeds["input_ids"].shape[1])] * len(requests)
            results = self._run(feeds, token_counts(feeds), wanted)
        if len(requests) == 1:
            return [results]
        return split_token_rows(results, rows, lengths, self._per_token)

    def _run(self, feeds: Arrays, counts: np.ndarray, wanted: Sequence[str]) -> Arrays:
        """The wanted outputs for the whole batch: the graph's, the pooled embedding, the
        token counts. The graph does not run when only token counts are wanted."""
        names = [name for name in wanted if name in self._graph_outputs]
        if EMBEDDING in wanted and self._plan.source not in names:
            names.append(self._plan.source)
        rows = int(feeds["input_ids"].shape[0])
        if rows == 0:
            return {name: self._empty(name) for name in wanted}
        graph: Arrays = {}
        if names:
            graph = self._inner.run_blocking(graph_feeds(feeds, self._graph_inputs), names)
        results: Arrays = {}
        for name in wanted:
            if name == EMBEDDING:
                results[name] = self._embed(graph[self._plan.source], feeds["attention_mask"])
            elif name == TOKEN_COUNT:
                results[name] = counts
            else:
                results[name] = graph[name]
        return results

    def _embed(self, value: np.ndarray, mask: np.ndarray) -> np.ndarray:
        vectors = pool(value, mask, self._plan.pooling)
        if self._settings.normalize:
            norms = np.linalg.norm(vectors, axis=1, keepdims=True)
            vectors = vectors / np.maximum(norms, np.float32(1e-12))
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def _empty(self, name: str) -> np.ndarray:
        return empty_output(self._metadata, name)

    def upgrade_bytes(self, rows: int) -> int:
        return self._inner.upgrade_bytes(rows)

    def upgrade_blocking(self) -> bool:
        return self._inner.upgrade_blocking()

    def close(self) -> None:
        self._inner.close()
        self._tokenizer = None


def graph_feeds(feeds: Arrays, graph_inputs: Mapping[str, Any]) -> Arrays:
    """Token feeds as the graph takes them: its inputs only, in its dtypes, and
    `token_type_ids` as zeros when the graph takes them and the feeds have none."""
    typed = {name: np.asarray(value, dtype=graph_inputs[name])
             for name, value in feeds.items() if name in graph_inputs}
    if "token_type_ids" in graph_inputs and "token_type_ids" not in typed:
        typed["token_type_ids"] = np.zeros(typed["input_ids"].shape,
                                           dtype=graph_inputs["token_type_ids"])
    return typed


def check_token_feeds(inputs: Arrays, limits: TokenLimits, graph_inputs: Mapping[str, Any],
                      inner: Instance) -> None:
    """Token ids as a request sends them: shapes that agree, ids the model has, and
    `token_type_ids` filled with zeros when the graph takes them and the request left them out."""
    check_token_ids(inputs, limits)
    types = graph_inputs.get("token_type_ids")
    if types is not None and "token_type_ids" not in inputs:
        inputs["token_type_ids"] = np.zeros(inputs["input_ids"].shape, dtype=types)
    inner.validate_inputs(inputs)


def split_token_rows(results: Arrays, rows: Sequence[int], lengths: Sequence[int],
                     per_token: Collection[str]) -> list[Arrays]:
    """A batch's outputs back to its requests, each request's rows in turn; outputs named in
    `per_token` are cut to the request's own padded length (its rows were padded to the batch's)."""
    total = sum(rows)
    parts: list[Arrays] = []
    start = 0
    for count, length in zip(rows, lengths, strict=True):
        part: Arrays = {}
        for name, value in results.items():
            if value.ndim == 0 or value.shape[0] != total:
                raise Unsplittable(f"output {name!r} has shape {list(value.shape)}; a batch "
                                   f"of {total} rows needs {total} as its first dimension")
            value = value[start:start + count]
            if name in per_token:
                value = value[:, :length]
            part[name] = np.ascontiguousarray(value)
        parts.append(part)
        start += count
    return parts


def empty_output(metadata: ModelMetadata, name: str) -> np.ndarray:
    """No rows of output `name`: what a batch of empty requests answers without a run."""
    spec = metadata.output(name)
    assert spec is not None  # the engine checked the requested outputs
    return np.zeros((0, *(max(d, 0) for d in spec.shape[1:])),
                    dtype=OIP_TO_NUMPY[spec.datatype])


def pool(value: np.ndarray, mask: np.ndarray, pooling: Pooling) -> np.ndarray:
    """One FP32 vector per row. "model": `value` is pooled already. Otherwise `value` is
    [rows, tokens, hidden] and `mask` [rows, tokens] says which tokens are real, as
    sentence-transformers pools: the mean or max over them, the first token, or the last."""
    hidden = np.asarray(value, dtype=np.float32)
    if pooling == "model":
        return hidden
    if hidden.shape[1] == 0:
        return np.zeros((hidden.shape[0], hidden.shape[2]), dtype=np.float32)
    real = np.asarray(mask) != 0
    pooled: np.ndarray
    if pooling == "cls":
        pooled = hidden[:, 0]
    elif pooling == "last":
        # The last real token wherever the padding is (the index of the last 1 of each row).
        last = real.shape[1] - 1 - np.argmax(real[:, ::-1], axis=1)
        pooled = hidden[np.arange(hidden.shape[0]), last]
    elif pooling == "max":
        pooled = np.where(real[..., None], hidden, np.float32(-1e9)).max(axis=1)
    else:
        weights = real[..., None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1),
                                                             np.float32(1e-9))
    return pooled


def _rows(inputs: Arrays) -> int:
    array = inputs[TEXT] if TEXT in inputs else inputs["input_ids"]
    return int(array.shape[0])
