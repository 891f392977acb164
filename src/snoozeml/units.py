"""Parsing of the human units used in models.toml: durations and memory sizes."""

from __future__ import annotations

import math
import re

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(us|µs|ms|s|m|h)?\s*$")
_DURATION_SECONDS = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB|TiB|KB|MB|GB|TB|%)?\s*$")
_SIZE_BYTES = {
    None: 1,
    "B": 1,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "TiB": 1024**4,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "TB": 1000**4,
}


def parse_duration(value: object, *, allow_never: bool = False) -> float | None:
    """Seconds from "30s", "2ms", "100us", "5m", "1h" or a bare number of seconds ("30" too,
    as environment variables are strings).

    Returns None for "never" when `allow_never`. Raises ValueError with a readable message.
    """
    if isinstance(value, bool):
        raise ValueError(f"invalid duration {value!r}")
    if isinstance(value, int | float):
        if value < 0 or not math.isfinite(value):
            raise ValueError(f"invalid duration {value!r}: must be a non-negative number")
        return float(value)
    if isinstance(value, str):
        if allow_never and value.strip().lower() == "never":
            return None
        match = _DURATION.match(value)
        if match:
            return float(match.group(1)) * _DURATION_SECONDS[match.group(2) or "s"]
    hint = "'30s', '2ms', '5m'" + (" or 'never'" if allow_never else "")
    raise ValueError(f"invalid duration {value!r} (expected e.g. {hint})")


def parse_size(value: object, *, allow_percent: bool = False) -> int | float:
    """Bytes from "64MiB", "6GiB", 1048576; or a fraction (0..1] from "80%" or 0.8 when
    allowed.

    A percentage comes back as a float fraction, an absolute size as an int of bytes.
    """
    if isinstance(value, bool):
        raise ValueError(f"invalid size {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"invalid size {value!r}: must not be negative")
        return value
    if isinstance(value, float) and allow_percent:
        if not 0 < value <= 1:
            raise ValueError(f"invalid size {value!r}: a share must be in (0, 1]")
        return value
    if isinstance(value, str):
        match = _SIZE.match(value)
        if match:
            number, unit = float(match.group(1)), match.group(2)
            if unit is None and allow_percent and "." in match.group(1):
                # "0.8", as an environment variable gives it: a share, like the float 0.8.
                return parse_size(number, allow_percent=True)
            if unit == "%":
                if not allow_percent:
                    raise ValueError(f"invalid size {value!r}: a percentage is not allowed here")
                if not 0 < number <= 100:
                    raise ValueError(f"invalid size {value!r}: a share must be in (0%, 100%]")
                return number / 100.0
            return int(number * _SIZE_BYTES[unit])
    hint = "'64MiB', '6GiB'" + (" or '80%'" if allow_percent else "")
    raise ValueError(f"invalid size {value!r} (expected e.g. {hint})")


def format_bytes(n: float) -> str:
    """1536 -> '1.5KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return f"{n:.1f}TiB"  # pragma: no cover
