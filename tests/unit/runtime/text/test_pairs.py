"""Text pairs: `kept` against the tokenizers library's own LongestFirst and OnlySecond, pairs
encoded as the library truncates the whole texts (segment ids included) for short and long
texts, odd and even rooms; long documents encoded from a prefix; the checks before queueing."""

from __future__ import annotations

import random

import numpy as np
import pytest
from tokenizers import Tokenizer
from torch_models import MINILM

from snoozeml.errors import InvalidInput
from snoozeml.runtime.text.pairs import TextPairs, kept
from snoozeml.runtime.text.tokenizer import TEXT, TEXT_PAIR, load_tokenizer

WORDS = ["cat", "internationalisation", "the", "of", "Zürich", "東京", "unbelievably", ",",
         "x" * 150, "42", "naïve", "scale-to-zero"]


def _library(max_length: int, strategy: str = "longest_first") -> Tokenizer:
    """MiniLM's tokenizer truncating pairs itself, as a fast Hugging Face tokenizer has it."""
    tokenizer = Tokenizer.from_file(str(MINILM / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_length, strategy=strategy)
    return tokenizer


def _texts(seed: int) -> list[str]:
    rng = random.Random(seed)
    texts = [" ".join(rng.choice(WORDS) for _ in range(words))
             for words in (0, 1, 3, 6, 7, 8, 12, 100, 300)]
    # Past the first prefix: cut, and for two of them, which side is longer takes counting.
    texts += ["word " * 300, "a b " * 350, "x" * 2000 + " tail"]
    return texts


@pytest.mark.parametrize("room", [13, 14])
def test_kept_is_the_librarys_longest_first(room: int) -> None:
    library = Tokenizer.from_file(str(MINILM / "tokenizer.json"))
    library.no_padding()
    library.enable_truncation(max_length=room + 3)  # [CLS] a [SEP] b [SEP]
    for first in range(0, 2 * room):
        for second in range(0, 2 * room):
            encoding = library.encode(" ".join(["cat"] * first), " ".join(["dog"] * second))
            sides = encoding.sequence_ids
            assert kept(first, second, room) == (sides.count(0), sides.count(1)), (first, second)


def test_kept_with_the_first_whole_cuts_only_the_second() -> None:
    assert kept(4, 30, 13, keep_first=True) == (4, 9)
    assert kept(13, 30, 13, keep_first=True) == (13, 0)
    assert kept(4, 5, 13, keep_first=True) == (4, 5)


@pytest.mark.parametrize("max_length", [16, 17, 64, 65])
@pytest.mark.parametrize("keep_query", [False, True])
def test_pairs_are_encoded_as_the_library_truncates_them(max_length: int,
                                                        keep_query: bool) -> None:
    tokenizer = load_tokenizer(MINILM / "tokenizer.json", max_length)
    pairs = TextPairs(tokenizer, max_length, truncate_query=not keep_query)
    library = _library(max_length, "only_second" if keep_query else "longest_first")
    texts = _texts(max_length)
    for first in texts:
        if keep_query and _fails(library, first):
            continue  # the library fails on a query past the room; the checks refuse it first
        got = pairs.encode([first] * len(texts), texts)
        for second, encoding in zip(texts, got, strict=True):
            want = library.encode(first, second)
            assert encoding.ids.tolist() == want.ids, (first[:40], second[:40])
            assert encoding.type_ids.tolist() == want.type_ids


def _fails(library: Tokenizer, query: str) -> bool:
    try:
        library.encode(query, "word " * 100)
    except Exception:  # the library raises a bare Exception
        return True
    return False


def test_a_long_document_is_encoded_from_a_prefix() -> None:
    tokenizer = load_tokenizer(MINILM / "tokenizer.json", 64)
    pairs = TextPairs(tokenizer, 64)
    document = "The committee reviewed every proposal in detail. " * 20_000  # 1 MB
    query = "what did the committee do?"
    first, second = pairs.cut(query, document)
    assert first == query
    assert len(second) < 10_000
    assert pairs.encode([query], [document])[0].ids.tolist() == \
        _library(64).encode(query, document[:100_000]).ids


def _request(first: list[object], second: list[object]) -> dict[str, np.ndarray]:
    return {TEXT: np.array(first, dtype=object), TEXT_PAIR: np.array(second, dtype=object)}


def test_checks_refuse_pairs_that_do_not_line_up_or_are_not_utf8() -> None:
    pairs = TextPairs(load_tokenizer(MINILM / "tokenizer.json", 32), 32)
    with pytest.raises(InvalidInput, match="they have 2 and 1 rows"):
        pairs.check(_request(["a", "b"], ["c"]))
    with pytest.raises(InvalidInput, match=r"input 'text_pair': element 1 is not valid UTF-8"):
        pairs.check(_request(["a", "b"], [b"c", b"\xff"]))
    inputs = _request(["a"], [b"caf\xc3\xa9"])
    pairs.check(inputs)
    assert inputs[TEXT_PAIR].tolist() == ["café"]


def test_truncate_false_refuses_a_pair_longer_than_max_length() -> None:
    pairs = TextPairs(load_tokenizer(MINILM / "tokenizer.json", 16), 16, truncate=False)
    pairs.check(_request(["one two three"], ["four five six"]))
    with pytest.raises(InvalidInput, match="row 1: 'text' and 'text_pair' together are longer "
                                           r"than the 16 tokens .*truncate = false"):
        pairs.check(_request(["short", "seven words in the first text here"],
                             ["short", "and seven more words in the second"]))


def test_truncate_query_false_refuses_a_query_that_leaves_no_room() -> None:
    pairs = TextPairs(load_tokenizer(MINILM / "tokenizer.json", 16), 16, truncate_query=False)
    fits = " ".join(["cat"] * 12)  # the room less one: the document keeps a token
    pairs.check(_request([fits], ["a long document " * 50]))
    with pytest.raises(InvalidInput, match="row 0 leaves no room for its 'text_pair': longer "
                                           "than the 12 tokens"):
        pairs.check(_request([fits + " cat"], ["doc"]))


def test_max_length_must_leave_room_for_a_pair() -> None:
    with pytest.raises(RuntimeError, match="max_length = 3 leaves no room for a text pair"):
        TextPairs(load_tokenizer(MINILM / "tokenizer.json", 3), 3)
