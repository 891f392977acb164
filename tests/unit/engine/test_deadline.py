"""engine/deadline.py: blocking work abandoned past its deadline, its late result closed, and no
new work started on a model's files while abandoned work still runs. Real threads; the work
blocks on events the test sets, never on sleeps."""

from __future__ import annotations

import asyncio
import threading

import pytest

from snoozeml.engine.deadline import Abandoned, ModelFiles, run_within
from snoozeml.errors import LoadTimeout


def test_work_that_finishes_in_time_returns_its_result() -> None:
    async def main() -> int:
        return await run_within(5.0, lambda: 41 + 1, name="t", on_late=lambda _: None)

    assert asyncio.run(main()) == 42


def test_its_exception_reaches_the_caller() -> None:
    def fail() -> int:
        raise ValueError("bad file")

    async def main() -> int:
        return await run_within(5.0, fail, name="t", on_late=lambda _: None)

    with pytest.raises(ValueError, match="bad file"):
        asyncio.run(main())


def test_work_past_its_deadline_is_abandoned_and_its_late_result_goes_to_on_late() -> None:
    release = threading.Event()
    late: list[str] = []
    closed = threading.Event()
    events: list[str] = []

    def work() -> str:
        release.wait(30)
        return "instance"

    def on_late(result: str) -> None:
        late.append(result)
        closed.set()

    async def main() -> None:
        ended = asyncio.Event()

        def on_end() -> None:
            events.append("end")
            ended.set()

        with pytest.raises(Abandoned):
            await run_within(0.05, work, name="t", on_late=on_late,
                             on_abandon=lambda: events.append("abandoned"), on_end=on_end)
        assert events == ["abandoned"]
        release.set()
        await asyncio.wait_for(ended.wait(), 30)

    asyncio.run(main())
    assert closed.wait(30)
    assert late == ["instance"]
    assert events == ["abandoned", "end"]


def test_a_cancelled_caller_abandons_the_work_too() -> None:
    release = threading.Event()
    late: list[str] = []
    started = threading.Event()

    def work() -> str:
        started.set()
        release.wait(30)
        return "instance"

    async def main() -> None:
        ended = asyncio.Event()
        task = asyncio.ensure_future(run_within(None, work, name="t", on_late=late.append,
                                                on_end=ended.set))
        await asyncio.to_thread(started.wait, 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()
        await asyncio.wait_for(ended.wait(), 30)

    asyncio.run(main())
    assert late == ["instance"]


def test_no_new_work_on_a_models_files_starts_while_abandoned_work_runs() -> None:
    release = threading.Event()
    calls: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        files = ModelFiles("m", 0.05, loop.time)

        def hang() -> None:
            calls.append("hang")
            release.wait(30)

        with pytest.raises(LoadTimeout, match=r"did not finish within load_timeout \(0.05s\)"):
            await files.run("the load", hang)
        assert files.abandoned == 1
        with pytest.raises(LoadTimeout, match="is still running"):
            await files.run("the load", lambda: calls.append("second"))
        release.set()
        # Its thread's end arrives as a loop callback: yield to the loop until it has run.
        while files.abandoned:  # noqa: ASYNC110 - no event to wait on, only loop turns
            await asyncio.sleep(0)
        assert await files.run("the load", lambda: "again") == "again"

    asyncio.run(main())
    assert calls == ["hang"]
