"""When a replica may run a batch on the event loop instead of its worker thread."""

from __future__ import annotations

import pytest

from snoozeml.engine.batching.inline import InlinePolicy


def warmed(seconds: float, rows: int = 1, runs: int = 20) -> InlinePolicy:
    policy = InlinePolicy(max_run=100e-6, abort_run=1e-3, warmup=20)
    for _ in range(runs):
        policy.observe(seconds, rows)
    return policy


def test_nothing_runs_inline_before_the_warm_up_runs_are_measured() -> None:
    assert not warmed(5e-6, runs=19).allows(1)
    assert warmed(5e-6, runs=20).allows(1)


@pytest.mark.parametrize(("seconds", "allowed"), [
    (5e-6, True), (100e-6, True), (101e-6, False), (2e-3, False)])
def test_only_models_whose_runs_average_under_the_limit_run_inline(
    seconds: float, allowed: bool,
) -> None:
    assert warmed(seconds).allows(1) is allowed


def test_a_batch_larger_than_any_seen_to_be_fast_goes_to_the_worker() -> None:
    policy = warmed(5e-6, rows=4)
    assert policy.allows(4)
    assert not policy.allows(5)


def test_one_long_inline_run_turns_inlining_off_for_good() -> None:
    policy = warmed(5e-6)
    assert policy.observe_inline(5e-6, 1) is False
    assert policy.observe_inline(3e-3, 1) is True  # reported once, when it happens
    assert not policy.allows(1)
    for _ in range(100):
        policy.observe(5e-6, 1)
    assert not policy.allows(1)
    assert policy.observe_inline(3e-3, 1) is False  # already off


def test_the_average_follows_a_model_that_slows_down() -> None:
    policy = warmed(5e-6)
    for _ in range(40):
        policy.observe(500e-6, 1)
    assert not policy.allows(1)
