"""SnoozeML: a multi-model inference daemon that scales idle models to zero."""

from __future__ import annotations

__version__ = "0.1.0"
SERVER_NAME = "snoozeml"
