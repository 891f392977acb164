"""Durations and sizes as written in models.toml."""

from __future__ import annotations

import pytest

from snoozeml.units import format_bytes, parse_duration, parse_size


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("100us", 100e-6),
        ("250µs", 250e-6),
        ("2ms", 0.002),
        ("1.5ms", 0.0015),
        ("30s", 30.0),
        ("0s", 0.0),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("0.5h", 1800.0),
        (" 7 s ", 7.0),
        (12, 12.0),
        (0.25, 0.25),
        ("30", 30.0),  # a bare number of seconds, as environment variables give it
    ],
)
def test_duration_is_parsed_to_seconds(text: object, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["never", "NEVER", " Never "])
def test_never_means_no_timeout_where_allowed(text: str) -> None:
    assert parse_duration(text, allow_never=True) is None


@pytest.mark.parametrize(
    "value", ["never", "abc", "5 minutes", "1d", "-1s", "", "s", -1, float("inf"), True, None]
)
def test_invalid_duration_raises_a_readable_value_error(value: object) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(value)


def test_invalid_duration_message_suggests_never_only_where_allowed() -> None:
    with pytest.raises(ValueError, match="or 'never'"):
        parse_duration("soon", allow_never=True)
    with pytest.raises(ValueError, match="invalid duration") as info:
        parse_duration("soon")
    assert "never" not in str(info.value)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        (1048576, 1048576),
        ("512", 512),
        ("512B", 512),
        ("1KiB", 1024),
        ("64MiB", 64 * 2**20),
        ("6GiB", 6 * 2**30),
        ("1.5GiB", int(1.5 * 2**30)),
        ("1TiB", 2**40),
        ("1KB", 1000),
        ("2MB", 2_000_000),
        ("3GB", 3_000_000_000),
    ],
)
def test_size_is_parsed_to_bytes(text: object, size: int) -> None:
    result = parse_size(text)
    assert result == size
    assert isinstance(result, int)


@pytest.mark.parametrize(("text", "share"), [("80%", 0.8), ("100%", 1.0), ("12.5%", 0.125)])
def test_percentage_is_a_fraction_where_allowed(text: str, share: float) -> None:
    assert parse_size(text, allow_percent=True) == pytest.approx(share)


def test_percentage_is_refused_where_not_allowed() -> None:
    with pytest.raises(ValueError, match="percentage is not allowed"):
        parse_size("80%")


@pytest.mark.parametrize("text", ["0%", "101%", "250%"])
def test_percentage_outside_zero_to_hundred_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="share"):
        parse_size(text, allow_percent=True)


@pytest.mark.parametrize("value", ["lots", "1 kib", "1Kb", "-5MiB", -1, True, 1.5, None])
def test_invalid_size_raises_a_readable_value_error(value: object) -> None:
    with pytest.raises(ValueError, match="invalid size"):
        parse_size(value, allow_percent=True)


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0B"), (1023, "1023B"), (1536, "1.5KiB"), (5 * 2**20, "5.0MiB"), (3 * 2**30, "3.0GiB")],
)
def test_format_bytes_picks_a_readable_unit(n: int, text: str) -> None:
    assert format_bytes(n) == text


def test_a_bare_fraction_string_is_a_share_where_shares_are_allowed() -> None:
    # Environment variables are strings: SNOOZE_HOST_BUDGET=0.8 means 80%, not 0 bytes.
    assert parse_size("0.8", allow_percent=True) == pytest.approx(0.8)
    assert parse_size("1048576", allow_percent=True) == 1048576
