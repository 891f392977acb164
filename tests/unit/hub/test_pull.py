"""The part of `snooze pull` that needs no Hub (hub/pull.py): reading a repository reference and
its revision."""

from __future__ import annotations

import pytest

from snoozeml.hub import InvalidReference, parse_reference


@pytest.mark.parametrize(("text", "revision", "expected"), [
    ("org/name", None, ("org/name", None)),
    ("org/name@v1.0", None, ("org/name", "v1.0")),
    ("org/name", "dev", ("org/name", "dev")),
    ("org/name@dev", "dev", ("org/name", "dev")),
    ("gpt2", None, ("gpt2", None)),
])
def test_parse_reference(text: str, revision: str | None,
                         expected: tuple[str, str | None]) -> None:
    assert parse_reference(text, revision) == expected


@pytest.mark.parametrize(("text", "revision"), [
    ("org/name@v1", "v2"), ("org/name@", None), ("a/b/c", None), ("org/na--me", None),
    ("org/name", ""), ("org/name", "  "),
])
def test_parse_reference_refuses(text: str, revision: str | None) -> None:
    with pytest.raises(InvalidReference):
        parse_reference(text, revision)
