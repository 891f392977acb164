"""Hugging Face folders (`config.json` and safetensors weights) through `transformers`.

A feature-extraction model serves `last_hidden_state`, a pooled `embedding` (pooled and
normalised as runtime/text/settings.py resolves) and each row's `token_count`; classification
models serve `logits` (and `token_count` when they tokenize). With `tokenize = true` and a
tokenizer.json, a model also takes a BYTES input `text` (one string per row), tokenized here
(runtime/text/tokenizer.py), and a text classifier (a cross-encoder) a `text_pair` beside it,
each row's two texts tokenized as one pair (runtime/text/pairs.py); its logits must be finite
(runtime/text/logits.py). Text rows run sorted by length (runtime/text/by_length.py), others
padded to the batch's longest, and each request gets its outputs trimmed to its own token length,
so a batched request answers exactly as it would alone.
"""

from __future__ import annotations

import json
import logging
import mmap
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from snoozeml.config.settings import ModelConfig
from snoozeml.datatypes import ModelMetadata, TensorSpec
from snoozeml.errors import InvalidInput
from snoozeml.heap import drop_attribute_blocking
from snoozeml.logs import log_event
from snoozeml.runtime.base import NO_PARAMETERS, Arrays, InputParameters, Prepare
from snoozeml.runtime.text.by_length import default_budget, run_by_length
from snoozeml.runtime.text.logits import LOGITS, check_logits, probe_blocking
from snoozeml.runtime.text.pairs import TextPairs
from snoozeml.runtime.text.settings import (
    UnsupportedLayout,
    task_of,
    text_settings,
    tokenizer_file,
)
from snoozeml.runtime.text.tokenizer import (
    TEXT,
    TEXT_PAIR,
    TOKEN_COUNT,
    LengthCheck,
    Tokenized,
    TokenLimits,
    check_text,
    check_token_ids,
    load_tokenizer,
    token_counts,
    tokenize,
)
from snoozeml.runtime.torch.env import DTYPES, PLATFORM, dtype_key, require, torch_device
from snoozeml.runtime.torch.hf_weights import NotMappable, load_mapped

_AUTO_CLASSES = {
    "feature-extraction": "AutoModel",
    "text-classification": "AutoModelForSequenceClassification",
    "image-classification": "AutoModelForImageClassification",
}


def model_class(folder: Path, task: str | None) -> tuple[str, Any, Any]:
    """The task, the transformers class and a fresh config for a folder; importing the class's
    module is what costs memory for good, so `prepare_blocking` calls this before the load is
    measured."""
    transformers = require("transformers")
    try:
        raw = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise RuntimeError(f"{folder / 'config.json'} is not valid JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise RuntimeError(f"{folder / 'config.json'} is not a JSON object")
    task = task or task_of(raw)
    config = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True)
    auto = getattr(transformers, _AUTO_CLASSES[task])
    try:
        cls = auto._model_mapping[type(config)]
    except KeyError:
        raise RuntimeError(
            f"transformers has no {_AUTO_CLASSES[task]} for model type "
            f"{config.model_type!r} (task {task!r})"
        ) from None
    return task, cls, config


class HuggingFaceInstance:
    """A transformers model on its device, with its tokenizer when it takes text."""

    def __init__(self, spec: ModelConfig) -> None:
        folder = spec.path
        self.name = spec.name
        self.task, cls, config = model_class(folder, spec.task)
        self.device = torch_device(spec.device)
        # Padded tokens per run of a batch's text rows, sorted by length.
        self._budget = spec.batching.max_batch_tokens or default_budget(self.device.type)
        model = _load_weights(spec, cls, config)
        self.model = model.to(self.device).eval()
        _page_in(self.model)
        try:
            settings = text_settings(spec, pooled=self.task == "feature-extraction")
        except UnsupportedLayout as exc:
            raise RuntimeError(str(exc)) from None
        self.pooling = settings.pooling
        self.normalize = settings.normalize
        if self.task == "feature-extraction" and self.pooling == "model" \
                and getattr(self.model, "pooler", None) is None:
            raise RuntimeError(f"pooling = \"model\" but {type(self.model).__name__} has no "
                               "pooler of its own (pooler_output)")
        self._limits = TokenLimits.of(lambda key: getattr(self.model.config, key, None))
        # Never more tokens than the model has positions: past them it fails on every request.
        positions = self._limits.positions
        self.max_length = min(settings.max_length, positions) if positions > 0 \
            else settings.max_length
        self.tokenizer: Any = None
        self._lengths: LengthCheck | None = None
        self._pairs: TextPairs | None = None
        if spec.tokenize:
            self.tokenizer = load_tokenizer(tokenizer_file(spec), self.max_length)
            if not settings.truncate:
                self._lengths = LengthCheck(self.tokenizer, self.max_length)
            if self.task == "text-classification":
                self._pairs = TextPairs(self.tokenizer, self.max_length, settings.truncate,
                                        settings.truncate_query)
        if self.task == "feature-extraction":
            log_event("text_model", model=spec.name, pooling=self.pooling,
                      output="pooler_output" if self.pooling == "model" else "last_hidden_state",
                      normalize=self.normalize, max_length=self.max_length,
                      settings=settings.source)
        self._metadata = self._describe(spec.name)
        if self._pairs is not None:
            probe_blocking(self)
            log_event("text_classifier", model=spec.name, max_length=self.max_length,
                      truncate=settings.truncate, truncate_query=settings.truncate_query)

    def _describe(self, name: str) -> ModelMetadata:
        hidden = int(getattr(self.model.config, "hidden_size", -1) or -1)
        inputs: list[TensorSpec] = []
        outputs: list[TensorSpec] = []
        if self.task == "image-classification":
            channels = int(getattr(self.model.config, "num_channels", 3))
            size = getattr(self.model.config, "image_size", -1)
            side = int(size if isinstance(size, int) else -1)
            inputs.append(TensorSpec("pixel_values", "FP32", (-1, channels, side, side)))
        else:
            optional = self.tokenizer is not None
            inputs.append(TensorSpec("input_ids", "INT64", (-1, -1), optional))
            inputs.append(TensorSpec("attention_mask", "INT64", (-1, -1), optional))
            if self._takes_token_types():
                inputs.append(TensorSpec("token_type_ids", "INT64", (-1, -1), True))
            if optional:
                inputs.append(TensorSpec(TEXT, "BYTES", (-1,), True))
            if self._pairs is not None:
                inputs.append(TensorSpec(TEXT_PAIR, "BYTES", (-1,), True))
        if self.task == "feature-extraction":
            outputs.append(TensorSpec("last_hidden_state", "FP32", (-1, -1, hidden)))
            outputs.append(TensorSpec("embedding", "FP32", (-1, hidden)))
            outputs.append(TensorSpec(TOKEN_COUNT, "INT64", (-1,)))
        else:
            labels = int(getattr(self.model.config, "num_labels", -1))
            outputs.append(TensorSpec(LOGITS, "FP32", (-1, labels)))
            if self._counts_tokens():
                outputs.append(TensorSpec(TOKEN_COUNT, "INT64", (-1,)))
        sets: tuple[tuple[str, ...], ...] = ()
        if self.tokenizer is not None:
            sets = (("text",), ("input_ids", "attention_mask"))
        return ModelMetadata(name, PLATFORM, tuple(inputs), tuple(outputs), sets)

    def _counts_tokens(self) -> bool:
        """Whether the model answers each row's `token_count`: an encoder, or a text classifier
        that tokenizes."""
        return self.task == "feature-extraction" or (
            self.task == "text-classification" and self.tokenizer is not None)

    def _takes_token_types(self) -> bool:
        return int(getattr(self.model.config, "type_vocab_size", 0) or 0) > 0

    @property
    def metadata(self) -> ModelMetadata:
        return self._metadata

    # --- checks before queueing ------------------------------------------------------------

    def validate_inputs(self, inputs: Arrays,
                        parameters: InputParameters = NO_PARAMETERS) -> Prepare | None:
        """What the model would fail on, as a 400 for this request alone (called before the
        request joins a batch, so it never fails its neighbours); a text pair's `max_tokens`
        is the step handed back (runtime/text/pairs.py)."""
        if TEXT in inputs:
            check_text(inputs, self._lengths)
            return self._pairs.check(inputs, parameters) if self._pairs is not None else None
        if TEXT_PAIR in inputs:
            raise InvalidInput("input 'text_pair' goes with 'text', one pair per row")
        if self.task != "image-classification":
            check_token_ids(inputs, self._limits)
        return None

    # --- running --------------------------------------------------------------------------

    def run_blocking(self, inputs: Arrays, outputs: Sequence[str] | None) -> Arrays:
        return self.run_batch_blocking([inputs], outputs)[0]

    def run_batch_blocking(
        self, requests: Sequence[Arrays], outputs: Sequence[str] | None
    ) -> list[Arrays]:
        """Run several requests as one batch, padded to its longest; each gets its own rows
        back, trimmed to its own token length. Never Unsplittable."""
        counts: np.ndarray | None
        tokenized: Tokenized | None = None
        if TEXT_PAIR in requests[0] and self._pairs is not None:
            tokenized = self._pairs.tokenize(requests, self._takes_token_types())
            feeds, lengths, counts = tokenized.feeds, tokenized.lengths, tokenized.counts
        elif TEXT in requests[0]:
            tokenized = tokenize(self.tokenizer, [r[TEXT] for r in requests],
                                 self._takes_token_types())
            feeds, lengths, counts = tokenized.feeds, tokenized.lengths, tokenized.counts
        else:
            feeds = {k: np.concatenate([r[k] for r in requests]) for k in requests[0]}
            lengths = [r[next(iter(r))].shape[-1] if r else 0 for r in requests]
            counts = token_counts(feeds) if "input_ids" in feeds else None
        rows = [next(iter(r.values())).shape[0] for r in requests]
        wanted = list(outputs) if outputs else [s.name for s in self._metadata.outputs]
        if not any(rows):  # nothing to run: each request gets its empty outputs
            specs = {s.name: s for s in self._metadata.outputs}
            return [
                {name: np.zeros((0, *(length if d < 0 else d for d in specs[name].shape[1:])),
                                dtype=np.int64 if name == TOKEN_COUNT else np.float32)
                 for name in wanted}
                for length in lengths
            ]
        if tokenized is not None and "last_hidden_state" not in wanted:
            results = run_by_length(feeds, tokenized.counts, self._budget,
                                    lambda run: self._forward(run, hidden=False))
        else:
            results = self._forward(feeds, hidden="last_hidden_state" in wanted)
        if counts is not None and self._counts_tokens():
            results[TOKEN_COUNT] = counts
        parts: list[Arrays] = []
        start = 0
        for count, length in zip(rows, lengths, strict=True):
            part: Arrays = {}
            for name in wanted:
                value = results[name][start:start + count]
                if name == "last_hidden_state":
                    value = value[:, :length]
                part[name] = np.ascontiguousarray(value)
            parts.append(part)
            start += count
        return parts

    def _forward(self, feeds: Arrays, hidden: bool = True) -> Arrays:
        """The batch's outputs: logits, or the pooled embedding and (`hidden`) the token
        vectors."""
        tensors = {k: torch.from_numpy(np.ascontiguousarray(v)).to(self.device)
                   for k, v in feeds.items()}
        with torch.inference_mode():
            out = self.model(**tensors)
        if self.task != "feature-extraction":
            logits = out.logits.float().cpu().numpy()
            if self.task == "text-classification":
                check_logits(logits, self.name)
            return {LOGITS: logits}
        states = out.last_hidden_state
        pooled = _pool(self.pooling, states, tensors.get("attention_mask"), out)
        if self.normalize:
            pooled = torch.nn.functional.normalize(pooled.float(), p=2, dim=1)
        results = {"embedding": pooled.float().cpu().numpy()}
        if hidden:
            results["last_hidden_state"] = states.float().cpu().numpy()
        return results

    def upgrade_bytes(self, rows: int) -> int:
        return 0  # loaded in its final form: nothing left for later

    def upgrade_blocking(self) -> bool:
        return False

    def close(self) -> None:
        drop_attribute_blocking(self, "model")
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def _pool(pooling: str, hidden: torch.Tensor, mask: torch.Tensor | None, out: Any) -> torch.Tensor:
    """One vector per row from the token vectors, over the tokens the mask covers (padding is
    on the right): as sentence-transformers' Pooling module does for the same mode."""
    if pooling == "model":
        return cast(torch.Tensor, out.pooler_output)
    if pooling == "cls":
        return hidden[:, 0]
    if mask is None:
        mask = torch.ones(hidden.shape[:2], dtype=torch.int64, device=hidden.device)
    if pooling == "last":
        last = (mask.sum(dim=1) - 1).clamp(min=0)
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    if pooling == "max":
        return hidden.masked_fill(weights == 0, torch.finfo(hidden.dtype).min).max(dim=1).values
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)


def _load_weights(spec: ModelConfig, cls: Any, config: Any) -> torch.nn.Module:
    """The model with its weights on the CPU: mapped from its safetensors file when the folder
    is an exact fit (runtime/torch/hf_weights.py), else through `from_pretrained`."""
    dtype = DTYPES[spec.dtype]
    try:
        mapped = load_mapped(spec.path, cls, config, dtype)
    except NotMappable as exc:
        reason = str(exc)
    else:
        log_event("weights_loaded", model=spec.name, via="mmap")
        if mapped.unused:
            _warn_unused(spec.path, mapped.unused)
        return mapped.model
    # Outside the except clause: its traceback would keep the fast path's tensors alive.
    log_event("weights_loaded", model=spec.name, via="from_pretrained", reason=reason)
    # transformers fills missing or mis-shaped weights with random values and only warns;
    # a model serving noise must be FAILED instead, naming what did not match.
    model, info = cls.from_pretrained(
        str(spec.path), local_files_only=True, use_safetensors=True, output_loading_info=True,
        ignore_mismatched_sizes=True, **{dtype_key(): dtype}
    )
    _check_loading_info(spec.path, info)
    return cast(torch.nn.Module, model)


def _some(keys: Sequence[Any]) -> str:
    shown = ", ".join(str(k) for k in list(keys)[:5])
    return shown + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")


def _check_loading_info(folder: Path, info: dict[str, Any]) -> None:
    problems = []
    if info.get("missing_keys"):
        problems.append(f"missing {_some(sorted(info['missing_keys']))}")
    if info.get("mismatched_keys"):
        shapes = [f"{key} {list(saved)} vs {list(wanted)}"
                  for key, saved, wanted in sorted(info["mismatched_keys"])]
        problems.append(f"shapes differ (weights vs config) for {_some(shapes)}")
    if problems:
        raise RuntimeError(f"the weights in {folder} do not match its config.json: "
                           + "; ".join(problems))
    if info.get("unexpected_keys"):
        _warn_unused(folder, sorted(info["unexpected_keys"]))


def _warn_unused(folder: Path, keys: Sequence[str]) -> None:
    log_event("weights_unused", logging.WARNING, path=folder, keys=_some(keys))


def _page_in(model: torch.nn.Module) -> None:
    """Touch every page of every weight once. The weights are mapped from the safetensors file
    lazily, so without this the load would look small and the first requests would fault them
    in one page at a time; with it, the measured size is the real one and unloading returns all
    of it. One byte per page (and the last one) does it, at half the time of reading them all."""
    with torch.inference_mode():
        for tensor in (*model.parameters(), *model.buffers()):
            if tensor.device.type != "cpu" or not tensor.numel():
                continue
            if tensor.is_contiguous():
                raw = tensor.reshape(-1).view(torch.uint8)
                raw[::mmap.PAGESIZE].sum()
                raw[-1:].sum()
            else:  # a view made at build (an expanded buffer), not a mapped weight
                tensor.sum()
