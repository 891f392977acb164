"""Blocking work with a deadline the event loop can enforce, even when the work never returns.

A model load runs code the daemon does not control (onnxruntime reading a file on a hung
network mount, a user's torch factory waiting on a lock). Python cannot stop a thread, so a
load past its deadline is *abandoned*: the caller gets `Abandoned` at once and goes on, and the
thread, when it ever finishes, hands its result to `on_late` (which closes it) instead of to
the caller, and then says so with `on_end` (a model does not start a load while the last one it
abandoned still runs).

Each call runs on a daemon thread of its own, not on a pool: a hung call must not hold a pool
worker that other loads need, nor keep the process from exiting.

Invariant: exactly one of the caller and `on_late` receives the result. The handoff is decided
under one lock: the thread delivers unless the caller abandoned first; the caller abandons
unless the thread delivered first (then it takes the result, however late by a hair).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from functools import partial
from typing import Generic, TypeVar

from snoozeml.errors import LoadTimeout, describe_exception
from snoozeml.logs import log_event

T = TypeVar("T")


class Abandoned(Exception):
    """The work did not finish in time (or its caller was cancelled) and was left behind."""


class _Handoff(Generic[T]):
    def __init__(self, loop: asyncio.AbstractEventLoop, on_late: Callable[[T], None],
                 on_end: Callable[[], None]) -> None:
        self.loop = loop
        self.future: asyncio.Future[T] = loop.create_future()
        self.lock = threading.Lock()
        self.delivered = False
        self.abandoned = False
        self.on_late = on_late
        self.on_end = on_end

    def run(self, work: Callable[[], T], name: str) -> None:
        """The thread's body: run `work`, then deliver its outcome or dispose of it."""
        try:
            try:
                result = work()
            except BaseException as exc:  # handed to the caller, or logged once abandoned
                if self._deliver(exc, None):
                    return
                log_event("abandoned_work_failed", logging.WARNING, work=name,
                          error=describe_exception(exc))
                return
            if self._deliver(None, result):
                return
            log_event("abandoned_work_finished", logging.WARNING, work=name)
            _run_late(self.on_late, name, result)
        finally:
            if self.abandoned:  # final by now: the handoff was decided one way or the other
                self._call_on_loop(self.on_end)

    def _deliver(self, exc: BaseException | None, result: T | None) -> bool:
        with self.lock:
            if self.abandoned:
                return False
            self.delivered = True
        # False when the loop is gone: nobody waits for the result any more.
        return self._call_on_loop(self._settle, exc, result)

    def _settle(self, exc: BaseException | None, result: T | None) -> None:
        if self.future.done():
            return
        if exc is not None:
            self.future.set_exception(exc)
        else:
            self.future.set_result(result)  # type: ignore[arg-type]

    def _call_on_loop(self, fn: Callable[..., None], *args: object) -> bool:
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: the process is ending
            return False
        return True

    def abandon(self) -> bool:
        """True when the caller may go: the thread had not delivered yet."""
        with self.lock:
            if self.delivered:
                return False
            self.abandoned = True
            return True


async def run_within(
    seconds: float | None,
    work: Callable[[], T],
    *,
    name: str,
    on_late: Callable[[T], None],
    on_abandon: Callable[[], None] = lambda: None,
    on_end: Callable[[], None] = lambda: None,
) -> T:
    """`work()` on a thread of its own; its result, or `Abandoned` after `seconds`
    (None: no limit). Cancelling the caller abandons the work too. `on_late` runs on a thread
    with a result that arrives after the caller has gone. When the work is abandoned,
    `on_abandon` runs at once and `on_end` when its thread ends (on the loop, if it still
    runs), however it ended."""
    handoff: _Handoff[T] = _Handoff(asyncio.get_running_loop(), on_late, on_end)
    threading.Thread(target=handoff.run, args=(work, name), name=f"snooze-{name}",
                     daemon=True).start()
    try:
        return await asyncio.wait_for(asyncio.shield(handoff.future), seconds)
    except TimeoutError:
        if handoff.abandon():
            on_abandon()
            raise Abandoned(name) from None
    except asyncio.CancelledError:
        if handoff.abandon():
            on_abandon()
        else:  # delivered already: nobody will use the result, so it goes to on_late too
            handoff.future.add_done_callback(partial(_dispose, on_late, name))
        raise
    # Delivered while the timeout fired: the outcome is on its way to the future.
    return await handoff.future


def _dispose(on_late: Callable[[T], None], name: str, future: asyncio.Future[T]) -> None:
    if future.cancelled() or future.exception() is not None:
        return
    threading.Thread(target=_run_late, args=(on_late, name, future.result()),
                     name=f"snooze-{name}-close", daemon=True).start()


def _run_late(on_late: Callable[[T], None], name: str, result: T) -> None:
    try:
        on_late(result)
    except Exception as exc:  # a thread's boundary: nobody else will see this
        log_event("abandoned_work_failed", logging.WARNING, work=name,
                  error=describe_exception(exc))


def _drop(result: object) -> None:
    pass  # nothing to close: plain data, collected with the thread


class ModelFiles:
    """One model's blocking work on its files (reading their sizes, importing its code, the
    load itself), each call on a thread of its own and cut at the model's load_timeout.

    While the thread of a cut call still runs, no new call starts (LoadTimeout at once): a file
    that hung once will likely hang again, and each try would leave one more thread behind."""

    def __init__(self, model: str, load_timeout: float, now: Callable[[], float]) -> None:
        self.model = model
        self.load_timeout = load_timeout
        self.abandoned = 0  # threads of cut calls still running
        self._now = now

    async def run(self, what: str, work: Callable[[], T], deadline: float | None = None,
                  on_late: Callable[[T], None] = _drop) -> T:
        """`work()`, cut at `deadline` (default: load_timeout from now); `what` names it in
        the error ("the load")."""
        if self.abandoned:
            raise LoadTimeout(f"work on the model's files abandoned after load_timeout "
                              f"({self.load_timeout:g}s) is still running; no new load "
                              "starts until it ends")
        seconds = self.load_timeout if deadline is None else max(deadline - self._now(), 0.0)
        try:
            return await run_within(seconds, work, name=f"load-{self.model}", on_late=on_late,
                                    on_abandon=self._abandoned, on_end=self._ended)
        except Abandoned:
            raise LoadTimeout(f"{what} did not finish within load_timeout "
                              f"({self.load_timeout:g}s) and was abandoned") from None

    def _abandoned(self) -> None:
        self.abandoned += 1

    def _ended(self) -> None:
        self.abandoned -= 1
        log_event("abandoned_load_ended", model=self.model, still_running=self.abandoned)
