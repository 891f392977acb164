"""Text pairs: `kept` against the tokenizers library's own LongestFirst and OnlySecond, pairs
encoded as the library truncates the whole texts (segment ids included) for short and long
texts, odd and even rooms; long documents encoded from a prefix; the checks before queueing;
documents cut to `max_tokens` pairing as the library pairs the documents' first tokens."""

from __future__ import annotations

import functools
import random

import numpy as np
import pytest
from tokenizers import Tokenizer
from torch_models import MINILM

from snoozeml.errors import InvalidInput
from snoozeml.runtime.text.pairs import TextPairs, kept, max_tokens
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


# --- max_tokens: each document's first tokens ---------------------------------------------------


@functools.cache
def _offsets(text: str) -> list[tuple[int, int]]:
    """Each of the whole text's tokens' offsets (special tokens aside)."""
    whole = Tokenizer.from_file(str(MINILM / "tokenizer.json"))
    whole.no_truncation()
    whole.no_padding()  # the file pads to 128
    return list(whole.encode(text, add_special_tokens=False).offsets)


def _first(text: str, count: int) -> str:
    """The text up to the end of its `count`-th token, from the whole text's own offsets."""
    offsets = _offsets(text)
    return text if len(offsets) <= count else text[:offsets[count - 1][1]]


@pytest.mark.parametrize("max_length", [16, 17, 64])
@pytest.mark.parametrize("keep_query", [False, True])
def test_capped_documents_pair_as_the_library_pairs_their_first_tokens(
    max_length: int, keep_query: bool,
) -> None:
    tokenizer = load_tokenizer(MINILM / "tokenizer.json", max_length)
    pairs = TextPairs(tokenizer, max_length, truncate_query=not keep_query)
    library = _library(max_length, "only_second" if keep_query else "longest_first")
    texts = _texts(max_length + 1)
    room = pairs.room
    # Under the room, at it and past it (a longer cap is cut short, pairing the same way).
    for cap in (1, 4, room, room + 1, room + 2, 2 * room + 1, 100_000):
        for first in texts:
            if keep_query and _fails(library, first):
                continue
            firsts = np.array([first] * len(texts), dtype=object)
            cut = pairs.capped(firsts, np.array(texts, dtype=object), cap)
            got = pairs.encode([first] * len(texts), [str(c) for c in cut])
            for second, encoding in zip(texts, got, strict=True):
                want = library.encode(first, _first(second, cap))
                assert encoding.ids.tolist() == want.ids, (cap, first[:40], second[:40])
                assert encoding.type_ids.tolist() == want.type_ids


def test_a_cap_short_of_the_room_is_the_documents_first_tokens_exactly() -> None:
    pairs = TextPairs(load_tokenizer(MINILM / "tokenizer.json", 64), 64)
    documents = np.array(["Cats sleep for twelve to sixteen hours a day.", "short", ""],
                         dtype=object)
    cut = pairs.capped(np.array(["q"] * 3, dtype=object), documents, 3)
    assert cut.tolist() == ["Cats sleep for", "short", ""]


def test_a_huge_cap_never_tokenizes_a_huge_document_whole() -> None:
    pairs = TextPairs(load_tokenizer(MINILM / "tokenizer.json", 64), 64)
    document = "The committee reviewed every proposal in detail. " * 200_000  # 10 MB
    cut = pairs.capped(np.array(["what did the committee do?"], dtype=object),
                       np.array([document], dtype=object), 10**9)
    assert cut.tolist() == [_first(document[:10_000], pairs.room + 1)]


def test_max_tokens_is_text_pairs_positive_integer_parameter() -> None:
    assert max_tokens({}) is None
    assert max_tokens({TEXT: {"max_tokens": 5}}) is None  # the query's: not read
    assert max_tokens({TEXT_PAIR: {"max_tokens": 5, "content_type": "str"}}) == 5
    for bad in (0, -3, True, "5", 2.5):
        with pytest.raises(InvalidInput, match="input 'text_pair': parameter 'max_tokens' "
                                               "must be a positive integer"):
            max_tokens({TEXT_PAIR: {"max_tokens": bad}})


def test_check_hands_back_the_cut_as_the_step_before_queueing() -> None:
    pairs = TextPairs(load_tokenizer(MINILM / "tokenizer.json", 32), 32)
    inputs = _request(["q", "q"], [b"one two three four", "five six"])
    assert pairs.check(dict(inputs)) is None  # no cap: nothing left to do

    step = pairs.check(inputs, {TEXT_PAIR: {"max_tokens": 2}})

    assert step is not None
    assert inputs[TEXT_PAIR].tolist() == ["one two three four", "five six"]  # checked, not cut
    step()
    assert inputs[TEXT_PAIR].tolist() == ["one two", "five six"]
    with pytest.raises(InvalidInput, match="'max_tokens' must be a positive integer"):
        pairs.check(_request(["q"], ["d"]), {TEXT_PAIR: {"max_tokens": 0}})


def test_truncate_false_measures_the_pair_a_cap_makes() -> None:
    pairs = TextPairs(load_tokenizer(MINILM / "tokenizer.json", 16), 16, truncate=False)
    long_pair = _request(["a short query"], ["a document of far more words than sixteen " * 3])
    with pytest.raises(InvalidInput, match="row 0: 'text' and 'text_pair' together"):
        pairs.check(dict(long_pair))

    fits = pairs.check(dict(long_pair), {TEXT_PAIR: {"max_tokens": 10}})
    too_long = pairs.check(dict(long_pair), {TEXT_PAIR: {"max_tokens": 11}})

    assert fits is not None
    assert too_long is not None
    fits()  # 3 + 10 tokens and 3 special ones: 16
    with pytest.raises(InvalidInput, match="row 0: 'text' and 'text_pair' together"):
        too_long()
