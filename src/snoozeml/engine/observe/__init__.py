"""What the engine shows: subscribers of the event bus (counters for /admin/status, Triton
statistics, recent events, log lines) and the typed snapshots."""
