"""The switch interval is short exactly while a long run is in flight, and comes back after."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator

import pytest

from snoozeml.engine.gil import SwitchInterval, kept_waiting


@pytest.fixture(autouse=True)
def interval() -> Iterator[None]:
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def test_a_region_lowers_the_interval_and_gives_it_back() -> None:
    switch = SwitchInterval(fast=0.001)
    with switch.fast():
        assert sys.getswitchinterval() == pytest.approx(0.001)
        assert switch.base() == pytest.approx(0.005)  # what runs are measured against
    assert sys.getswitchinterval() == pytest.approx(0.005)
    assert switch.base() == pytest.approx(0.005)


def test_the_interval_stays_short_until_the_last_of_overlapping_regions_ends() -> None:
    switch = SwitchInterval(fast=0.001)
    entered, leave, left = threading.Event(), threading.Event(), threading.Event()

    def other_worker() -> None:
        with switch.fast():
            entered.set()
            leave.wait(30)
        left.set()

    thread = threading.Thread(target=other_worker)
    thread.start()
    try:
        assert entered.wait(30)
        with switch.fast():
            pass
        assert sys.getswitchinterval() == pytest.approx(0.001), "restored under a run in flight"
    finally:
        leave.set()
        thread.join(30)
    assert left.is_set()
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_an_interval_already_shorter_is_left_alone() -> None:
    sys.setswitchinterval(0.0005)
    switch = SwitchInterval(fast=0.001)
    with switch.fast():
        assert sys.getswitchinterval() == pytest.approx(0.0005)
    assert sys.getswitchinterval() == pytest.approx(0.0005)


def test_an_interval_someone_else_set_during_a_region_is_kept() -> None:
    switch = SwitchInterval(fast=0.001)
    with switch.fast():
        sys.setswitchinterval(0.002)
    assert sys.getswitchinterval() == pytest.approx(0.002)
    with switch.fast():
        assert sys.getswitchinterval() == pytest.approx(0.001)
    assert sys.getswitchinterval() == pytest.approx(0.002)


def test_a_failing_region_still_gives_the_interval_back() -> None:
    switch = SwitchInterval(fast=0.001)
    with pytest.raises(RuntimeError), switch.fast():
        raise RuntimeError("the run failed")
    assert sys.getswitchinterval() == pytest.approx(0.005)
    with switch.fast():  # and the count is right for the next one
        assert sys.getswitchinterval() == pytest.approx(0.001)


def test_only_a_long_run_kept_off_the_cpu_past_the_short_interval_asks_for_it() -> None:
    long_run, short = 0.0005, 0.001
    assert kept_waiting(cpu=0.005, wall=0.007, long_run=long_run, short=short)  # kept waiting
    assert not kept_waiting(cpu=0.005, wall=0.0055, long_run=long_run, short=short)  # 0.5 ms:
    # a wait the short interval cannot cut
    assert not kept_waiting(cpu=0.005, wall=0.0051, long_run=long_run, short=short)  # idle loop
    assert not kept_waiting(cpu=0.0001, wall=0.003, long_run=long_run, short=short)  # short run
