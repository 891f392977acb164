"""The autoscaler's pure decision, `desired_replicas`, as a table, and the sliding window that
feeds it."""

from __future__ import annotations

import pytest

from snoozeml.config.settings import ReplicasConfig
from snoozeml.engine.replicas.autoscaler import (
    LoadWindow,
    ScalePolicy,
    ScaleStats,
    desired_replicas,
)

POLICY = ScalePolicy(min=0, max=3, target_queue=4.0, scale_up_after=1.0, scale_down_after=30.0)
NOW = 100.0


def stats(ready: int, up: float | None = None, down: float | None = None, *,
          changing: bool = False, retry_at: float = 0.0) -> ScaleStats:
    return ScaleStats(ready, changing, up, down, retry_at)


@pytest.mark.parametrize(("case", "given", "policy", "expected"), [
    # --- thresholds: up strictly above target x ready, down at or below target x (ready - 1)
    ("mean load above the target grows by one", stats(1, up=4.1, down=4.1), POLICY, 2),
    ("mean load at the target stays", stats(1, up=4.0, down=4.0), POLICY, 1),
    ("two replicas grow above 8, not at 8", stats(2, up=8.0, down=8.0), POLICY, 2),
    ("two replicas grow above 8", stats(2, up=8.5, down=8.5), POLICY, 3),
    ("a far bigger load still grows by one only", stats(1, up=400.0, down=400.0), POLICY, 2),
    ("load that fits one replica fewer shrinks by one", stats(3, up=8.0, down=8.0), POLICY, 2),
    ("load just above what one fewer holds stays", stats(3, up=8.1, down=8.1), POLICY, 3),
    ("quiet shrinks two to one", stats(2, up=0.0, down=0.0), POLICY, 1),
    # --- delays: no decision before a whole window has been watched since the last change
    ("a busy but not yet full up window waits", stats(1, up=None, down=None), POLICY, 1),
    ("a quiet but not yet full down window waits", stats(2, up=0.0, down=None), POLICY, 2),
    ("a change under way decides nothing", stats(1, up=50.0, down=50.0, changing=True),
     POLICY, 1),
    ("a drain under way decides nothing", stats(3, up=0.0, down=0.0, changing=True), POLICY, 3),
    # --- min and max
    ("max is a ceiling", stats(3, up=100.0, down=100.0), POLICY, 3),
    ("above max (max lowered) shrinks at once", stats(4, up=100.0, down=100.0), POLICY, 3),
    ("below min grows at once, without a window", stats(1),
     ScalePolicy(2, 3, 4.0, 1.0, 30.0), 2),
    ("min is a floor for quiet", stats(2, up=0.0, down=0.0),
     ScalePolicy(2, 3, 4.0, 1.0, 30.0), 2),
    ("max 1 never grows", stats(1, up=100.0, down=100.0),
     ScalePolicy(0, 1, 4.0, 1.0, 30.0), 1),
    # --- hysteresis: between target x (n-1) and target x n nothing moves either way
    ("a load of 6 on two replicas stays two", stats(2, up=6.0, down=6.0), POLICY, 2),
    ("a load of 6 on one replica grows to two", stats(1, up=6.0, down=6.0), POLICY, 2),
    ("a load of 4 on two replicas shrinks to one, which it does not leave",
     stats(2, up=4.0, down=4.0), POLICY, 1),
    # --- memory refusal or a failed load: no add before retry_at; shrinking is unaffected
    ("a refused add waits for its retry time", stats(1, up=9.0, down=9.0, retry_at=NOW + 2),
     POLICY, 1),
    ("after the retry time it tries again", stats(1, up=9.0, down=9.0, retry_at=NOW),
     POLICY, 2),
    ("a failed replica below min waits too", stats(1, retry_at=NOW + 5),
     ScalePolicy(2, 3, 4.0, 1.0, 30.0), 1),
    ("a refusal does not stop a shrink", stats(3, up=0.0, down=0.0, retry_at=NOW + 5),
     POLICY, 2),
    # --- scale to zero is the idle timer's: never below one while loaded, nothing from zero
    ("the last replica is not the autoscaler's", stats(1, up=0.0, down=0.0), POLICY, 1),
    ("an unloaded model stays unloaded (a request loads it)", stats(0, up=9.0, down=9.0),
     POLICY, 0),
    ("even min does not load an unloaded model", stats(0), ScalePolicy(2, 3, 4.0, 1.0, 30.0),
     0),
])
def test_desired_replicas(case: str, given: ScaleStats, policy: ScalePolicy,
                          expected: int) -> None:
    assert desired_replicas(given, NOW, policy) == expected, case


def test_the_policy_comes_from_the_config_capped_by_the_cpu() -> None:
    conf = ReplicasConfig(min=3, max=4, target_queue=2, scale_up_after=0.5,
                          scale_down_after=5.0)
    assert ScalePolicy.of(conf) == ScalePolicy(3, 4, 2.0, 0.5, 5.0)
    assert ScalePolicy.of(conf, most=2) == ScalePolicy(2, 2, 2.0, 0.5, 5.0)


def test_a_window_has_no_mean_until_it_has_watched_its_whole_span() -> None:
    window = LoadWindow(1.0)
    window.reset(10.0)
    window.add(10.0, 8)
    window.add(10.5, 4)
    assert window.mean(10.5) is None
    window.add(11.0, 0)
    assert window.mean(11.0) == pytest.approx(4.0)


def test_a_window_forgets_samples_older_than_its_span() -> None:
    window = LoadWindow(1.0)
    for step in range(30):  # 0.0 .. 2.9 s: 10 at first, 0 from 1.5 s on
        window.add(step / 10, 10 if step < 15 else 0)
    # Samples from 1.9 s to 2.9 s remain: all zero.
    assert window.mean(2.9) == 0.0


def test_a_reset_starts_the_wait_again() -> None:
    window = LoadWindow(1.0)
    window.add(0.0, 5)
    window.add(1.0, 5)
    assert window.mean(1.0) == 5.0
    window.reset(1.0)
    window.add(1.5, 1)
    assert window.mean(1.5) is None
    window.add(2.0, 3)
    assert window.mean(2.0) == 2.0
