"""The HTTP transport: the inference fast path on the daemon's own protocol, the FastAPI routes,
body reading and connection limits."""
