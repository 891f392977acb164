"""The throughput scenario's profile: py-spy on the daemon while wrk serves the MLP 512 over
JSON at c64, its samples summed by thread and by function group."""

from __future__ import annotations

import argparse
import collections
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from harness.daemon import Daemon

# Function groups. A sample counts for the innermost frame that names a group (so a sample in
# libc's realloc under orjson counts for orjson); frames without a name of their own
# ("0x7f… (libc.so.6)") name only their library. Native frames come from --native
# ("uv__read (stream.c:1063)", "0x7f… (orjson/orjson.cpython-311-….so)"), Python frames are
# "function (file.py:line)".
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("onnxruntime run", ("onnxruntime", "Mlas", "mlas")),
    ("JSON (orjson)", ("orjson",)),
    ("our codec (api/codec.py)", ("snoozeml/api/codec",)),
    ("numpy", ("numpy",)),
    ("batching, queue, hand-off between threads", (
        "snoozeml/engine/batch", "snoozeml/engine/replicas", "snoozeml/runtime/stacking",
        "concurrent/futures", "call_soon_threadsafe", "asyncio/futures", "Future",
    )),
    ("HTTP (uvicorn, httptools, starlette)", ("uvicorn", "httptools", "starlette")),
    ("our request path (fastpath, boundary, manager, events)", ("snoozeml/",)),
    ("socket reads and writes", ("uv__read", "uv__write", "uv__try_write", "writev", "uv_try")),
    ("event loop (uvloop, asyncio)", ("loop.c", "uv_run", "uv__", "asyncio", "uvloop")),
    ("gRPC", ("grpc",)),
)
IDLE = "idle (blocked, waiting for work or I/O)"


def group_of(frames: Sequence[str]) -> str:
    """The function group of one sample (frames from the root to the leaf)."""
    stack = ";".join(frames)
    named = [f for f in frames if not f.startswith("0x") or "(lib" not in f]
    if named and named[-1].startswith("epoll_pwait") and "uv__io_poll" in stack:
        return IDLE  # the event loop waiting for sockets
    if "_queue_SimpleQueue_get" in stack and "_WorkItem.run" not in stack:
        return IDLE  # an executor thread waiting for its next job
    if "_poll_wrapper" in stack or "Condition.wait" in stack or "Event.wait" in stack:
        return IDLE
    for frame in reversed(named):
        for group, needles in GROUPS:
            if any(needle in frame for needle in needles):
                return group
    return "other (interpreter, libc)"


def find_py_spy(args: argparse.Namespace) -> str | None:
    """py-spy on PATH or next to the benchmark's Python (bench/setup.sh installs it there)."""
    found = shutil.which("py-spy") or str(Path(args.python).parent / "py-spy")
    return found if Path(found).exists() else None



def profile(daemon: Daemon, args: argparse.Namespace, serve: Callable[[float], dict[str, Any]],
            workdir: Path) -> dict[str, Any]:
    """py-spy on the daemon while ``serve(seconds)`` loads it; samples by thread and group."""
    py_spy = find_py_spy(args)
    if py_spy is None:
        raise RuntimeError("py-spy not found; run: bash bench/setup.sh")
    out = workdir / "profile.txt"
    loaded: dict[str, Any] = {}
    wrk = threading.Thread(target=lambda: loaded.update(serve(args.profile_duration + 3)))
    wrk.start()
    time.sleep(1.5)  # the load is under way before the first sample
    cmd = [py_spy, "record", "--pid", str(daemon.pid), "--native", "--idle", "--threads",
           "--rate", str(args.profile_rate), "--duration", str(round(args.profile_duration)),
           "--format", "raw", "--output", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wrk.join()
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"py-spy failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    if args.keep_profile is not None:
        shutil.copyfile(out, args.keep_profile)
    return {"wrk": loaded, **summarize_profile(out.read_text(encoding="utf-8"))}


def summarize_profile(raw: str) -> dict[str, Any]:
    """Samples by thread, and by thread and group (idle samples apart), from py-spy's raw
    (collapsed) output with --threads: 'thread;frame;…;leaf COUNT' per line."""
    by_thread: collections.Counter[str] = collections.Counter()
    by_group: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    by_function: dict[str, collections.Counter[str]] = collections.defaultdict(
        collections.Counter
    )
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        thread = frames[0].strip()
        by_thread[thread] += int(count)
        group = group_of(frames)
        by_group[thread][group] += int(count)
        if group != IDLE:
            python = [f for f in frames if ".py:" in f]
            if python:  # the innermost Python function, without its line
                by_function[thread][python[-1].rsplit(":", 1)[0] + ")"] += int(count)
    return {
        "by_thread": dict(by_thread.most_common()),
        "by_group": {thread: dict(groups.most_common()) for thread, groups in by_group.items()},
        "by_function": {
            thread: dict(functions.most_common(12)) for thread, functions in by_function.items()
        },
    }


def profile_lines(prof: dict[str, Any], args: argparse.Namespace, case: str) -> list[str]:
    served = prof["wrk"]
    lines = [
        f"#### Profile: {case}",
        "",
        f"`py-spy record --native --idle --threads --rate {args.profile_rate} --duration "
        f"{args.profile_duration:g}` on the daemon while wrk served it "
        f"({served.get('requests_per_s', 0):,.0f} req/s under the profiler). Each thread's "
        "samples by the innermost frame that names a group; *idle* is a thread blocked "
        "waiting for work or I/O. py-spy's native stacks don't name `take_gil` here, so a "
        "thread waiting for the GIL counts under the frame that waits.",
        "",
    ]
    by_thread: dict[str, int] = prof["by_thread"]
    quiet = []
    for thread, count in by_thread.items():
        groups: dict[str, int] = prof["by_group"][thread]
        if groups.get(IDLE, 0) >= 0.98 * count:
            quiet.append(thread)
            continue
        functions: dict[str, int] = prof["by_function"].get(thread, {})
        lines += [
            f"- **{thread}** ({count} samples)",
            *(f"  - {group}: {n / count:.0%}" for group, n in groups.items() if n >= 0.01 * count),
            "  - innermost Python functions of its busy samples: "
            + ", ".join(f"`{f}` {n / count:.0%}" for f, n in functions.items()
                        if n >= 0.01 * count),
        ]
    if quiet:
        lines.append(f"- idle 98% of the time or more: {', '.join(quiet)}")
    return lines
