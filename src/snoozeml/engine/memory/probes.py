"""Reading memory: the process's RSS, the host's total, and GPU memory through NVML. (Handing
memory back to the OS is snoozeml/heap.py.) On Linux both come from /proc, psutil elsewhere:
psutil is imported only where /proc cannot be read, not at every start.

The probe is the one injected piece of memory management: tests pass a fake one, GPU code paths
included. Without a GPU (or without nvidia-ml-py) the GPU side is inert and says so once.
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
import sys
from typing import Any, Protocol

from snoozeml.logs import log_event

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def process_rss() -> int:
    """Resident set size of this process in bytes."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except OSError:
        import psutil

        return int(psutil.Process().memory_info().rss)


def reset_peak_rss() -> None:
    """Start measuring the process's peak RSS from now (Linux: /proc/self/clear_refs resets
    VmHWM to the RSS now); nothing where it cannot be reset."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
    except OSError:
        pass


def peak_rss() -> int | None:
    """The process's peak RSS since the last reset (VmHWM), or None where unknown."""
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def host_total() -> int:
    """The host's physical memory in bytes: MemTotal, as psutil.virtual_memory().total reads it
    on Linux."""
    try:
        with open("/proc/meminfo", "rb") as meminfo:
            for line in meminfo:
                if line.startswith(b"MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    import psutil

    return int(psutil.virtual_memory().total)


class MemoryProbe(Protocol):
    """What memory management needs to know about devices ("cpu", "cuda:0", ...)."""

    def gpus(self) -> list[str]: ...

    def total(self, device: str) -> int: ...

    def used(self, device: str) -> int:
        """Bytes this process uses on the device (RSS for cpu; device memory for a GPU)."""
        ...

    def reset_peak(self, device: str) -> None:
        """Start measuring the device's peak use from now (see `peak`)."""
        ...

    def peak(self, device: str) -> int | None:
        """The most this process used on the device since `reset_peak`, when known (the host
        on Linux; None for a GPU, whose driver keeps no such number)."""
        ...


class _NoNvmlLibrary(Exception):
    """NVML's library does not load: what pynvml reports as NVMLError_LibraryNotFound."""


def _nvml() -> Any:
    """pynvml, NVML initialised. On Linux NVML's library is loaded first, as pynvml loads it:
    where it is missing (no NVIDIA driver, most hosts) `_NoNvmlLibrary` is raised without
    importing pynvml, a large module, at every start."""
    if sys.platform.startswith("linux") and importlib.util.find_spec("pynvml") is not None:
        try:
            ctypes.CDLL("libnvidia-ml.so.1")
        except OSError:
            raise _NoNvmlLibrary from None
    import pynvml

    pynvml.nvmlInit()
    return pynvml


def visible_gpus() -> list[str]:
    """The CUDA GPUs NVML sees ("cuda:0", ...); none without the library, a driver or a GPU."""
    try:
        pynvml = _nvml()
        try:
            return [f"cuda:{index}" for index in range(pynvml.nvmlDeviceGetCount())]
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return []


class SystemProbe:
    """psutil for the host, NVML (nvidia-ml-py) for CUDA GPUs when there are any."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._handles: dict[str, Any] = {}
        try:
            pynvml = _nvml()
            for index in range(pynvml.nvmlDeviceGetCount()):
                self._handles[f"cuda:{index}"] = pynvml.nvmlDeviceGetHandleByIndex(index)
            self._nvml = pynvml
        except Exception as exc:  # no library, no driver or no GPU: host memory only
            log_event("gpu_memory_unavailable", logging.INFO,
                      detail="no NVML GPU found; GPU budgets are inert",
                      error="NVMLError_LibraryNotFound" if isinstance(exc, _NoNvmlLibrary)
                      else type(exc).__name__)

    def gpus(self) -> list[str]:
        return list(self._handles)

    def total(self, device: str) -> int:
        if device == "cpu":
            return host_total()
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handles[device]).total)

    def reset_peak(self, device: str) -> None:
        if device == "cpu":
            reset_peak_rss()

    def peak(self, device: str) -> int | None:
        return peak_rss() if device == "cpu" else None

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
