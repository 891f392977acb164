"""CPU and memory accounting: the daemon's CPU time (all threads, and thread by thread), wrk's
(this process's waited-for children), this process's own, the machine's busy time, and a
process's memory lines. :class:`CpuWindow` reads them all around a measured run."""

from __future__ import annotations

import contextlib
import os
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import psutil


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) the process has used so far."""
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process and its children (a server may start helpers)."""
    total = 0.0
    with contextlib.suppress(psutil.NoSuchProcess):
        root = psutil.Process(pid)
        for proc in (root, *root.children(recursive=True)):
            with contextlib.suppress(psutil.NoSuchProcess):
                times = proc.cpu_times()
                total += times.user + times.system
    return total


def thread_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds so far of each of the process's threads, by thread id (the main thread's id
    is the pid). Python 3.11 doesn't give OS threads their Python names, so a model's worker
    is found by its CPU: the busiest thread but the main one."""
    try:
        return {t.id: t.user_time + t.system_time for t in psutil.Process(pid).threads()}
    except psutil.Error:
        return {}


def children_cpu_s() -> float:
    """CPU seconds of this process's finished (waited-for) children: wrk runs."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def machine_busy_s() -> float:
    """CPU seconds all cores have spent busy since boot (not idle, not waiting for I/O)."""
    t = psutil.cpu_times()
    return float(t.user + t.nice + t.system + getattr(t, "irq", 0.0)
                 + getattr(t, "softirq", 0.0) + getattr(t, "steal", 0.0))


@dataclass
class CpuWindow:
    """CPU seconds spent while the ``with`` block ran: by the process ``pid`` (all threads and
    each thread), by this process's children (wrk), by this process, and by the whole machine.
    """

    pid: int
    wall_s: float = 0.0
    process_s: float = 0.0
    threads_s: dict[int, float] = field(default_factory=dict)
    children_s: float = 0.0
    own_s: float = 0.0
    machine_s: float = 0.0

    def __enter__(self) -> CpuWindow:
        self._threads = thread_cpu_s(self.pid)
        self._marks = (time.monotonic(), process_cpu_s(self.pid), children_cpu_s(),
                       own_cpu_s(), machine_busy_s())
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        wall, process, children, own, machine = self._marks
        self.wall_s = max(time.monotonic() - wall, 1e-9)
        self.process_s = process_cpu_s(self.pid) - process
        self.children_s = children_cpu_s() - children
        self.own_s = own_cpu_s() - own
        self.machine_s = machine_busy_s() - machine
        self.threads_s = {tid: s - self._threads.get(tid, 0.0)
                          for tid, s in thread_cpu_s(self.pid).items()}

    @property
    def loop_s(self) -> float:
        """The main thread's: the daemon's event loop (HTTP, codecs, scheduling)."""
        return self.threads_s.get(self.pid, 0.0)

    @property
    def busiest_other_s(self) -> float:
        """The busiest other thread's: a model's worker, when one model has the traffic."""
        return max((s for tid, s in self.threads_s.items() if tid != self.pid), default=0.0)

    def cores(self, seconds: float) -> float:
        """CPU seconds as cores: per wall second of the window."""
        return seconds / self.wall_s


def status_bytes(key: str, pid: int | str = "self") -> int | None:
    """A memory line of ``/proc/PID/status`` (VmRSS, VmHWM) in bytes; None without one."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) * 1024
    return None


def reset_peak(pid: int | str = "self") -> None:
    """Reset the process's VmHWM to its RSS now (Linux), so VmHWM then reads the peak since."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/clear_refs").write_text("5")


def cpu_count() -> int:
    return os.cpu_count() or 0
