"""`SNOOZE_*` environment variables: which `[server]` key each one overrides, written into the
raw table before it is validated (so a bad value is reported naming the variable)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_ENV_KEYS: dict[str, tuple[str, ...]] = {
    "SNOOZE_HOST": ("host",),
    "SNOOZE_HTTP_PORT": ("http_port",),
    "SNOOZE_GRPC_PORT": ("grpc_port",),
    "SNOOZE_IDLE_TIMEOUT": ("idle_timeout",),
    "SNOOZE_KEEP_ALIVE": ("keep_alive",),
    "SNOOZE_LOAD_TIMEOUT": ("load_timeout",),
    "SNOOZE_DRAIN_TIMEOUT": ("drain_timeout",),
    "SNOOZE_MAX_REQUEST_SIZE": ("max_request_size",),
    "SNOOZE_GRPC_MAX_MESSAGE_SIZE": ("grpc_max_message_size",),
    "SNOOZE_LOG_LEVEL": ("log_level",),
    "SNOOZE_MAX_HEADER_SIZE": ("max_header_size",),
    "SNOOZE_MAX_REQUEST_LINE": ("max_request_line",),
    "SNOOZE_MAX_CONNECTIONS": ("max_connections",),
    "SNOOZE_KEEP_ALIVE_TIMEOUT": ("keep_alive_timeout",),
    "SNOOZE_HEADER_TIMEOUT": ("header_timeout",),
    "SNOOZE_BODY_TIMEOUT": ("body_timeout",),
    "SNOOZE_GRPC_MAX_METADATA_SIZE": ("grpc_max_metadata_size",),
    "SNOOZE_GRPC_MAX_CONCURRENT_STREAMS": ("grpc_max_concurrent_streams",),
    "SNOOZE_GRPC_KEEPALIVE_TIME": ("grpc_keepalive_time",),
    "SNOOZE_GRPC_KEEPALIVE_TIMEOUT": ("grpc_keepalive_timeout",),
    "SNOOZE_GRPC_KEEPALIVE_MIN_TIME": ("grpc_keepalive_min_time",),
    "SNOOZE_CACHE_DIR": ("cache_dir",),
    "SNOOZE_MAX_EMBEDDING_INPUTS": ("max_embedding_inputs",),
    "SNOOZE_MAX_RERANK_DOCUMENTS": ("max_rerank_documents",),
    "SNOOZE_MODELMESH_PORT": ("modelmesh_port",),
    "SNOOZE_MODELMESH_HOST": ("modelmesh_host",),
    "SNOOZE_HOST_BUDGET": ("memory", "host_budget"),
    "SNOOZE_GPU_BUDGET": ("memory", "gpu_budget"),
    "SNOOZE_MEMORY_WAIT": ("memory", "memory_wait"),
    "SNOOZE_MIN_RESIDENCY": ("memory", "min_residency"),
    "SNOOZE_EVICTION": ("memory", "eviction"),
}

_INTEGER_KEYS = frozenset({"http_port", "grpc_port", "max_connections",
                           "grpc_max_concurrent_streams", "max_embedding_inputs",
                           "max_rerank_documents", "modelmesh_port"})


def apply_env(server: dict[str, Any], environ: Mapping[str, str]) -> dict[str, str]:
    """Write SNOOZE_* values into the raw [server] table; returns key path -> variable name."""
    origins: dict[str, str] = {}
    for var, path in _ENV_KEYS.items():
        if var not in environ:
            continue
        table = server
        for part in path[:-1]:
            inner = table.get(part)
            if not isinstance(inner, dict):
                inner = {}
                table[part] = inner
            table = inner
        value: Any = environ[var]
        if path[-1] == "log_level":
            value = value.lower()
        elif path[-1] in _INTEGER_KEYS and value.strip().isdigit():
            value = int(value)  # the environment gives text; these keys take the integer
        table[path[-1]] = value
        origins[".".join(("server", *path))] = var
    return origins
