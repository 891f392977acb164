"""What a daemon answers the monitor: an /admin/status document and a /metrics text with
request-duration histograms. The monitor's status, latency and client tests read them."""

from __future__ import annotations

from typing import Any


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
