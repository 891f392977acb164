"""The HTTP protocol builds on uvicorn's private names; an upgrade that removes one fails here,
naming it, rather than at a request."""

from __future__ import annotations

import tomllib
import types
from pathlib import Path

import uvicorn

from snoozeml.api.http.uvicorn_private import (
    REQUIRED,
    SUPPORTED,
    installed,
    missing,
    missing_from,
    unsupported_uvicorn,
)

ROOT = Path(__file__).parents[4]


def test_the_installed_uvicorn_has_every_private_name_the_daemon_uses() -> None:
    assert missing() == [], (f"uvicorn {uvicorn.__version__} lacks {missing()}: see "
                             "src/snoozeml/api/http/uvicorn_private.py")
    assert unsupported_uvicorn() is None


def _without(subject: object, name: str) -> types.SimpleNamespace:
    """A stand-in holding what `subject` has of its REQUIRED names, except `name`."""
    cls = type(subject).__name__
    kept = {n: getattr(subject, n) for n in REQUIRED[cls] if n != name}
    return types.SimpleNamespace(**kept)


def test_a_removed_private_name_is_named() -> None:
    subjects = installed()
    subjects["HttpToolsProtocol"] = _without(subjects["HttpToolsProtocol"], "_start_asgi_task")
    subjects["FlowControl"] = _without(subjects["FlowControl"], "read_paused")
    assert missing_from(subjects) == ["HttpToolsProtocol._start_asgi_task",
                                      "FlowControl.read_paused"]


def test_every_required_name_is_checked_on_a_real_object() -> None:
    subjects = installed()
    assert set(subjects) == set(REQUIRED)
    # Instance attributes count: uvicorn sets `url` at a request's first byte, `cycle` and
    # `pipeline` in __init__; none of them is on the class.
    protocol = subjects["HttpToolsProtocol"]
    for name in ("url", "cycle", "pipeline"):
        assert not hasattr(type(protocol), name)
        assert hasattr(protocol, name)


def test_pyproject_allows_only_the_supported_uvicorn_and_constraints_pin_one_inside() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    declared = [d for d in project["project"]["dependencies"] if d.startswith("uvicorn")]
    assert declared == [f"uvicorn[standard]{SUPPORTED}"]
    pins = [line for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines()
            if line.startswith("uvicorn")]
    assert len(pins) == 1, pins
    name, _, pinned = pins[0].partition("==")
    assert name == "uvicorn", pins
    low, high = (bound.lstrip("<>=") for bound in SUPPORTED.split(","))
    assert _version(low) <= _version(pinned) < _version(high)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))
