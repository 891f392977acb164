"""Requests' blocking preparation (decoding and preprocessing images), on a small pool of its
own: off the event loop, and beside the models' worker threads, so that the next requests are
being prepared while a model runs the last ones. Pillow and numpy let go of the GIL for most of
this work, so the pool's threads run in parallel on as many cores."""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor

from snoozeml.runtime.base import Prepare


def default_threads() -> int:
    """One thread a core this process may run on, from 2 to 8."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 2
    return max(2, min(8, cores))


class Preparation:
    """The pool, started at its first step (a daemon whose models take no images has none)."""

    def __init__(self, threads: int | None = None) -> None:
        self._threads = threads or default_threads()
        self._pool: ThreadPoolExecutor | None = None

    async def run(self, step: Prepare) -> None:
        """Run `step` on the pool; its exception is raised here. A caller cancelled meanwhile
        stops waiting (the step, once started, finishes on its thread)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="snooze-prepare")
        await asyncio.get_running_loop().run_in_executor(self._pool, step)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
