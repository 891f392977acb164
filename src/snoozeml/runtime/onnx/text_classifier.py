"""ONNX text classifiers that take text: a cross-encoder (or any sequence classifier) exported
from Hugging Face, served with `tokenize = true`.

An ONNX text model is one when its entry's `task` is "text-classification", else when the
config.json beside (or above) its tokenizer names a `*ForSequenceClassification` architecture,
as Hugging Face exports carry it (runtime/text/settings.py's `text_task`); any other is an
embedding model (runtime/onnx/text.py). The graph takes token ids (`input_ids`,
`attention_mask`, optionally `token_type_ids`) and has a 2-D float output `logits`
[rows, labels]. This wrapper adds the BYTES inputs `text` and `text_pair`, tokenized here one
text or one pair per row (runtime/text/tokenizer.py, runtime/text/pairs.py), and refuses logits
that are not finite (runtime/text/logits.py: at load, and for every batch). Its outputs are the
graph's own, and `token_count` (INT64 [rows], each row's tokens after truncation, special
tokens included; what the rerank routes report as usage). The rows of a batch run sorted by
length (runtime/text/by_length.py); each request gets its own rows, any token-level output cut
to its own longest row, as it would be answered alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from snoozeml.config.settings import ModelConfig
from snoozeml.datatypes import OIP_TO_NUMPY, ModelMetadata, TensorSpec
from snoozeml.errors import InvalidInput
from snoozeml.logs import log_event
from snoozeml.runtime.base import NO_PARAMETERS, Arrays, InputParameters, Instance, Prepare
from snoozeml.runtime.onnx.text import (
    check_token_feeds,
    check_token_inputs,
    empty_output,
    graph_feeds,
    split_token_rows,
    token_limits,
)
from snoozeml.runtime.stacking import merge_inputs
from snoozeml.runtime.text.by_length import run_by_length
from snoozeml.runtime.text.logits import LOGITS, check_logits, probe_blocking
from snoozeml.runtime.text.pairs import TextPairs
from snoozeml.runtime.text.settings import text_settings, tokenizer_file
from snoozeml.runtime.text.tokenizer import (
    TEXT,
    TEXT_PAIR,
    TOKEN_COUNT,
    LengthCheck,
    TokenLimits,
    check_text,
    load_tokenizer,
    token_counts,
    tokenize,
)

_FLOATS = ("FP32", "FP16", "FP64")


def check_logits_output(outputs: Sequence[TensorSpec]) -> None:
    """RuntimeError, saying what the graph has, when it has no 2-D float `logits` output."""
    found = next((spec for spec in outputs if spec.name == LOGITS), None)
    if found is None or found.datatype not in _FLOATS or len(found.shape) != 2:
        shown = ", ".join(f"{s.name} {s.datatype} {list(s.shape)}" for s in outputs)
        raise RuntimeError("a text classifier (task \"text-classification\") needs a graph "
                           f"output 'logits', a 2-D float tensor [rows, labels]; the graph "
                           f"outputs {shown or 'nothing'}")


def load_text_classifier_blocking(
    spec: ModelConfig, load: Callable[[], Instance], budget: int | None = None
) -> OnnxTextClassifier:
    """The graph that `load` makes, taking text and text pairs (a batch's rows in runs by
    length under `budget` padded tokens: runtime/text/by_length.py). The tokenizer is read first,
    so a model without one fails before its weights are read; a graph whose logits are not
    finite for a short pair fails the load."""
    settings = text_settings(spec, pooled=False)
    limits, max_length = token_limits(spec, settings)
    tokenizer = load_tokenizer(tokenizer_file(spec), max_length)
    pairs = TextPairs(tokenizer, max_length, settings.truncate, settings.truncate_query)
    lengths = None if settings.truncate else LengthCheck(tokenizer, max_length)
    inner = load()
    try:
        check_token_inputs(inner.metadata.inputs)
        check_logits_output(inner.metadata.outputs)
        instance = OnnxTextClassifier(inner, tokenizer, pairs, lengths, limits, budget)
        probe_blocking(instance)
    except BaseException:
        inner.close()
        raise
    log_event("text_classifier", model=spec.name, max_length=max_length,
              truncate=settings.truncate, truncate_query=settings.truncate_query)
    return instance


class OnnxTextClassifier:
    """An ONNX instance (`inner`) that also takes `text`, and `text_pair` beside it."""

    def __init__(self, inner: Instance, tokenizer: Any, pairs: TextPairs,
                 lengths: LengthCheck | None, limits: TokenLimits,
                 budget: int | None = None) -> None:
        self._inner = inner
        self._budget = budget
        self._tokenizer = tokenizer
        self._pairs = pairs
        self._lengths = lengths
        self._limits = limits
        graph = inner.metadata
        self._graph_inputs = {s.name: OIP_TO_NUMPY[s.datatype] for s in graph.inputs}
        # Token-level outputs, cut to each request's own longest row when split.
        self._per_token = {s.name for s in graph.outputs
                           if len(s.shape) >= 3 and s.shape[1] < 0}
        self._metadata = ModelMetadata(
            name=graph.name, platform=graph.platform,
            inputs=(*(replace(s, optional=True) for s in graph.inputs),
                    TensorSpec(TEXT, "BYTES", (-1,), True),
                    TensorSpec(TEXT_PAIR, "BYTES", (-1,), True)),
            outputs=(*(s for s in graph.outputs if s.name != TOKEN_COUNT),
                     TensorSpec(TOKEN_COUNT, "INT64", (-1,))),
            input_sets=((TEXT,), ("input_ids", "attention_mask")),
        )
        self._graph_outputs = {s.name for s in graph.outputs if s.name != TOKEN_COUNT}

    @property
    def metadata(self) -> ModelMetadata:
        return self._metadata

    def validate_inputs(self, inputs: Arrays,
                        parameters: InputParameters = NO_PARAMETERS) -> Prepare | None:
        """Text: a vector of UTF-8 strings, and a `text_pair` of as many when sent (with
        truncate = false, none too long; with `max_tokens`, the step that cuts them). Token
        ids: shapes that agree, ids the model has, and `token_type_ids` filled with zeros when
        the graph takes them and the request left them out."""
        if TEXT in inputs:
            check_text(inputs, self._lengths)
            return self._pairs.check(inputs, parameters)
        if TEXT_PAIR in inputs:
            raise InvalidInput("input 'text_pair' goes with 'text', one pair per row")
        check_token_feeds(inputs, self._limits, self._graph_inputs, self._inner)
        return None

    def run_blocking(self, inputs: Arrays, outputs: Sequence[str] | None) -> Arrays:
        return self.run_batch_blocking([inputs], outputs)[0]

    def run_batch_blocking(
        self, requests: Sequence[Arrays], outputs: Sequence[str] | None
    ) -> list[Arrays]:
        """Texts or pairs tokenized, their rows in runs by length (whole when a token-level
        output is wanted); token ids stacked as they are, in one run. Each request gets its own
        rows back."""
        wanted = list(outputs) if outputs else [s.name for s in self._metadata.outputs]
        types = "token_type_ids" in self._graph_inputs
        if TEXT in requests[0]:
            tokenized = self._pairs.tokenize(requests, types) if TEXT_PAIR in requests[0] \
                else tokenize(self._tokenizer, [r[TEXT] for r in requests], types)
            feeds, lengths = tokenized.feeds, tokenized.lengths
            budget = None if self._per_token.intersection(wanted) else self._budget
            results = run_by_length(feeds, tokenized.counts, budget,
                                    lambda run: self._run(run, wanted))
        else:
            feeds = merge_inputs(requests)
            lengths = [int(feeds["input_ids"].shape[1])] * len(requests)
            results = self._run(feeds, wanted)
        if len(requests) == 1:
            return [results]
        rows = [int((r[TEXT] if TEXT in r else r["input_ids"]).shape[0]) for r in requests]
        return self._split(results, rows, lengths)

    def _run(self, feeds: Arrays, wanted: Sequence[str]) -> Arrays:
        """The wanted outputs for the whole batch: the graph's, its logits checked, and each
        row's tokens. The graph does not run when only token counts are wanted."""
        if int(feeds["input_ids"].shape[0]) == 0:
            return {name: self._empty(name) for name in wanted}
        names = [name for name in wanted if name in self._graph_outputs]
        results: Arrays = {}
        if names:
            results = self._inner.run_blocking(graph_feeds(feeds, self._graph_inputs), names)
        if LOGITS in results:
            check_logits(results[LOGITS], self._metadata.name)
        if TOKEN_COUNT in wanted:
            results[TOKEN_COUNT] = token_counts(feeds)
        return results

    def _split(self, results: Arrays, rows: Sequence[int], lengths: Sequence[int]) -> list[Arrays]:
        return split_token_rows(results, rows, lengths, self._per_token)

    def _empty(self, name: str) -> np.ndarray:
        return empty_output(self._metadata, name)

    def upgrade_bytes(self, rows: int) -> int:
        return self._inner.upgrade_bytes(rows)

    def upgrade_blocking(self) -> bool:
        return self._inner.upgrade_blocking()

    def close(self) -> None:
        self._inner.close()
        self._tokenizer = None
