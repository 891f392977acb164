"""Reading memory: the process's RSS, the host's total, and GPU memory through NVML.

The probe is the one injected piece of memory management: tests pass a fake one, GPU code paths
included. Without a GPU (or without nvidia-ml-py) the GPU side is inert and says so once.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import os
import weakref
from collections.abc import Callable
from typing import Any, Protocol, cast

import psutil

from snoozeml.logs import log_event

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _glibc(function: str, *argtypes: Any) -> Callable[..., int] | None:
    """A glibc function, or None where the C library is not glibc (musl, macOS)."""
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        found = getattr(ctypes.CDLL(name), function)
    except (OSError, AttributeError):
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


def process_rss() -> int:
    """Resident set size of this process in bytes."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except OSError:
        return int(psutil.Process().memory_info().rss)


def host_total() -> int:
    return int(psutil.virtual_memory().total)


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


class MemoryProbe(Protocol):
    """What memory management needs to know about devices ("cpu", "cuda:0", ...)."""

    def gpus(self) -> list[str]: ...

    def total(self, device: str) -> int: ...

    def used(self, device: str) -> int:
        """Bytes this process uses on the device (RSS for cpu; device memory for a GPU)."""
        ...


class SystemProbe:
    """psutil for the host, NVML (nvidia-ml-py) for CUDA GPUs when there are any."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._handles: dict[str, Any] = {}
        try:
            import pynvml

            pynvml.nvmlInit()
            for index in range(pynvml.nvmlDeviceGetCount()):
                self._handles[f"cuda:{index}"] = pynvml.nvmlDeviceGetHandleByIndex(index)
            self._nvml = pynvml
        except Exception as exc:  # no library, no driver or no GPU: host memory only
            log_event("gpu_memory_unavailable", logging.INFO,
                      detail="no NVML GPU found; GPU budgets are inert",
                      error=type(exc).__name__)

    def gpus(self) -> list[str]:
        return list(self._handles)

    def total(self, device: str) -> int:
        if device == "cpu":
            return host_total()
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handles[device]).total)

    def used(self, device: str) -> int:
        if device == "cpu":
            return process_rss()
        handle = self._handles[device]
        pid = os.getpid()
        try:
            procs = self._nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            return sum(int(p.usedGpuMemory or 0) for p in procs if p.pid == pid)
        except Exception:  # some drivers hide per-process use: fall back to the device's
            return int(self._nvml.nvmlDeviceGetMemoryInfo(handle).used)
