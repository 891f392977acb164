"""The monitor's table (monitor/table.py): its cells, order, filter, state counts and plain-text
rendering. No daemon, no terminal."""

from __future__ import annotations

from typing import Any

import pytest

from snoozeml.monitor.latency import Latency
from snoozeml.monitor.status import ModelRow
from snoozeml.monitor.table import (
    COLUMN_KEYS,
    Row,
    build_rows,
    cells,
    filter_rows,
    format_bytes,
    format_duration,
    format_rate,
    format_seconds,
    idle_in,
    memory_bar,
    next_sort,
    render_text,
    sort_rows,
    state_counts,
)


def model(name: str = "m", **fields: Any) -> ModelRow:
    values: dict[str, Any] = {
        "name": name, "state": "READY", "reason": "", "pinned": False, "replicas": 1,
        "in_flight": 0, "queued": 0, "resident_bytes": 0, "expires_in_s": None,
        "last_load_ms": None, "requests": 0, "errors": 0}
    values.update(fields)
    return ModelRow(**values)


@pytest.mark.parametrize(("size", "text"), [
    (0, "0 B"), (512, "512 B"), (1536, "1.5 KiB"), (9990144, "9.5 MiB"),
    (20220847718, "18.8 GiB"), (1023 * 2**20, "1023 MiB"), (2**50 * 3, "3.0 PiB"),
])
def test_sizes_read_in_binary_units(size: int, text: str) -> None:
    assert format_bytes(size) == text


@pytest.mark.parametrize(("seconds", "text"), [
    (None, "-"), (0.00042, "0.42ms"), (0.0123, "12.3ms"), (0.123, "123ms"), (1.25, "1.25s"),
    (42.0, "42.0s"),
])
def test_latencies_read_in_ms_then_seconds(seconds: float | None, text: str) -> None:
    assert format_seconds(seconds) == text


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0s"), (6.2, "7s"), (59.4, "1m00s"), (245, "4m05s"), (7380, "2h03m"),
    (3 * 86400 + 4 * 3600, "3d04h"),
])
def test_durations_read_to_the_second(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_rates_are_short() -> None:
    assert [format_rate(r) for r in (0.0, 0.42, 12.5, 1234.4)] == ["0", "0.4", "12.5", "1234"]


def test_the_memory_bar_fills_its_share_of_the_budget() -> None:
    assert memory_bar(0, 1000, 10) == (0, 0.0)
    assert memory_bar(1, 1000, 10) == (1, 0.001)  # anything used shows
    assert memory_bar(500, 1000, 10) == (5, 0.5)
    assert memory_bar(2000, 1000, 10) == (10, 2.0)
    assert memory_bar(5, None, 10) == (0, None)


def test_the_idle_column_counts_down_or_says_pinned() -> None:
    assert idle_in(model(expires_in_s=29.2)) == "30s"
    assert idle_in(model(pinned=True)) == "pinned"
    assert idle_in(model(state="UNLOADED")) == "-"



def test_the_idle_column_counts_down_to_an_adaptive_models_prewarm_once_it_is_unloaded() -> None:
    assert idle_in(model(state="UNLOADED", prewarm_in_s=11.4)) == "warm 12s"
    assert idle_in(model(expires_in_s=3.0, prewarm_in_s=11.4)) == "3s"  # still loaded


def test_cells_show_dashes_where_the_monitor_has_no_value() -> None:
    row = Row(model(name="a", replicas=2, in_flight=3, queued=1, resident_bytes=9990144,
                    expires_in_s=30.0, last_load_ms=23.04), None)
    assert cells(row) == ("a", "READY", "2", "3", "1", "-", "-", "-", "9.5 MiB", "30s",
                          "23.0ms")
    measured = Row(row.model, Latency(per_s=12.5, p50_s=0.0011, p99_s=0.02))
    assert cells(measured)[5:8] == ("12.5", "1.10ms", "20.0ms")


def test_rows_get_their_models_window_and_a_model_the_metrics_do_not_name_gets_none() -> None:
    rows = build_rows([model("a"), model("b")], {"a": Latency(1.0, None, None)})
    assert [r.latency for r in rows] == [Latency(1.0, None, None), None]
    assert [r.latency for r in build_rows([model("a")], None)] == [None]


def test_filtering_keeps_names_that_contain_the_text_ignoring_case() -> None:
    rows = build_rows([model("Embedder"), model("classifier"), model("bert-embed")], None)
    assert [r.model.name for r in filter_rows(rows, " EMBED ")] == ["Embedder", "bert-embed"]
    assert len(filter_rows(rows, "")) == 3


def test_sorting_puts_numbers_largest_first_names_ascending_and_missing_values_last() -> None:
    rows = [Row(model("b", resident_bytes=10, state="UNLOADED"), Latency(3.0, 0.1, 0.2)),
            Row(model("a", resident_bytes=30, state="FAILED"), None),
            Row(model("c", resident_bytes=20), Latency(5.0, None, None))]

    def names(key: str | None, reverse: bool = False) -> list[str]:
        return [r.model.name for r in sort_rows(rows, key, reverse)]

    assert names(None) == ["b", "a", "c"]  # the daemon's order
    assert names("name") == ["a", "b", "c"]
    assert names("memory") == ["a", "c", "b"]
    assert names("memory", reverse=True) == ["b", "c", "a"]
    assert names("per_s") == ["c", "b", "a"]
    assert names("per_s", reverse=True) == ["b", "c", "a"]  # missing stays last
    assert names("p50") == ["b", "a", "c"]
    assert names("state") == ["a", "c", "b"]  # FAILED, READY, UNLOADED


def test_models_are_counted_by_state_most_interesting_first() -> None:
    models = [model("a"), model("b", state="UNLOADED"), model("c"), model("d", state="FAILED")]
    assert state_counts(models) == [("FAILED", 1), ("READY", 2), ("UNLOADED", 1)]


def test_the_sort_key_cycles_through_every_column_and_back_to_the_daemons_order() -> None:
    seen = [next_sort(None)]
    while seen[-1] is not None:
        seen.append(next_sort(seen[-1]))
    assert seen == [*COLUMN_KEYS, None]


def test_the_plain_table_aligns_names_left_and_numbers_right() -> None:
    rows = [Row(model("classifier", resident_bytes=9990144, expires_in_s=30.0,
                      last_load_ms=23.04), Latency(12.5, 0.0011, 0.02)),
            Row(model("embedder", state="UNLOADED", replicas=0), None)]
    assert render_text(rows).splitlines() == [
        "MODEL       STATE     REPLICAS  IN-FLIGHT  QUEUED  REQ/S     P50     P99   MEMORY  "
        "IDLE IN  COLD START",
        "classifier  READY            1          0       0   12.5  1.10ms  20.0ms  9.5 MiB  "
        "    30s      23.0ms",
        "embedder    UNLOADED         0          0       0      -       -       -        -  "
        "      -           -",
    ]
