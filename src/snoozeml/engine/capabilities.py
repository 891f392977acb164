"""What a model can do beyond plain Open Inference Protocol inference, in the engine's terms:
whether it embeds text (what the OpenAI-compatible routes serve) and how its embeddings are
shaped, whether it scores text pairs (a cross-encoder: what the rerank routes serve) and with
how many labels. The service (engine/service.py) answers the transports from here, so none of them
reads a model's entry or imports the runtime's file readers (runtime/text/settings.py).

What a model's entry and files say is read once per model (on the event loop, a few small JSON
files at most), never per request; a model removed and added again under its name is read
afresh.
"""

from __future__ import annotations

from dataclasses import dataclass
from weakref import WeakKeyDictionary

from snoozeml.engine.model import Model
from snoozeml.errors import BackendError
from snoozeml.runtime.text.pairs import MAX_TOKENS
from snoozeml.runtime.text.settings import (
    UnsupportedLayout,
    can_embed,
    can_score_pairs,
    label_count,
    text_settings,
)
from snoozeml.runtime.text.tokenizer import TEXT, TEXT_PAIR, TOKEN_COUNT

__all__ = ["MAX_TOKENS", "TEXT", "TEXT_PAIR", "TOKEN_COUNT", "Capabilities",
           "CapabilityReader", "EmbeddingSettings"]


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a model can be asked besides OIP inference."""

    embeddings: bool  # a text embedding model: takes `TEXT`, answers embeddings and TOKEN_COUNT
    max_batch_size: int  # rows of one batch (1 or less: the model does not batch)
    # A text sequence classifier: takes `TEXT` and `TEXT_PAIR` (a query and a document), answers
    # `logits` [rows, num_labels]. One that reranks has one label.
    reranks: bool = False
    num_labels: int | None = None  # its config.json's labels; None: unknown until loaded


@dataclass(frozen=True, slots=True)
class EmbeddingSettings:
    """How a text embedding model shapes its answers (its entry, completed from its files)."""

    normalize: bool  # embeddings are unit length, so shortened ones are normalised again
    max_length: int  # tokens a row holds at most
    truncate: bool  # a longer row is cut to max_length (else refused)
    matryoshka: bool  # trained so that a prefix of an embedding is an embedding too


class CapabilityReader:
    """Each model's capabilities and embedding settings, read the first time they are asked
    for and kept as long as the model is."""

    def __init__(self) -> None:
        self._capabilities: WeakKeyDictionary[Model, Capabilities] = WeakKeyDictionary()
        self._embeddings: WeakKeyDictionary[Model, EmbeddingSettings] = WeakKeyDictionary()

    def capabilities(self, model: Model) -> Capabilities:
        found = self._capabilities.get(model)
        if found is None:
            spec = model.spec
            pairs = can_score_pairs(spec)
            found = self._capabilities[model] = Capabilities(
                embeddings=can_embed(spec), max_batch_size=spec.batching.max_batch_size,
                reranks=pairs, num_labels=label_count(spec) if pairs else None)
        return found

    def embedding_settings(self, model: Model) -> EmbeddingSettings:
        """BackendError when the model's files name a layout SnoozeML does not run (they
        changed since the model loaded: that layout fails its load)."""
        found = self._embeddings.get(model)
        if found is None:
            spec = model.spec
            try:
                text = text_settings(spec)
            except UnsupportedLayout as exc:
                raise BackendError(str(exc)) from exc
            found = self._embeddings[model] = EmbeddingSettings(
                text.normalize, text.max_length, text.truncate, spec.matryoshka)
        return found
