"""Text in, token ids out: the tokenizer side of every model that takes a BYTES `text` input.

Rows of one batch are padded to its longest (on the right, mask 0); each request keeps the
length of its own longest row, so its outputs can be trimmed back to what it would get alone,
and each row keeps its own token count (the `token_count` output, and the usage that
/v1/embeddings reports).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from snoozeml.errors import InvalidInput
from snoozeml.runtime.base import Arrays, utf8_strings

TEXT = "text"
TEXT_PAIR = "text_pair"  # a second text per row, tokenized with `text` as one pair (pairs.py)
TOKEN_COUNT = "token_count"


def load_tokenizer(file: Path, max_length: int) -> Any:
    """A `tokenizers.Tokenizer` from a tokenizer.json, unpadded and truncating at
    `max_length` tokens. RuntimeError, naming the problem, when it cannot work."""
    if not file.is_file():
        raise RuntimeError(f"tokenize = true but {file} does not exist")
    tokenizer = _tokenizers().Tokenizer.from_file(str(file))
    processor = tokenizer.post_processor
    specials = processor.num_special_tokens_to_add(False) if processor else 0
    if max_length <= specials:
        # The tokenizer can't truncate below its own special tokens: it would not truncate at
        # all, and long texts would fail on every request.
        raise RuntimeError(f"max_length = {max_length} leaves no room for text: the tokenizer "
                           f"adds {specials} special tokens to each")
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_length)
    return tokenizer


def _tokenizers() -> Any:
    """The `tokenizers` package, imported only by a model that tokenizes: not through
    torch_env, so an ONNX text model never imports torch."""
    try:
        import tokenizers
    except ImportError as exc:
        raise RuntimeError(f"{exc}; tokenize = true needs the tokenizers package: pip install "
                           "tokenizers (the 'snoozeml[torch]' extra includes it)") from exc
    return tokenizers


def check_text(inputs: Arrays, lengths: LengthCheck | None) -> None:
    """A request's `text` as one string per row (replaced in `inputs`), or its 400: not a
    vector, not UTF-8, or (`lengths`: a truncate = false model) longer than its max_length.
    A `text_pair` beside it is the pair model's to check (pairs.py); the metadata refuses it
    for the others."""
    extra = sorted(set(inputs) - {TEXT, TEXT_PAIR})
    if extra:
        raise InvalidInput(f"send either 'text' or token ids, not both (also got {extra})")
    if inputs[TEXT].ndim != 1:
        raise InvalidInput("input 'text' takes one string per row (shape [rows])")
    inputs[TEXT] = strings = utf8_strings(inputs[TEXT], TEXT)
    if lengths is None:
        return
    for row, text in enumerate(strings):
        if not lengths.fits(str(text)):
            raise InvalidInput(f"input 'text': row {row} is longer than the {lengths.max_length} "
                               "tokens the model takes (truncate = false)")


# Long texts are tokenized by prefixes (LengthCheck, encode_all): the first this long, in
# characters (and four times the token limit at least), then four times longer each round.
FIRST_PREFIX = 1024
# Tokens that end this many characters before a prefix's cut are the whole text's tokens: the
# cut can only change the words it falls inside (WordPiece gives up on words of 100).
CUT_MARGIN = 128


def encode_all(tokenizer: Any, texts: list[str]) -> list[Any]:
    """`tokenizer.encode_batch(texts)` with its truncation, tokenizing no more of a long text
    than its first max_length tokens need: a prefix, longer each round, until it overflows
    and its last kept token ends well before the cut. A megabyte of text costs what a few
    thousand characters do, not a second of the model's worker."""
    truncation = tokenizer.truncation
    if not truncation:
        return list(tokenizer.encode_batch(texts))
    first = max(FIRST_PREFIX, 4 * int(truncation["max_length"]))
    encodings = list(tokenizer.encode_batch([t[:first] for t in texts]))
    for i, text in enumerate(texts):
        chars = first
        while len(text) > chars and not is_settled(encodings[i], chars):
            chars *= 4
            encodings[i] = tokenizer.encode(text[:chars])
    return encodings


def first_tokens(tokenizer: Any, text: str, count: int) -> tuple[str, int]:
    """The text up to the end of its `count`-th token (special tokens aside) and how many
    tokens that is: the whole text and its count when it has no more. `tokenizer` must not
    truncate. A long text is tokenized by prefixes, four times longer each round, until its
    first `count` tokens end well before the cut (CUT_MARGIN), so that a few hundred tokens of
    a document of megabytes cost a few thousand characters of it."""
    if count <= 0:
        return "", 0
    chars = max(FIRST_PREFIX, 4 * count)
    while len(text) > chars:
        offsets = tokenizer.encode(text[:chars], add_special_tokens=False).offsets
        if len(offsets) >= count and offsets[count - 1][1] <= chars - CUT_MARGIN:
            return text[:offsets[count - 1][1]], count
        chars *= 4
    offsets = tokenizer.encode(text, add_special_tokens=False).offsets
    if len(offsets) <= count:
        return text, len(offsets)
    return text[:offsets[count - 1][1]], count


def is_settled(encoding: Any, chars: int) -> bool:
    """Whether a truncated encoding of a text's first `chars` characters is the whole text's."""
    if not encoding.overflowing:  # fewer tokens than the limit: the rest of the text has more
        return False
    ends = [end for (_, end), special in zip(encoding.offsets, encoding.special_tokens_mask,
                                             strict=True) if not special]
    return bool(ends) and max(ends) <= chars - CUT_MARGIN


class LengthCheck:
    """Whether a text fits in `max_length` tokens, special tokens included (truncate = false).

    It runs before the request is queued, on the event loop, so a long text is never
    tokenized whole: a prefix of it is, four times longer each round, until the tokens that
    end well before the cut (words the cut cannot have changed) are already too many, or the
    prefix is the whole text. A text of a megabyte that is too long costs a prefix of a few
    thousand characters. It has its own copy of the tokenizer, without truncation (the
    model's copy truncates, and its worker thread uses it meanwhile)."""

    def __init__(self, tokenizer: Any, max_length: int) -> None:
        self.max_length = max_length
        self._tokenizer = _tokenizers().Tokenizer.from_str(tokenizer.to_str())
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()

    def fits(self, text: str) -> bool:
        chars = max(FIRST_PREFIX, 4 * self.max_length)
        while len(text) > chars:
            encoding = self._tokenizer.encode(text[:chars])
            settled = chars - CUT_MARGIN
            # Special tokens have empty offsets at 0: they count, as they do in the whole text.
            if sum(1 for _, end in encoding.offsets if end <= settled) > self.max_length:
                return False
            chars *= 4
        return len(self._tokenizer.encode(text).ids) <= self.max_length

    def fits_pair(self, first: str, second: str) -> bool:
        """Whether two texts fit together as one pair (the pair's special tokens included).
        Each must fit alone first, which bounds the whole pair's tokenization."""
        if not (self.fits(first) and self.fits(second)):
            return False
        return len(self._tokenizer.encode(first, second).ids) <= self.max_length


@dataclass(frozen=True, slots=True)
class Tokenized:
    feeds: Arrays  # input_ids, attention_mask (and token_type_ids when asked), [rows, longest]
    lengths: list[int]  # per request: its longest row
    counts: np.ndarray  # per row: its tokens, int64


def tokenize(tokenizer: Any, texts: Sequence[np.ndarray], token_types: bool) -> Tokenized:
    """Token ids for every row of every request (each a vector of str), padded to the
    batch's longest."""
    encodings = encode_all(tokenizer, flat_strings(texts))
    return padded(encodings, [array.reshape(-1).shape[0] for array in texts], token_types)


def flat_strings(texts: Sequence[np.ndarray]) -> list[str]:
    """Every request's rows, in order, as one list."""
    flat: list[str] = []
    for array in texts:
        flat.extend(str(v) for v in array.reshape(-1))
    return flat


def padded(encodings: Sequence[Any], rows: Sequence[int], token_types: bool) -> Tokenized:
    """The encodings of a batch (`rows` per request, in order) as its token inputs, each row
    padded on the right to the batch's longest."""
    counts = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
    longest = int(counts.max()) if counts.size else 0
    ids = np.zeros((len(encodings), longest), dtype=np.int64)
    mask = np.zeros_like(ids)
    types = np.zeros_like(ids) if token_types else None
    for row, encoding in enumerate(encodings):
        n = len(encoding.ids)
        ids[row, :n] = encoding.ids
        mask[row, :n] = 1
        if types is not None:
            types[row, :n] = encoding.type_ids
    lengths: list[int] = []
    row = 0
    for count in rows:
        lengths.append(int(counts[row:row + count].max()) if count else 0)
        row += count
    feeds: Arrays = {"input_ids": ids, "attention_mask": mask}
    if types is not None:
        feeds["token_type_ids"] = types
    return Tokenized(feeds, lengths, counts)


@dataclass(frozen=True, slots=True)
class TokenLimits:
    """What a model's config says its token inputs may hold (0: it does not say)."""

    positions: int = 0  # max_position_embeddings
    vocab: int = 0  # vocab_size
    types: int = 0  # type_vocab_size

    @classmethod
    def of(cls, config: Callable[[str], object]) -> TokenLimits:
        """From a config's values by key (`getattr` on a transformers config, `dict.get`
        on its JSON); anything but a positive integer counts as unknown."""
        def number(key: str) -> int:
            value = config(key)
            return value if isinstance(value, int) and not isinstance(value, bool) \
                and value > 0 else 0

        return cls(number("max_position_embeddings"), number("vocab_size"),
                   number("type_vocab_size"))


def check_token_ids(inputs: Arrays, limits: TokenLimits) -> None:
    """A request's token ids as a 400, before it is queued: shapes that disagree, no tokens,
    more tokens than the model has positions, ids outside its vocabulary or token types."""
    shape = inputs["input_ids"].shape
    for name in ("attention_mask", "token_type_ids"):
        if name in inputs and inputs[name].shape != shape:
            raise InvalidInput(f"input {name!r} has shape {list(inputs[name].shape)}; it "
                               f"must match input_ids {list(shape)}")
    if shape[1] == 0 and shape[0] > 0:
        raise InvalidInput("input 'input_ids' has no tokens")
    if limits.positions and shape[1] > limits.positions:
        raise InvalidInput(f"input 'input_ids' has {shape[1]} tokens; the model takes at most "
                           f"{limits.positions}")
    _check_range(inputs, "input_ids", "token", limits.vocab)
    _check_range(inputs, "token_type_ids", "type", limits.types)


def _check_range(inputs: Arrays, name: str, kind: str, limit: int) -> None:
    ids = inputs.get(name)
    if limit and ids is not None and ids.size and (ids.min() < 0 or ids.max() >= limit):
        raise InvalidInput(f"input {name!r} holds a {kind} id outside [0, {limit})")


def token_counts(feeds: Arrays) -> np.ndarray:
    """Each row's tokens for a request that sent token ids: its mask's ones, or its width."""
    mask = feeds.get("attention_mask")
    if mask is not None:
        return np.asarray((mask != 0).sum(axis=1), dtype=np.int64)
    ids = feeds["input_ids"]
    return np.full(ids.shape[0], ids.shape[1], dtype=np.int64)
