"""Exit codes of `snooze pull` and `snooze scan`: domain errors mapped in one table.

Documented in docs/hub.md. 2 is also what argparse exits with on bad arguments, and what
`snooze serve` exits with on an invalid models.toml.
"""

from __future__ import annotations

import sys

from snoozeml.errors import ConfigError, SnoozeError
from snoozeml.hub.errors import (
    AccessDenied,
    DownloadFailed,
    HubUnreachable,
    InvalidReference,
    NothingServable,
    RepoNotFound,
    RevisionNotFound,
)

OK = 0
INTERNAL_ERROR = 1  # a bug: reported in one line, without a traceback
USAGE = 2  # bad arguments, or a models.toml that cannot be read, parsed or written
REPO_NOT_FOUND = 3
REVISION_NOT_FOUND = 4
ACCESS_DENIED = 5  # gated repository without access, or a token the Hub rejects
HUB_UNREACHABLE = 6  # no network, endpoint down, or offline with nothing downloaded yet
NOTHING_SERVABLE = 7  # no ONNX or safetensors model in the repository or folder
DOWNLOAD_FAILED = 8  # any other Hub answer, or a disk error while downloading

_TABLE: tuple[tuple[type[SnoozeError], int], ...] = (
    (InvalidReference, USAGE),
    (ConfigError, USAGE),
    (RepoNotFound, REPO_NOT_FOUND),
    (RevisionNotFound, REVISION_NOT_FOUND),
    (AccessDenied, ACCESS_DENIED),
    (HubUnreachable, HUB_UNREACHABLE),
    (NothingServable, NOTHING_SERVABLE),
    (DownloadFailed, DOWNLOAD_FAILED),
)


def exit_code_for(error: SnoozeError) -> int:
    for kind, code in _TABLE:
        if isinstance(error, kind):
            return code
    return INTERNAL_ERROR


def report_failure(exc: Exception, command: str) -> int:
    """A command's boundary: print the failure as `snooze: …` lines on stderr, never a
    traceback, and return its exit code."""
    if isinstance(exc, ConfigError):
        for problem in exc.problems:
            print(f"snooze: {problem}", file=sys.stderr)
    elif isinstance(exc, SnoozeError):
        print(f"snooze: {exc.message}", file=sys.stderr)
    else:
        print(f"snooze: {command} failed unexpectedly: {type(exc).__name__}: {exc}",
              file=sys.stderr)
    return exit_code_for(exc) if isinstance(exc, SnoozeError) else INTERNAL_ERROR
