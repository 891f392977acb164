"""snoozeml/heap.py: glibc's functions are the ones ctypes.util.find_library finds (without
its child process); the cyclic GC's start-up pause: off until resumed, frozen only when the
daemon says so, and a collector someone else turned off is left off."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from collections.abc import Iterator

import pytest

from snoozeml.heap import _glibc, pause_collection, resume_collection


def address(function: object) -> int | None:
    return None if function is None else ctypes.cast(function, ctypes.c_void_p).value


@pytest.mark.parametrize("name", ["malloc_trim", "mallopt"])
def test_glibcs_functions_are_those_find_library_finds(name: str) -> None:
    library = ctypes.util.find_library("c")
    expected = getattr(ctypes.CDLL(library), name, None) if library else None
    assert address(_glibc(name)) == address(expected)


@pytest.fixture(autouse=True)
def collector_restored() -> Iterator[None]:
    enabled = gc.isenabled()
    yield
    resume_collection(freeze=False)
    gc.unfreeze()
    if enabled:
        gc.enable()
    else:
        gc.disable()


def test_paused_until_resumed_without_freezing() -> None:
    gc.enable()
    pause_collection()
    assert not gc.isenabled()
    resume_collection(freeze=False)
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_the_daemons_resume_freezes_what_exists() -> None:
    gc.enable()
    pause_collection()
    kept = [object() for _ in range(10)]
    resume_collection(freeze=True)
    assert gc.isenabled()
    assert gc.get_freeze_count() >= len(kept)


def test_a_collector_that_was_off_stays_off() -> None:
    gc.disable()
    pause_collection()
    resume_collection(freeze=True)
    assert not gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_resuming_twice_or_without_a_pause_changes_nothing() -> None:
    gc.enable()
    pause_collection()
    resume_collection(freeze=False)
    gc.disable()  # someone else's choice, after the pause ended
    resume_collection(freeze=True)
    assert not gc.isenabled()
    assert gc.get_freeze_count() == 0
