"""The monitor's pure parts: reading /admin/status, latency from histogram deltas, and the
table's cells, order and filter; and the HTTP client against a fake transport. No daemon,
no terminal."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from snoozeml.monitor.client import DaemonClient, DaemonRefused, DaemonUnreachable, MonitorError
from snoozeml.monitor.latency import (
    Histogram,
    Latency,
    LatencyTracker,
    parse_histograms,
    quantile,
    subtract,
    window,
)
from snoozeml.monitor.status import ModelRow, StatusFormatError, parse_status, parse_time
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

INF = math.inf


def status_document(**extra: Any) -> dict[str, Any]:
    return {
        "server": {"name": "snoozeml", "version": "0.1.0", "started_at": "2026-12-01T00:10:18.544Z",
                   "uptime_s": 4.5, "draining": False},
        "devices": [{"name": "cpu", "total_bytes": 2000, "budget_bytes": 1000, "used_bytes": 250,
                     "reserved_bytes": 0, "process_bytes": 5000}],
        "evictions": {}, "auth_refusals": {},
        "models": [
            {"name": "classifier", "state": "READY", "reason": "", "pinned": False,
             "replicas": 2, "in_flight": 3, "queued": 1, "resident_bytes": 9990144,
             # 30 s after the daemon's now (started_at + uptime_s = 00:10:23.044).
             "expires_at": "2026-12-01T00:10:53.044Z", "last_load_ms": 23.04,
             "requests": 7, "errors": 1},
            {"name": "embedder", "state": "UNLOADED", "reason": "admin", "pinned": False,
             "replicas": 0, "in_flight": 0, "queued": 0, "resident_bytes": 0,
             "expires_at": None, "last_load_ms": None, "requests": 0, "errors": 0},
        ],
        **extra,
    }


def model(name: str = "m", **fields: Any) -> ModelRow:
    values: dict[str, Any] = {
        "name": name, "state": "READY", "reason": "", "pinned": False, "replicas": 1,
        "in_flight": 0, "queued": 0, "resident_bytes": 0, "expires_in_s": None,
        "last_load_ms": None, "requests": 0, "errors": 0}
    values.update(fields)
    return ModelRow(**values)


def hist(*pairs: tuple[float, float]) -> Histogram:
    return Histogram(tuple(pairs))


# --- /admin/status ------------------------------------------------------------------------------


def test_a_status_document_becomes_typed_rows_with_timers_measured_on_the_daemons_clock() -> None:
    status = parse_status(status_document())

    assert status.server.version == "0.1.0"
    assert status.server.uptime_s == 4.5
    assert status.server.now == pytest.approx(parse_time("2026-12-01T00:10:23.044Z"))
    assert [(d.name, d.used_bytes, d.budget_bytes) for d in status.devices] == [("cpu", 250, 1000)]
    classifier, embedder = status.models
    assert (classifier.state, classifier.replicas, classifier.in_flight, classifier.queued) == \
        ("READY", 2, 3, 1)
    assert classifier.expires_in_s == pytest.approx(30.0)
    assert classifier.last_load_ms == 23.04
    assert (embedder.state, embedder.reason, embedder.expires_in_s) == ("UNLOADED", "admin", None)


def test_recent_events_are_read_when_the_daemon_sends_them_and_none_when_it_does_not() -> None:
    assert parse_status(status_document()).events is None
    events = parse_status(status_document(recent_events=[
        {"time": "2026-12-02T01:00:00.123Z", "kind": "model_loaded", "model": "classifier",
         "detail": "replica 0 on cpu in 7 ms"},
        {"time": "2026-12-02T01:00:01.000Z", "kind": "memory_evicting", "model": None,
         "detail": "victims=a,b"},
    ])).events
    assert events is not None
    assert [(e.kind, e.model) for e in events] == [("model_loaded", "classifier"),
                                                   ("memory_evicting", None)]


@pytest.mark.parametrize("document", [[], {"server": {}}, {"models": []}, "text"])
def test_an_answer_that_is_not_a_status_is_refused(document: object) -> None:
    with pytest.raises(StatusFormatError):
        parse_status(document)


def test_missing_or_odd_fields_read_as_empty_not_as_errors() -> None:
    status = parse_status({"server": {}, "models": [{"name": "x", "replicas": "two"}]})
    (row,) = status.models
    assert (row.name, row.state, row.replicas, row.expires_in_s) == ("x", "?", 0, None)
    assert status.devices == ()


# --- latency from histograms ---------------------------------------------------------------------

METRICS = """\
# HELP snooze_request_duration_seconds Request duration.
# TYPE snooze_request_duration_seconds histogram
snooze_request_duration_seconds_bucket{le="0.001",model="a",protocol="http"} 1.0
snooze_request_duration_seconds_bucket{le="0.01",model="a",protocol="http"} 3.0
snooze_request_duration_seconds_bucket{le="+Inf",model="a",protocol="http"} 4.0
snooze_request_duration_seconds_count{model="a",protocol="http"} 4.0
snooze_request_duration_seconds_sum{model="a",protocol="http"} 0.5
snooze_request_duration_seconds_bucket{le="0.001",model="a",protocol="grpc"} 2.0
snooze_request_duration_seconds_bucket{le="0.01",model="a",protocol="grpc"} 2.0
snooze_request_duration_seconds_bucket{le="+Inf",model="a",protocol="grpc"} 2.0
snooze_request_duration_seconds_count{model="a",protocol="grpc"} 2.0
snooze_request_duration_seconds_sum{model="a",protocol="grpc"} 0.001
snooze_request_duration_seconds_bucket{le="0.001",model="",protocol="http"} 9.0
snooze_request_duration_seconds_bucket{le="0.01",model="",protocol="http"} 9.0
snooze_request_duration_seconds_bucket{le="+Inf",model="",protocol="http"} 9.0
# TYPE snooze_queue_duration_seconds histogram
snooze_queue_duration_seconds_bucket{le="+Inf",model="a"} 100.0
"""


def test_histograms_are_summed_over_protocols_per_model() -> None:
    histograms = parse_histograms(METRICS)
    assert histograms["a"] == hist((0.001, 3.0), (0.01, 5.0), (INF, 6.0))
    assert histograms["a"].count == 6.0
    assert histograms[""].count == 9.0  # requests naming no model: kept, shown for no row


def test_text_without_the_metric_gives_no_histograms_and_garbage_does_not_parse() -> None:
    assert parse_histograms("# nothing here\n") == {}
    with pytest.raises(ValueError, match="not Prometheus text"):
        parse_histograms("this is { not prometheus")


# Prometheus' histogram_quantile on these buckets, worked by hand: rank = q * count (10), found
# in the first bucket whose cumulative count reaches it, interpolated linearly inside it.
@pytest.mark.parametrize(("q", "expected"), [
    (0.1, 0.001 * 1 / 2),  # rank 1 of the 2 in the first bucket, which starts at 0
    (0.2, 0.001),  # rank 2: the first bucket's top
    (0.5, 0.001 + (0.01 - 0.001) * (5 - 2) / (8 - 2)),  # rank 5 in (0.001, 0.01]
    (0.9, 0.1),  # rank 9: the third bucket's top
    (0.99, 0.1),  # rank 9.9 in the +Inf bucket: the largest finite bound
])
def test_quantiles_interpolate_within_buckets_like_histogram_quantile(
        q: float, expected: float) -> None:
    h = hist((0.001, 2.0), (0.01, 8.0), (0.1, 9.0), (INF, 10.0))
    assert quantile(q, h) == pytest.approx(expected)


def test_an_empty_histogram_or_one_without_inf_has_no_quantile() -> None:
    assert quantile(0.5, hist((0.001, 0.0), (INF, 0.0))) is None
    assert quantile(0.5, hist((0.001, 1.0), (0.01, 2.0))) is None
    assert quantile(0.5, hist()) is None


def test_the_difference_of_two_scrapes_is_what_happened_between_them() -> None:
    older = hist((0.001, 2.0), (0.01, 4.0), (INF, 4.0))
    newer = hist((0.001, 2.0), (0.01, 14.0), (INF, 15.0))
    assert subtract(newer, older) == hist((0.001, 0.0), (0.01, 10.0), (INF, 11.0))
    assert subtract(newer, None) == newer  # a series new since the last scrape
    assert subtract(older, newer) is None  # counters went back: a restarted daemon
    assert subtract(newer, hist((0.005, 1.0), (INF, 1.0))) is None  # other buckets


def test_a_window_gives_requests_per_second_and_quantiles_per_model() -> None:
    older = {"a": hist((0.001, 0.0), (0.01, 0.0), (INF, 0.0)),
             "b": hist((0.001, 5.0), (0.01, 5.0), (INF, 5.0))}
    newer = {"a": hist((0.001, 10.0), (0.01, 20.0), (INF, 20.0)),
             "b": hist((0.001, 5.0), (0.01, 5.0), (INF, 5.0))}
    result = window(newer, older, elapsed_s=2.0)
    assert result["a"].per_s == 10.0
    assert result["a"].p50_s == pytest.approx(0.001)
    assert result["a"].p99_s == pytest.approx(0.001 + 0.009 * (19.8 - 10) / 10)
    assert result["b"] == Latency(per_s=0.0, p50_s=None, p99_s=None)
    assert window(newer, older, elapsed_s=0.0) == {}


def test_the_tracker_needs_two_scrapes_and_starts_again_after_a_gap() -> None:
    tracker = LatencyTracker()
    first = {"a": hist((0.01, 1.0), (INF, 1.0))}
    second = {"a": hist((0.01, 3.0), (INF, 3.0))}
    assert tracker.update(first, at=10.0) is None
    assert tracker.update(second, at=11.0) == {"a": Latency(2.0, 0.005, 0.0099)}
    assert tracker.update(None, at=12.0) is None  # no /metrics this time
    assert tracker.update(second, at=13.0) is None  # a new first scrape
    tracker.reset()
    assert tracker.update(second, at=14.0) is None


# --- the table ---------------------------------------------------------------------------------


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


# --- the HTTP client, against a fake transport --------------------------------------------------

Handler = Callable[[httpx.Request], httpx.Response]


def answering(metrics: httpx.Response, action: httpx.Response | None = None) -> Handler:
    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/admin/status":
            return httpx.Response(200, json=status_document())
        if request.url.path == "/metrics":
            return metrics
        assert action is not None, request.url.path
        return action
    return handle


def run(handler: Handler, call: Callable[[DaemonClient], Any], key: str | None = None) -> Any:
    async def go() -> Any:
        async with DaemonClient("http://daemon", key, httpx.MockTransport(handler)) as client:
            return await call(client)
    return asyncio.run(go())


def test_a_poll_reads_the_status_and_the_histograms() -> None:
    poll = run(answering(httpx.Response(200, text=METRICS)), lambda c: c.poll())
    assert [m.name for m in poll.status.models] == ["classifier", "embedder"]
    assert poll.histograms is not None
    assert poll.histograms["a"].count == 6.0
    assert poll.metrics_note is None


@pytest.mark.parametrize(("answer", "note"), [
    (httpx.Response(404, json={"error": "Not Found"}), "no /metrics on this daemon"),
    (httpx.Response(403, json={"error": "permission denied"}), "/metrics refused (403)"),
    (httpx.Response(200, text="{{ not metrics"), "/metrics is not Prometheus text"),
])
def test_a_daemon_without_usable_metrics_still_gives_a_poll_without_histograms(
        answer: httpx.Response, note: str) -> None:
    poll = run(answering(answer), lambda c: c.poll())
    assert poll.histograms is None
    assert poll.metrics_note == note
    assert len(poll.status.models) == 2


def test_the_api_key_travels_as_x_api_key() -> None:
    seen: list[str | None] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("X-API-Key"))
        return answering(httpx.Response(404))(request)

    run(handle, lambda c: c.poll(), key="snz_secret")
    assert seen == ["snz_secret", "snz_secret"]


def test_a_refused_unload_raises_with_the_daemons_error_text() -> None:
    refusal = httpx.Response(403, json={
        "error": "permission denied: repository_unload needs role 'admin' "
                 "(this credential has 'readonly')"})
    with pytest.raises(DaemonRefused) as caught:
        run(answering(httpx.Response(404), refusal), lambda c: c.unload("a b"))
    assert caught.value.status == 403
    assert caught.value.message == (
        "unload 'a b': 403 permission denied: repository_unload needs role 'admin' "
        "(this credential has 'readonly')")


def test_load_posts_to_the_repository_api_with_the_name_quoted() -> None:
    paths: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        paths.append(f"{request.method} {request.url.raw_path.decode()}")
        return httpx.Response(200, json={})

    run(handle, lambda c: c.load("a/b"))
    assert paths == ["POST /v2/repository/models/a%2Fb/load"]


def test_no_answer_and_a_non_status_answer_are_monitor_errors() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("Connection refused", request=request)

    with pytest.raises(DaemonUnreachable, match="cannot reach http://daemon: Connection refused"):
        run(refuse, lambda c: c.poll())

    def html(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text="<html>hello</html>")

    with pytest.raises(MonitorError, match="did not answer a status"):
        run(html, lambda c: c.poll())

    def odd(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=json.dumps({"server": {}}))

    with pytest.raises(MonitorError, match="did not answer a status"):
        run(odd, lambda c: c.poll())
