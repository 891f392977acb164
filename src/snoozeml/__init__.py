"""SnoozeML: a multi-model inference daemon that scales idle models to zero."""

from __future__ import annotations

import os

# onnxruntime 1.32 on Linux queues usage events in ~/.cache/Microsoft/... (three descriptors held
# for the process's life) to send them to Microsoft. A server sends nothing anywhere unless its
# operator asks: off, unless ORT_DISABLE_TELEMETRY is already set. It is read when onnxruntime
# is imported, which is after this in every SnoozeML process.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

__version__ = "0.1.0"
SERVER_NAME = "snoozeml"
