"""The HTTP transport: the inference fast path on the daemon's own protocol, the Starlette routes,
body reading and connection limits."""
