"""Hugging Face Hub pulls and directory scans that write models.toml entries.

    scan.py           find models in a folder, reading metadata only
    classifiers.py    which scanned models are text classifiers, and which rerank
    select.py         which files of a repository serving needs (a pure policy)
    config_writer.py  render entries as TOML; merge them into a models.toml, appending only
    pull.py           download through huggingface_hub, then scan and merge
    errors.py         the HubError branch of the error tree
"""

from __future__ import annotations

from snoozeml.hub.config_writer import MergeResult, Skip, merge_into, render_toml
from snoozeml.hub.errors import (
    AccessDenied,
    DownloadFailed,
    HubError,
    HubUnreachable,
    InvalidReference,
    NothingServable,
    RepoNotFound,
    RevisionNotFound,
)
from snoozeml.hub.pull import PullResult, folder_for, parse_reference, pull
from snoozeml.hub.scan import ScannedModel, ScanResult, Skipped, scan, scan_directory
from snoozeml.hub.select import select_files

__all__ = [
    "AccessDenied",
    "DownloadFailed",
    "HubError",
    "HubUnreachable",
    "InvalidReference",
    "MergeResult",
    "NothingServable",
    "PullResult",
    "RepoNotFound",
    "RevisionNotFound",
    "ScanResult",
    "ScannedModel",
    "Skip",
    "Skipped",
    "folder_for",
    "merge_into",
    "parse_reference",
    "pull",
    "render_toml",
    "scan",
    "scan_directory",
    "select_files",
]
