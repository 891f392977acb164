"""The daemon's log lines: ``2026-01-01T00:00:00.000Z INFO event key=value …``."""

from __future__ import annotations

import calendar
import re
import time
from dataclasses import dataclass, field

LOG_LINE = re.compile(
    r"^(?P<stamp>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(?P<ms>\d+))?Z (?P<level>[A-Z]+) "
    r"(?P<event>\S+)(?P<rest>.*)$"
)
FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')


@dataclass(frozen=True)
class LogLine:
    at: float  # wall-clock seconds (the daemon's timestamp, to the millisecond)
    level: str
    event: str
    rest: str  # the fields' text
    fields: dict[str, str] = field(default_factory=dict)


def parse(line: str) -> LogLine | None:
    """One log line, or None for a line outside the format (a traceback's, say)."""
    match = LOG_LINE.match(line)
    if match is None:
        return None
    stamp = calendar.timegm(time.strptime(match["stamp"], "%Y-%m-%dT%H:%M:%S"))
    at = stamp + int((match["ms"] or "0")[:3].ljust(3, "0")) / 1000.0
    fields = {key: value.strip('"') for key, value in FIELD.findall(match["rest"])}
    return LogLine(at, match["level"], match["event"], match["rest"], fields)


def strip_stamp(line: str) -> str:
    """``2026-01-01T00:00:00.000Z INFO replica_added …`` -> ``replica_added …``."""
    parts = line.split(" ", 2)
    return parts[2] if len(parts) == 3 and parts[0].endswith("Z") else line
