"""Model lifecycle: the states, the events, the one pure transition table, and the FAILED
state's backoff (`LoadFailures`).

    UNLOADED --load--> LOADING --loaded--> READY --unload--> UNLOADING --unloaded--> UNLOADED
       ^                  |  |                                                          ^
       +--load_aborted----+  +--load_failed--> FAILED --load--> LOADING                 |
                                                 +------------unload--------------------+

load_aborted: the load could not start for a passing reason (no memory could be freed in
time); the model is not broken, so it goes back to UNLOADED rather than FAILED.

Invariant: a model has an instance exactly when it is READY or UNLOADING.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from snoozeml.errors import ModelLoadFailed, SnoozeError, describe_exception


class State(StrEnum):
    UNLOADED = "UNLOADED"
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    FAILED = "FAILED"


class Event(StrEnum):
    LOAD = "load"
    LOADED = "loaded"
    LOAD_FAILED = "load_failed"
    LOAD_ABORTED = "load_aborted"
    UNLOAD = "unload"
    UNLOADED = "unloaded"


class InvalidTransition(RuntimeError):
    """A bug: the engine asked for a move the table does not allow."""


TRANSITIONS: dict[tuple[State, Event], State] = {
    (State.UNLOADED, Event.LOAD): State.LOADING,
    (State.FAILED, Event.LOAD): State.LOADING,
    (State.LOADING, Event.LOADED): State.READY,
    (State.LOADING, Event.LOAD_FAILED): State.FAILED,
    (State.LOADING, Event.LOAD_ABORTED): State.UNLOADED,
    (State.READY, Event.UNLOAD): State.UNLOADING,
    (State.UNLOADING, Event.UNLOADED): State.UNLOADED,
    (State.FAILED, Event.UNLOAD): State.UNLOADED,
}


def transition(state: State, event: Event) -> State:
    """The state after `event`; raises InvalidTransition for a move the table lacks."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise InvalidTransition(f"no transition from {state.value} on {event.value}") from None


def load_backoff(failures: int, base: float = 1.0, cap: float = 300.0) -> float:
    """Seconds to wait before retrying after `failures` consecutive failed loads (1 s doubling)."""
    if failures <= 0:
        return 0.0
    return min(base * 2.0 ** (failures - 1), cap)


@dataclass(slots=True)
class LoadFailures:
    """A FAILED model's record: its failed loads in a row, the last one's error, and until when
    a request gets that error instead of another load (`load_backoff`). Only an explicit load
    skips the wait; a good load or an unload clears the record."""

    count: int = 0
    error: str = ""
    retry_at: float = 0.0  # monotonic seconds

    def record(self, exc: Exception, now: float) -> float:
        """Count a failed load at `now`; the seconds until a request may try again."""
        self.count += 1
        backoff = load_backoff(self.count)
        self.retry_at = now + backoff
        self.error = exc.message if isinstance(exc, SnoozeError) else describe_exception(exc)
        return backoff

    def refusal(self, model: str, now: float) -> ModelLoadFailed | None:
        """What a request gets at `now`, while the backoff runs; None once it may load."""
        wait = self.retry_at - now
        if wait <= 0:
            return None
        prefix = "" if self.error.startswith(f"model {model!r}") else \
            f"model {model!r} failed to load: "
        return ModelLoadFailed(prefix + self.error, retry_after=wait)

    def skip_backoff(self) -> None:
        self.retry_at = 0.0

    def clear(self) -> None:
        self.count = 0
        self.error = ""
        self.retry_at = 0.0
