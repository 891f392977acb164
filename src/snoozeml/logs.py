"""Structured key=value log events: `model_loaded model=minilm ms=84 bytes=1048576`."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

_LOGGER = logging.getLogger("snoozeml")


def _format_value(value: Any) -> str:
    if isinstance(value, float):
        text = f"{value:.3f}".rstrip("0").rstrip(".") if value == value else "nan"
    else:
        text = str(value)
    if text == "" or any(c.isspace() or c in '"=' for c in text):
        escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'"{escaped}"'
    return text


def format_event(event: str, fields: dict[str, Any]) -> str:
    parts = [event]
    parts.extend(f"{key}={_format_value(value)}" for key, value in fields.items())
    return " ".join(parts)


def log_event(event: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log one structured event. Values with spaces or quotes are quoted."""
    if _LOGGER.isEnabledFor(level):
        _LOGGER.log(level, format_event(event, fields))


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line = f"{stamp}.{int(record.msecs):03d}Z {record.levelname} {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class _GrpcAnswerToNobody(logging.Filter):
    """grpcio's asyncio server logs ERROR with a traceback when it cannot send the answer of a
    call its client has just cancelled, or whose deadline has just passed (grpc/grpc#32551):
    nothing failed but the client's patience. It becomes one debug event."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("grpc") and "ExecuteBatchError" in record.getMessage():
            log_event("grpc_answer_undelivered", logging.DEBUG,
                      detail="the client cancelled the call, or its deadline passed")
            return False
        return True


def configure_logging(level: str) -> None:
    """Send SnoozeML's events to stderr at `level`; quieten chatty libraries."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter())
    handler.addFilter(_GrpcAnswerToNobody())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    _LOGGER.setLevel(level.upper())
