"""Text pairs: a `text` and a `text_pair` per row (a query and a document), tokenized together
as one sequence pair, the way sentence-transformers' CrossEncoder feeds a sequence-
classification model.

Each row becomes the tokenizer's pair template (BERT: `[CLS] text [SEP] text_pair [SEP]`), with
segment ids 0 for the first text and 1 for the second, truncated to `max_length` tokens
together as CrossEncoder's `truncation="longest_first"` does: the tokenizers library's own
LongestFirst, which a fast Hugging Face tokenizer calls. Tokens come off the longer side until
the pair fits, both sides meeting at half of the room when both are long. With
`truncate_query = false` only the second text is cut (`only_second`), and a first text that
leaves it no token is a 400 before queueing; with `truncate = false` nothing is
cut, and a pair longer than max_length is that 400.

How, and why not by the tokenizer's own truncation: the tokenizers library computes a
truncated pair's overflowing windows as every window of one side with every window of the
other, so two long texts cost the product of their lengths (two texts of 2,000 words at
max_length 16 make about 95,000 windows, and gigabytes). Here each pair is encoded without
truncation, and `kept` (LongestFirst and OnlySecond, ported from the library and tested
against it) says how many tokens of each side stay; the rest are dropped by their sequence
ids, the special tokens kept. A long text is not encoded whole either (a document of
megabytes would hold the model's worker for seconds): a prefix of it is, four times longer
each round, until the tokens a pair can keep of it (at most the room: max_length less the
pair's special tokens) end well before the cut (tokenizer.py's CUT_MARGIN). What is kept
depends on a long side's length only in one case: with an odd room and both sides longer than
half of it, the longer side gets the odd token; only then is a cut side counted further, until
its count tells (`_first_longer`).

A request may cap its documents: `text_pair`'s OIP parameter `max_tokens` (what Cohere's
`max_tokens_per_doc` sends) cuts each `text_pair` to its first `max_tokens` tokens before it is
paired, then the pair is truncated as above. The cut is text: the document up to the end of
that token (tokenizer.py's first_tokens, by prefixes as well), done before queueing on the
preparation pool, so the batch sees short documents and counts their tokens. A cap past the
room changes what a pair keeps only through LongestFirst's odd token (which side is longer),
so a document is never tokenized further than one token past the room, or past the query.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from snoozeml.errors import InvalidInput
from snoozeml.runtime.base import NO_PARAMETERS, Arrays, InputParameters, Prepare, utf8_strings
from snoozeml.runtime.text.tokenizer import (
    CUT_MARGIN,
    FIRST_PREFIX,
    TEXT,
    TEXT_PAIR,
    LengthCheck,
    Tokenized,
    first_tokens,
    flat_strings,
    is_settled,
    padded,
)

MAX_TOKENS = "max_tokens"  # text_pair's parameter: each document's first tokens, no more


@dataclass(frozen=True, slots=True)
class PairTokens:
    """One row's tokens (what `padded` reads of an encoding)."""

    ids: np.ndarray
    type_ids: np.ndarray


def kept(first: int, second: int, room: int, keep_first: bool = False) -> tuple[int, int]:
    """How many of its tokens each side of a pair keeps when `room` tokens are left for both:
    the tokenizers library's LongestFirst (its legacy algorithm, verbatim), or with
    `keep_first` its OnlySecond (where the library fails on a first side that leaves the second
    no token, which the checks before queueing refuse; here the second keeps none)."""
    if first + second <= room:
        return first, second
    if keep_first:
        return first, max(room - first, 0)
    swap = first > second
    short, long = (second, first) if swap else (first, second)
    long = short if short > room else max(short, room - short)
    if short + long > room:
        short = room // 2
        long = short + room % 2
    return (long, short) if swap else (short, long)


def max_tokens(parameters: InputParameters) -> int | None:
    """`text_pair`'s `max_tokens` parameter, a positive integer (None: not sent), or its 400."""
    value = parameters.get(TEXT_PAIR, {}).get(MAX_TOKENS)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInput(f"input '{TEXT_PAIR}': parameter '{MAX_TOKENS}' must be a positive "
                           "integer (the tokens each text_pair keeps)")
    return value


class TextPairs:
    """A pair model's side of tokenization: its checks before queueing, and a batch's pairs
    as token ids. `tokenizer` is the model's (load_tokenizer: one text truncated at
    `max_length`); it is copied once, without truncation, to encode pairs."""

    def __init__(self, tokenizer: Any, max_length: int, truncate: bool = True,
                 truncate_query: bool = True) -> None:
        processor = tokenizer.post_processor
        single = processor.num_special_tokens_to_add(False) if processor else 0
        pair = processor.num_special_tokens_to_add(True) if processor else 0
        self.room = max_length - pair  # the tokens of text that the two sides share
        if self.room <= 0:
            raise RuntimeError(f"max_length = {max_length} leaves no room for a text pair: the "
                               f"tokenizer adds {pair} special tokens to each")
        self.max_length = max_length
        self.keep_query = not truncate_query
        self._tokenizer = tokenizer
        self._untruncated = type(tokenizer).from_str(tokenizer.to_str())
        self._untruncated.no_truncation()
        self._untruncated.no_padding()
        # truncate = false: whole pairs are measured. truncate_query = false: first texts,
        # which leave a token of the room at least to the second, as the library's
        # only_second does (it fails on a first text that leaves none).
        self._whole = None if truncate else LengthCheck(tokenizer, max_length)
        self._queries = LengthCheck(tokenizer, self.room - 1 + single) \
            if truncate and self.keep_query else None

    def check(self, inputs: Arrays,
              parameters: InputParameters = NO_PARAMETERS) -> Prepare | None:
        """A request's `text_pair`, when it sends one, as one string per row of its `text`
        (replaced in `inputs`; check_text has checked `text`), or its 400: rows that differ,
        not UTF-8, a bad `max_tokens`, or a pair that does not fit (truncate = false,
        truncate_query = false). With `max_tokens`, the step handed back cuts the documents
        (replaced in `inputs`) and checks the pairs they make."""
        if TEXT_PAIR not in inputs:
            return None
        firsts, seconds = inputs[TEXT], inputs[TEXT_PAIR]
        if seconds.ndim != 1:
            raise InvalidInput("input 'text_pair' takes one string per row (shape [rows])")
        if seconds.shape != firsts.shape:
            raise InvalidInput(f"inputs 'text' and 'text_pair' pair up row by row; they have "
                               f"{firsts.shape[0]} and {seconds.shape[0]} rows")
        inputs[TEXT_PAIR] = seconds = utf8_strings(seconds, TEXT_PAIR)
        cap = max_tokens(parameters)
        if cap is None:
            self._check_fits(firsts, seconds)
            return None

        def cut_blocking() -> None:
            inputs[TEXT_PAIR] = capped = self.capped(firsts, seconds, cap)
            self._check_fits(firsts, capped)

        return cut_blocking

    def _check_fits(self, firsts: np.ndarray, seconds: np.ndarray) -> None:
        for row, (first, second) in enumerate(zip(firsts, seconds, strict=True)):
            if self._whole is not None and not self._whole.fits_pair(str(first), str(second)):
                raise InvalidInput(f"row {row}: 'text' and 'text_pair' together are longer than "
                                   f"the {self.max_length} tokens the model takes "
                                   "(truncate = false)")
            if self._queries is not None and not self._queries.fits(str(first)):
                raise InvalidInput(f"input 'text': row {row} leaves no room for its "
                                   f"'text_pair': longer than the {self.room - 1} tokens a "
                                   "pair's first text may have (truncate_query = false)")

    def capped(self, firsts: np.ndarray, seconds: np.ndarray, cap: int) -> np.ndarray:
        """Each second text cut to its first `cap` tokens, as far as its pair can tell. Past
        the room, what a pair keeps of two texts depends on the second's length only through
        whether the first is longer (kept, _first_longer): a second of room + 1 tokens, or of
        one more than the first's when that is longer, pairs as one of `cap` does. So no cut is
        longer than that: a cap of a million tokens does not tokenize a document whole."""
        limits: dict[str, int] = {}
        cut = np.empty(len(seconds), dtype=object)
        for row, (first, second) in enumerate(zip(firsts, seconds, strict=True)):
            limit = limits.get(str(first))
            if limit is None:
                limit = limits[str(first)] = self._limit(str(first), cap)
            cut[row] = first_tokens(self._untruncated, str(second), limit)[0]
        return cut

    def _limit(self, first: str, cap: int) -> int:
        """The tokens to cut a second text to that pair with `first` as `cap` does."""
        if cap <= self.room + 1:
            return cap
        counted = first_tokens(self._untruncated, first, cap)[1]  # up to cap: all it takes
        return min(cap, max(self.room, counted) + 1)

    def tokenize(self, requests: Sequence[Arrays], token_types: bool) -> Tokenized:
        """Token ids for every pair of every request, padded to the batch's longest."""
        firsts = flat_strings([r[TEXT] for r in requests])
        seconds = flat_strings([r[TEXT_PAIR] for r in requests])
        return padded(self.encode(firsts, seconds),
                      [r[TEXT].reshape(-1).shape[0] for r in requests], token_types)

    def encode(self, firsts: Sequence[str], seconds: Sequence[str]) -> list[PairTokens]:
        """Each pair's tokens, truncated as the tokenizer truncates the whole texts."""
        cuts = [self.cut(first, second) for first, second in zip(firsts, seconds, strict=True)]
        encodings = self._untruncated.encode_batch(cuts)
        return [self._truncated(encoding, first, second, cut) for encoding, first, second, cut
                in zip(encodings, firsts, seconds, cuts, strict=True)]

    def cut(self, first: str, second: str) -> tuple[str, str]:
        """What is encoded of a pair: each text, or a prefix of a long one whose first tokens,
        more than the room, are the whole text's."""
        return self._prefix(first) or first, self._prefix(second) or second

    def _truncated(self, encoding: Any, first: str, second: str,
                   cut: tuple[str, str]) -> PairTokens:
        sides = np.array(encoding.sequence_ids, dtype=np.float64)  # None (special) is NaN
        in_first, in_second = sides == 0, sides == 1
        lengths = (int(in_first.sum()), int(in_second.sum()))
        half = self.room // 2
        if self.room % 2 and not self.keep_query and min(lengths) > half:
            # Both sides past half of an odd room: each keeps half, the longer one more.
            longer = self._first_longer((first, second), cut, lengths)
            keep_first, keep_second = (half + 1, half) if longer else (half, half + 1)
        else:
            keep_first, keep_second = kept(*lengths, self.room, self.keep_query)
        keep = ~(in_first | in_second) | (in_first & (np.cumsum(in_first) <= keep_first)) \
            | (in_second & (np.cumsum(in_second) <= keep_second))
        return PairTokens(np.asarray(encoding.ids, dtype=np.int64)[keep],
                          np.asarray(encoding.type_ids, dtype=np.int64)[keep])

    def _first_longer(self, texts: tuple[str, str], cut: tuple[str, str],
                      lengths: tuple[int, int]) -> bool:
        """Whether the first whole text has more tokens than the second. A cut side's count
        is a prefix's, so it grows (four times each round) until it is whole, or until the
        tokens it has settled outnumber the other side's whole count: linear in the shorter
        text at most."""
        exact = [len(c) == len(t) for c, t in zip(cut, texts, strict=True)]
        counts = [n if whole else self._settled(c) for n, whole, c
                  in zip(lengths, exact, cut, strict=True)]
        chars = [len(c) for c in cut]
        while True:
            if exact[0] and exact[1]:
                return counts[0] > counts[1]
            if exact[0] and counts[1] > counts[0]:
                return False
            if exact[1] and counts[0] > counts[1]:
                return True
            for side, text in enumerate(texts):
                if exact[side]:
                    continue
                chars[side] *= 4
                exact[side] = len(text) <= chars[side]
                counts[side] = self._content(text) if exact[side] \
                    else self._settled(text[:chars[side]])

    def _settled(self, prefix: str) -> int:
        """Tokens of a text's prefix that are the whole text's too: a lower bound of its count."""
        offsets = self._untruncated.encode(prefix, add_special_tokens=False).offsets
        return sum(1 for _, end in offsets if end <= len(prefix) - CUT_MARGIN)

    def _prefix(self, text: str) -> str | None:
        """A prefix of a long text whose first tokens, more than the room, are the whole
        text's; None for a text that is short or never settles (it is encoded whole)."""
        chars = max(FIRST_PREFIX, 4 * self.max_length)
        while len(text) > chars:
            encoding = self._tokenizer.encode(text[:chars])
            content = sum(1 for special in encoding.special_tokens_mask if not special)
            if is_settled(encoding, chars) and content > self.room:
                return text[:chars]
            chars *= 4
        return None

    def _content(self, text: str) -> int:
        """The whole text's own tokens (no special ones)."""
        return len(self._untruncated.encode(text, add_special_tokens=False).ids)
