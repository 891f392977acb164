"""Requests' blocking preparation (engine/requests/preparation.py): steps run on the pool's own
threads, off the event loop, several at once, and their errors reach the caller."""

from __future__ import annotations

import asyncio
import threading

import pytest

from snoozeml.engine.requests.preparation import Preparation, default_threads
from snoozeml.errors import InvalidInput


def test_steps_run_on_the_pool_threads_several_at_once() -> None:
    async def main() -> set[str]:
        preparation = Preparation(threads=2)
        both = threading.Barrier(2, timeout=10)  # each step waits for the other: in parallel
        names: set[str] = set()
        loop_thread = threading.current_thread().name

        def step() -> None:
            both.wait()
            names.add(threading.current_thread().name)
            assert threading.current_thread().name != loop_thread

        await asyncio.gather(preparation.run(step), preparation.run(step))
        preparation.close()
        return names

    names = asyncio.run(main())
    assert len(names) == 2
    assert all(name.startswith("snooze-prepare") for name in names)


def test_a_step_error_is_the_callers() -> None:
    def step() -> None:
        raise InvalidInput("input 'image': row 3 is empty")

    async def main() -> None:
        preparation = Preparation(threads=1)
        try:
            await preparation.run(step)
        finally:
            preparation.close()

    with pytest.raises(InvalidInput, match="row 3 is empty"):
        asyncio.run(main())


def test_the_pool_has_a_thread_a_core_within_bounds() -> None:
    assert 2 <= default_threads() <= 8
