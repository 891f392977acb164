"""The C heap under Python: capping glibc's malloc arenas, trimming free pages back to the OS,
and dropping a large object so that its memory really goes; and Python's cyclic garbage
collector, paused while the daemon starts.

Below both `engine/` and `runtime/`: backends free their models with it, the engine trims after
loads and unloads. Where the C library is not glibc (musl, macOS) the glibc calls are no-ops.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import weakref
from collections.abc import Callable
from typing import Any, cast


def _glibc(function: str, *argtypes: Any) -> Callable[..., int] | None:
    """A glibc function, or None where the C library is not glibc (musl, macOS). glibc is
    opened by its soname, what ctypes.util.find_library("c") finds for it: find_library runs
    `ldconfig -p` in a child process (a few milliseconds, twice a start), so it is asked only
    where there is no libc.so.6."""
    try:
        library = ctypes.CDLL("libc.so.6")
    except OSError:
        name = ctypes.util.find_library("c")
        if not name:
            return None
        try:
            library = ctypes.CDLL(name)
        except OSError:
            return None
    try:
        found = getattr(library, function)
    except AttributeError:
        return None
    found.argtypes = list(argtypes)
    found.restype = ctypes.c_int
    return cast("Callable[..., int]", found)


_MALLOC_TRIM = _glibc("malloc_trim", ctypes.c_size_t)
_M_ARENA_MAX = -8  # glibc's mallopt parameter


def limit_malloc_arenas(arenas: int = 2) -> bool:
    """Cap glibc's malloc arenas (its default is 8 per core) unless MALLOC_ARENA_MAX is set.

    Each model's worker thread would otherwise get an arena of its own, and memory freed when a
    model is evicted stays in that arena: under load-evict churn the RSS rose well above the
    budget (183 MiB over the baseline for a 150 MiB budget, 160 MiB with two arenas). Call it
    before the threads start; returns whether the cap was set."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    mallopt = _glibc("mallopt", ctypes.c_int, ctypes.c_int)
    return mallopt is not None and bool(mallopt(_M_ARENA_MAX, arenas))


def release_memory_blocking() -> None:
    """Ask glibc to return free heap pages to the OS (cheap: well under a millisecond)."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def drop_attribute_blocking(owner: object, name: str) -> None:
    """Delete `owner.name`, which should free it, and collect garbage only if a reference
    cycle keeps it alive after all: a full collection holds the GIL for 10+ ms in a process
    this size, stalling every request, and is almost never needed."""
    try:
        ref: weakref.ref[object] | None = weakref.ref(getattr(owner, name))
    except TypeError:  # not weak-referenceable: no way to tell, so collect
        ref = None
    delattr(owner, name)
    if ref is None or ref() is not None:
        gc.collect()


_collection_paused = False


def pause_collection() -> None:
    """Turn the cyclic garbage collector off for the process's start-up, until
    `resume_collection`. A start builds some 100,000 objects that live as long as the process
    (modules, classes, the config, the servers) and little garbage: the collector, run every
    700 allocations, walked them again and again, about 4% of a start. Nothing if it is off."""
    global _collection_paused
    if gc.isenabled():
        gc.disable()
        _collection_paused = True


def resume_collection(freeze: bool) -> None:
    """End `pause_collection`'s pause, if there is one. `freeze`: what exists now is moved out
    of every later collection first (gc.freeze): the daemon's start-up, which lives for good,
    is then never walked again (not at the first collection, which would walk all of it at
    once, nor at each full collection after); the garbage among it (a few thousand objects)
    is never freed."""
    global _collection_paused
    if _collection_paused:
        _collection_paused = False
        if freeze:
            gc.freeze()
        gc.enable()
