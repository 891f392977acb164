"""The monitor reading /admin/status (monitor/status.py): typed rows with timers measured on the
daemon's clock, recent events when sent, odd fields as empty, and a refusal of what is not a
status. No daemon. (Latency: test_latency.py; the table: test_table.py; the HTTP client:
test_client.py.)"""

from __future__ import annotations

import pytest
from monitor_answers import status_document

from snoozeml.monitor.status import StatusFormatError, parse_status, parse_time


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


def test_an_adaptive_models_prewarm_is_measured_on_the_daemons_clock() -> None:
    document = status_document()
    document["models"][1]["keep_alive"] = {"mode": "adaptive",
                                           "prewarm_at": "2026-12-01T00:10:35.044Z"}
    classifier, embedder = parse_status(document).models
    assert embedder.prewarm_in_s == pytest.approx(12.0)
    assert classifier.prewarm_in_s is None  # no keep_alive sent (an older daemon)
