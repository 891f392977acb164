"""The adaptive keep-alive policy as a table: a model's idle gaps and its fixed fallback in,
the plan out (pinned, young, out of range, pre-warm, keep alive, unload at once, fallback),
and the expected cost of a plan read off the histogram."""

from __future__ import annotations

import math

import pytest

from snoozeml.engine.keepalive.histogram import (
    HIGH_S,
    IdleHistogram,
    bin_of,
    lower_edge,
    upper_edge,
)
from snoozeml.engine.keepalive.policy import (
    Expected,
    KeepAliveSettings,
    Plan,
    expected,
    next_arrival_s,
    observed,
    plan,
    wasted_share,
)


def filled(gaps: list[float]) -> IdleHistogram:
    histogram = IdleHistogram()
    for gap in gaps:
        histogram.add(gap)
    return histogram


def exponential(mean_s: float, n: int = 200) -> list[float]:
    """Gaps of a Poisson model, its quantiles spread evenly (no randomness)."""
    return [-mean_s * math.log(1 - (i + 0.5) / n) for i in range(n)]


SETTINGS = KeepAliveSettings()


def test_a_pinned_model_never_unloads() -> None:
    assert plan(filled([5.0] * 50), None) == Plan(None, None, None, "pinned")


def test_a_young_history_keeps_the_fixed_window() -> None:
    gaps = [5.0, 9.0, 3.0, 20.0, 5.0, 7.0, 2.0, 30.0, 6.0]
    assert plan(filled(gaps), 60.0) == Plan(60.0, None, None, "fallback: young history")


@pytest.mark.parametrize(("gaps", "reason"), [
    pytest.param([3600.0] * 3, "fallback: young history", id="three-gaps-are-too-few"),
    pytest.param([3600.0] * 4, "learned", id="four-equal-gaps-are-a-timer"),
    pytest.param([3500.0, 3600.0, 3700.0, 3600.0], "learned", id="in-two-adjacent-bins"),
    pytest.param([3000.0, 3600.0, 4000.0, 3600.0], "fallback: young history",
                 id="three-bins-are-not-steady"),
    pytest.param([0.001] * 5, "fallback: young history", id="below-the-range-is-not-steady"),
])
def test_a_steady_history_is_trusted_after_a_few_gaps(gaps: list[float], reason: str) -> None:
    assert plan(filled(gaps), 600.0).reason == reason


def test_gaps_mostly_beyond_the_range_keep_the_fixed_window() -> None:
    gaps = [HIGH_S * 2] * 6 + [30.0] * 5
    assert plan(filled(gaps), 60.0) == Plan(60.0, None, None, "fallback: out of range")


def test_a_periodic_model_called_every_3_s_is_kept_alive_past_its_period() -> None:
    # the fallback (1 s) is shorter than the period: fixed, every call would be cold
    chosen = plan(filled([3.0] * 10), 1.0)
    assert chosen.reason == "learned"
    assert chosen.prewarm_after_s is None
    assert chosen.unload_after_s == pytest.approx(upper_edge(bin_of(3.0)) * 1.1)
    assert 3.0 < chosen.unload_after_s < 4.0  # type: ignore[operator]


@pytest.mark.parametrize(("period", "fallback"), [(15.0, 5.0), (20.0, 600.0), (300.0, 600.0),
                                                  (3600.0, 600.0)])
def test_a_periodic_model_with_far_gaps_is_unloaded_and_pre_warmed(period: float,
                                                                   fallback: float) -> None:
    chosen = plan(filled([period] * 10), fallback)
    assert chosen.reason == "learned"
    assert chosen.unload_after_s == 0.0
    assert chosen.prewarm_after_s == pytest.approx(lower_edge(bin_of(period)) * 0.9)
    assert chosen.keep_until_s == pytest.approx(upper_edge(bin_of(period)) * 1.1)
    assert 0.8 * period < chosen.prewarm_after_s < period < chosen.keep_until_s < 1.25 * period


def test_a_pre_warm_starts_its_load_time_earlier() -> None:
    quick = plan(filled([100.0] * 10), 60.0)
    slow = plan(filled([100.0] * 10), 60.0, load_s=4.0)
    assert slow.prewarm_after_s == pytest.approx(quick.prewarm_after_s - 4.0)  # type: ignore[operator]


def test_no_pre_warm_when_the_low_percentile_is_too_near() -> None:
    chosen = plan(filled([8.0] * 10), 1.0, KeepAliveSettings(min_unload_gap_s=10.0))
    assert chosen.prewarm_after_s is None
    assert chosen.reason == "learned"


def test_a_poisson_model_called_every_second_keeps_its_fixed_window() -> None:
    # memoryless: no shorter window saves idle time worth its cold starts
    chosen = plan(filled(exponential(1.0)), 600.0)
    assert chosen == Plan(600.0, None, None, "fallback: unpredictable")


def test_a_poisson_model_whose_mean_gap_passes_what_a_cold_start_is_worth_is_unloaded() -> None:
    # a cold start is worth 4 windows (2,400 s) of idle time; a 10-minute window would catch
    # 11% of its calls for 570 s of idle memory a gap
    chosen = plan(filled(exponential(5000.0)), 600.0)
    assert chosen == Plan(0.0, None, None, "learned")


def test_a_poisson_model_called_more_often_than_that_is_kept_past_its_window() -> None:
    # mean gap 1,000 s: a 10-minute window misses 55% of its calls; kept to its 99th
    # percentile, it misses about 1%
    chosen = plan(filled(exponential(1000.0)), 600.0)
    assert chosen.reason == "learned"
    assert chosen.prewarm_after_s is None
    assert chosen.unload_after_s > 4000.0  # type: ignore[operator]


def test_what_a_cold_start_is_worth_is_a_knob() -> None:
    # worth one window: the same model is unloaded right away
    settings = KeepAliveSettings(cold_start_worth=1.0)
    assert plan(filled(exponential(1000.0)), 600.0, settings) == Plan(0.0, None, None,
                                                                       "learned")


def test_an_hourly_timer_with_a_short_fallback_is_unloaded_not_pre_warmed() -> None:
    # a 5 s fallback says a cold start is worth little (60 s of idle memory at least):
    # holding a pre-warmed model for ~10% of an hour is not
    assert plan(filled([3600.0] * 10), 5.0) == Plan(0.0, None, None, "learned")


def test_a_rare_unpredictable_model_is_unloaded_right_away() -> None:
    # called every 3 hours on average, at random: a 10-minute window holds memory for nothing
    chosen = plan(filled(exponential(3 * 3600.0)), 600.0)
    assert chosen == Plan(0.0, None, None, "learned")


def test_a_bursty_model_is_kept_through_its_bursts_only() -> None:
    # bursts of 50 calls a second apart, an hour between bursts
    gaps = ([1.0] * 49 + [3600.0]) * 4
    chosen = plan(filled(gaps), 600.0)
    assert chosen.reason == "learned"
    assert chosen.prewarm_after_s is None
    assert 1.0 < chosen.unload_after_s < 2.0  # type: ignore[operator]


def test_the_fallback_wins_ties() -> None:
    # every gap is covered by the fallback and by the learned window alike, for the same time
    chosen = plan(filled([0.001] * 20), 600.0)
    assert chosen.reason == "fallback: unpredictable"


def test_pre_warms_nobody_used_count_against_the_pre_warm_plan() -> None:
    history = filled([300.0] * 10)
    assert plan(history, 600.0).prewarm_after_s is not None
    assert plan(history, 600.0, wasted=0.05).prewarm_after_s is not None  # still cheaper
    missed = plan(history, 600.0, wasted=0.5)
    assert missed.prewarm_after_s is None
    assert missed.unload_after_s is not None
    assert missed.unload_after_s >= 300.0  # kept alive


PREWARM = Plan(0.0, 90.0, 110.0, "x")
OBSERVED_CASES = [  # (plan, predicted, wasted share seen, charged)
    pytest.param(PREWARM, Expected(0.0, 10.0, 0.0), 0.5, Expected(0.5, 20.0, 0.5),
                 id="half-wasted-where-none-was-predicted"),
    pytest.param(PREWARM, Expected(0.3, 10.0, 0.2), 0.5, Expected(0.6, 16.0, 0.5),
                 id="the-difference-only"),
    pytest.param(PREWARM, Expected(0.1, 10.0, 0.1), 0.05, Expected(0.1, 10.0, 0.1),
                 id="fewer-wasted-than-predicted-changes-nothing"),
    pytest.param(Plan(600.0, None, None, "x"), Expected(0.1, 10.0, 0.0), 1.0,
                 Expected(0.1, 10.0, 0.0), id="a-plan-without-pre-warm-is-not-charged"),
]


@pytest.mark.parametrize(("chosen", "predicted", "wasted", "charged"), OBSERVED_CASES)
def test_observed_waste_is_charged_to_a_pre_warm_plan(chosen: Plan, predicted: Expected,
                                                      wasted: float, charged: Expected) -> None:
    outcome = observed(chosen, predicted, wasted)
    assert (outcome.cold, outcome.idle_s, outcome.wasted) == pytest.approx(
        (charged.cold, charged.idle_s, charged.wasted))


@pytest.mark.parametrize(("share", "prewarm", "after"), [
    (0.0, "used", 0.0), (0.0, "wasted", 0.25), (0.25, "wasted", 0.4375), (0.5, "used", 0.375),
    (0.4, None, 0.38),
])
def test_the_wasted_share_moves_a_quarter_a_pre_warm_and_fades_with_each_gap(
        share: float, prewarm: str | None, after: float) -> None:
    assert wasted_share(share, SETTINGS, prewarm) == pytest.approx(after)


EXPECTED_CASES = [
    pytest.param(Plan(60.0, None, None, "x"), [100.0] * 4, 1.0, 60.0, 0.0,
                 id="fixed-window-shorter-than-the-gap"),
    pytest.param(Plan(600.0, None, None, "x"), [100.0] * 4, 0.0, 100.0, 0.0,
                 id="fixed-window-longer-than-the-gap"),
    pytest.param(Plan(0.0, None, None, "x"), [100.0] * 4, 1.0, 0.0, 0.0,
                 id="unload-at-once"),
    pytest.param(Plan(0.0, 90.0, 110.0, "x"), [100.0] * 4, 0.0, 10.0, 0.0,
                 id="pre-warm-used"),
    pytest.param(Plan(0.0, 90.0, 95.0, "x"), [100.0] * 4, 1.0, 5.0, 1.0,
                 id="pre-warm-wasted"),
    pytest.param(Plan(0.0, 150.0, 200.0, "x"), [100.0] * 4, 1.0, 0.0, 0.0,
                 id="pre-warm-too-late"),
    pytest.param(Plan(None, None, None, "x"), [100.0, 100.0], 0.0, 100.0, 0.0,
                 id="never-unloads"),
]


@pytest.mark.parametrize(("chosen", "gaps", "cold", "idle", "wasted"), EXPECTED_CASES)
def test_expected_cost_of_a_plan(chosen: Plan, gaps: list[float], cold: float, idle: float,
                                 wasted: float) -> None:
    outcome = expected(chosen, filled(gaps))
    middle = math.sqrt(lower_edge(bin_of(100.0)) * upper_edge(bin_of(100.0)))
    assert outcome.cold == pytest.approx(cold)
    assert outcome.idle_s == pytest.approx(idle + (middle - 100.0) * (idle in (10.0, 100.0)))
    assert outcome.wasted == pytest.approx(wasted)


def test_expected_of_an_empty_histogram_is_nothing() -> None:
    assert expected(Plan(60.0, None, None, "x"), IdleHistogram()).cold == 0.0


NEXT_CASES = [
    pytest.param([100.0] * 10, Plan(0.0, 90.0, 110.0, "learned"), 30.0, 60.0,
                 id="before-its-pre-warm-the-pre-warm-time"),
    pytest.param([100.0] * 10, Plan(600.0, None, None, "x"), 30.0,
                 upper_edge(bin_of(100.0)) - 30.0, id="else-the-median-gap-ahead"),
    pytest.param([100.0] * 10, Plan(600.0, None, None, "x"), 200.0, None,
                 id="overdue-unknown"),
    pytest.param([100.0] * 9, Plan(600.0, None, None, "x"), 30.0, None,
                 id="young-unknown"),
]


@pytest.mark.parametrize(("gaps", "chosen", "idle_for", "ahead"), NEXT_CASES)
def test_next_arrival(gaps: list[float], chosen: Plan, idle_for: float,
                      ahead: float | None) -> None:
    assert next_arrival_s(filled(gaps), chosen, idle_for) == (
        None if ahead is None else pytest.approx(ahead))
