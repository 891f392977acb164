"""The report every scenario prints: the machine line and the command it ran, markdown tables,
and the outcome (the markdown, the raw numbers for ``--json``, pass or fail)."""

from __future__ import annotations

import os
import platform
import shlex
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.load import wrk_version


@dataclass
class Outcome:
    """What a scenario hands back: its markdown report, its raw numbers (``--json``), and
    whether it passed (the soak test fails; a benchmark only measures)."""

    markdown: str
    raw: dict[str, Any] | None = None
    passed: bool = True


def cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    except OSError:
        return platform.processor() or "unknown CPU"
    for line in text.splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def command_line() -> str:
    """How this run was started, for the report (the interpreter relative to the current
    folder when it lies inside it)."""
    python = sys.executable
    relative = os.path.relpath(python)
    return shlex.join([python if relative.startswith("..") else relative, *sys.argv])


def machine_line() -> str:
    """Date, platform, CPUs, CPU model, Python, onnxruntime and wrk versions, load average."""
    import onnxruntime as ort

    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    return (
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {platform.platform()}; "
        f"{os.cpu_count()} CPUs ({cpu_model()}); Python {platform.python_version()}; "
        f"onnxruntime {ort.__version__}; {wrk_version()}; load average at start {load}"
    )


def yes(met: bool) -> str:
    return "yes" if met else "**no**"


def table(header: Sequence[str], rows: Iterable[Sequence[object]],
          align: str | None = None) -> list[str]:
    """A markdown table: ``align`` has one letter a column, ``l`` or ``r`` (default: the first
    column left, the others right)."""
    align = align or "l" + "r" * (len(header) - 1)
    lines = ["| " + " | ".join(header) + " |",
             "| " + " | ".join("---:" if a == "r" else "---" for a in align) + " |"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return lines


def mib(count: float | None) -> str:
    return "—" if count is None else f"{count / 2**20:,.1f}"
