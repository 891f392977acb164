"""Errors of `snooze pull` and `snooze scan`: a branch of the domain tree in snoozeml.errors.

    SnoozeError
    └── HubError                 a pull or scan that cannot be carried out
        ├── InvalidReference     not ORG/NAME[@REVISION], or two different revisions
        ├── RepoNotFound         no such repository (or it is private and the token cannot see it)
        ├── RevisionNotFound     the repository has no such branch, tag or commit
        ├── AccessDenied         a gated repository without (or with a rejected) token
        ├── HubUnreachable       no network, the endpoint is down, or offline with nothing local
        ├── NothingServable      no ONNX or safetensors model in the repository or folder
        └── DownloadFailed       any other Hub answer or disk error during the download

Like every domain error, these carry no process exit codes: the CLI maps them in one table
(snoozeml.cli.exit_codes).
"""

from __future__ import annotations

from snoozeml.errors import SnoozeError


class HubError(SnoozeError):
    """A pull or scan that cannot be carried out; the message says what to do about it."""


class InvalidReference(HubError):
    pass


class RepoNotFound(HubError):
    pass


class RevisionNotFound(HubError):
    pass


class AccessDenied(HubError):
    pass


class HubUnreachable(HubError):
    pass


class NothingServable(HubError):
    pass


class DownloadFailed(HubError):
    pass
