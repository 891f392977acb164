"""truncate = false: `LengthCheck.fits` against the whole text's token count, for texts short
and long, around the limit, with words the prefix cut falls inside."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer
from torch_models import MINILM

from snoozeml.runtime.text.tokenizer import LengthCheck, encode_all, load_tokenizer

WORDS = ["cat", "internationalisation", "the", "of", "Zürich", "東京", "unbelievably", ",",
         "x" * 150, "scale-to-zero", "42", "naïve", "pneumonoultramicroscopicsilicovolcanoconiosis"]


def _count(text: str) -> int:
    whole = Tokenizer.from_file(str(MINILM / "tokenizer.json"))
    whole.no_truncation()
    whole.no_padding()  # the file pads to 128
    return len(whole.encode(text).ids)


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
