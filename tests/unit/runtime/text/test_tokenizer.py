"""truncate = false: `LengthCheck.fits` against the whole text's token count, for texts short
and long, around the limit, with words the prefix cut falls inside; `first_tokens` against the
whole text's offsets, a long text tokenized by its prefix only."""

from __future__ import annotations

import random
from typing import Any

import pytest
from tokenizers import Tokenizer
from torch_models import MINILM

from snoozeml.runtime.text.tokenizer import (
    LengthCheck,
    encode_all,
    first_tokens,
    load_tokenizer,
)

WORDS = ["cat", "internationalisation", "the", "of", "Zürich", "東京", "unbelievably", ",",
         "x" * 150, "scale-to-zero", "42", "naïve", "pneumonoultramicroscopicsilicovolcanoconiosis"]


def _whole() -> Tokenizer:
    whole = Tokenizer.from_file(str(MINILM / "tokenizer.json"))
    whole.no_truncation()
    whole.no_padding()  # the file pads to 128
    return whole


def _count(text: str) -> int:
    return len(_whole().encode(text).ids)


def _texts(seed: int) -> list[str]:
    rng = random.Random(seed)
    texts = []
    for words in (1, 5, 14, 15, 16, 200, 254, 255, 256, 257, 300, 1000, 5000):
        texts.append(" ".join(rng.choice(WORDS) for _ in range(words)))
    texts.append("a" * 100_000)  # one word: one [UNK]
    texts.append("word " * 30_000)  # far too long
    texts.append("x" * 2000 + " tail")  # the cut falls inside a long word
    return texts


@pytest.mark.parametrize("max_length", [16, 256])
def test_fits_agrees_with_the_whole_texts_count(max_length: int) -> None:
    check = LengthCheck(load_tokenizer(MINILM / "tokenizer.json", max_length), max_length)
    for seed in range(3):
        for text in _texts(seed):
            assert check.fits(text) == (_count(text) <= max_length), (max_length, text[:80])


def test_the_models_own_tokenizer_keeps_truncating() -> None:
    tokenizer = load_tokenizer(MINILM / "tokenizer.json", 16)
    LengthCheck(tokenizer, 16).fits("word " * 1000)
    assert len(tokenizer.encode("word " * 1000).ids) == 16


@pytest.mark.parametrize("max_length", [16, 256])
def test_encode_all_gives_the_whole_texts_truncated_tokens(max_length: int) -> None:
    tokenizer = load_tokenizer(MINILM / "tokenizer.json", max_length)
    for seed in range(3):
        texts = _texts(seed)
        expected = [e.ids for e in tokenizer.encode_batch(texts)]
        assert [e.ids for e in encode_all(tokenizer, texts)] == expected


@pytest.mark.parametrize("count", [1, 2, 15, 16, 255, 256, 257, 1000, 20_000])
def test_first_tokens_ends_at_the_whole_texts_token(count: int) -> None:
    whole = _whole()
    for seed in range(2):
        for text in _texts(seed):
            encoding = whole.encode(text, add_special_tokens=False)
            tokens = min(count, len(encoding.ids))
            want = text[:encoding.offsets[count - 1][1]] if len(encoding.ids) > count else text

            assert first_tokens(whole, text, count) == (want, tokens), (count, text[:80])
            # WordPiece: the cut text is those tokens again, no more.
            assert whole.encode(want, add_special_tokens=False).ids == encoding.ids[:count]


class _Recording:
    """The real tokenizer, recording the length of each text it is given."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.lengths: list[int] = []

    def encode(self, text: str, **kwargs: Any) -> Any:
        self.lengths.append(len(text))
        return self.tokenizer.encode(text, **kwargs)


def test_first_tokens_of_a_long_text_tokenize_a_prefix_of_it() -> None:
    document = "The committee reviewed every proposal in detail. " * 200_000  # 10 MB
    recording = _Recording(_whole())

    cut, count = first_tokens(recording, document, 300)

    assert count == 300
    head = _whole().encode(document[:10_000], add_special_tokens=False)
    assert cut == document[:head.offsets[299][1]]
    assert max(recording.lengths) < 20_000
    assert first_tokens(_whole(), "", 5) == ("", 0)
    assert first_tokens(_whole(), "two words", 0) == ("", 0)
