"""`snooze monitor`: a terminal dashboard that talks to a daemon over HTTP only.

    status.py    /admin/status JSON -> typed rows (pure)
    latency.py   /metrics histograms -> requests/s, p50, p99 between two polls (pure)
    table.py     columns, formatting, sorting, filtering, the plain-text table (pure)
    client.py    the HTTP side: one poll, load, unload (httpx)
    once.py      `--once`: one table on stdout, no Textual
    app.py       the Textual app

Only app.py imports Textual, so the rest is usable and tested without a terminal.
"""
