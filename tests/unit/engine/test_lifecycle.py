"""The pure lifecycle table, the load backoff, and a FAILED model's record of it."""

from __future__ import annotations

import pytest

from snoozeml.engine.lifecycle import (
    TRANSITIONS,
    Event,
    InvalidTransition,
    LoadFailures,
    State,
    load_backoff,
    transition,
)
from snoozeml.errors import ModelLoadFailed, ModelTooLarge

ALLOWED = [
    (State.UNLOADED, Event.LOAD, State.LOADING),
    (State.FAILED, Event.LOAD, State.LOADING),
    (State.LOADING, Event.LOADED, State.READY),
    (State.LOADING, Event.LOAD_FAILED, State.FAILED),
    (State.LOADING, Event.LOAD_ABORTED, State.UNLOADED),  # not broken: no FAILED, no backoff
    (State.READY, Event.UNLOAD, State.UNLOADING),
    (State.UNLOADING, Event.UNLOADED, State.UNLOADED),
    (State.FAILED, Event.UNLOAD, State.UNLOADED),
]


@pytest.mark.parametrize(("state", "event", "after"), ALLOWED)
def test_allowed_transition_leads_to_the_documented_state(
    state: State, event: Event, after: State
) -> None:
    assert transition(state, event) is after


def test_the_table_holds_exactly_the_documented_transitions() -> None:
    assert {(s, e): a for s, e, a in ALLOWED} == TRANSITIONS


FORBIDDEN = [
    (State.UNLOADED, Event.UNLOAD),  # nothing to unload
    (State.UNLOADED, Event.LOADED),
    (State.LOADING, Event.LOAD),  # single-flight: no second load
    (State.LOADING, Event.UNLOAD),
    (State.READY, Event.LOAD),
    (State.READY, Event.LOADED),
    (State.UNLOADING, Event.LOAD),
    (State.UNLOADING, Event.UNLOAD),
    (State.FAILED, Event.LOADED),
    (State.READY, Event.LOAD_ABORTED),
    (State.UNLOADED, Event.LOAD_FAILED),
]


@pytest.mark.parametrize(("state", "event"), FORBIDDEN)
def test_forbidden_transition_raises_naming_state_and_event(state: State, event: Event) -> None:
    with pytest.raises(InvalidTransition) as info:
        transition(state, event)
    assert state.value in str(info.value)
    assert event.value in str(info.value)


def test_every_pair_outside_the_table_is_forbidden() -> None:
    for state in State:
        for event in Event:
            if (state, event) in TRANSITIONS:
                continue
            with pytest.raises(InvalidTransition):
                transition(state, event)


@pytest.mark.parametrize(
    ("failures", "seconds"),
    [
        (0, 0.0),
        (-1, 0.0),
        (1, 1.0),
        (2, 2.0),
        (3, 4.0),
        (4, 8.0),
        (9, 256.0),
        (10, 300.0),  # 512 capped
        (50, 300.0),
    ],
)
def test_load_backoff_starts_at_one_second_and_doubles_up_to_five_minutes(
    failures: int, seconds: float
) -> None:
    assert load_backoff(failures) == seconds


def test_load_backoff_honours_its_base_and_cap() -> None:
    assert load_backoff(3, base=0.5, cap=10.0) == 2.0
    assert load_backoff(8, base=0.5, cap=10.0) == 10.0


def test_a_failed_load_refuses_requests_until_its_backoff_has_passed() -> None:
    failures = LoadFailures()
    assert failures.record(OSError("disk gone"), now=100.0) == 1.0
    assert failures.record(OSError("disk gone"), now=200.0) == 2.0  # the second in a row
    refusal = failures.refusal("m", now=201.5)
    assert isinstance(refusal, ModelLoadFailed)
    assert refusal.retry_after == 0.5
    assert refusal.message == "model 'm' failed to load: OSError: disk gone"
    assert failures.refusal("m", now=202.0) is None  # the backoff has passed: load again


def test_a_refusal_names_the_model_once_and_an_explicit_load_skips_the_backoff() -> None:
    failures = LoadFailures()
    failures.record(ModelTooLarge("model 'm' needs 9 GiB"), now=0.0)
    refusal = failures.refusal("m", now=0.0)
    assert refusal is not None
    assert refusal.message == "model 'm' needs 9 GiB"
    failures.skip_backoff()
    assert failures.refusal("m", now=0.0) is None
    assert failures.count == 1  # the next failure still doubles the wait


def test_a_good_load_or_an_unload_clears_the_record() -> None:
    failures = LoadFailures()
    failures.record(OSError("disk gone"), now=0.0)
    failures.clear()
    assert (failures.count, failures.error, failures.refusal("m", now=0.0)) == (0, "", None)
    assert failures.record(OSError("disk gone"), now=0.0) == 1.0  # a fresh backoff
