"""`GET /metrics`: Prometheus series summed from engine events, gauges read at each scrape."""
