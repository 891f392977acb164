"""SnoozeML: a multi-model inference daemon that scales idle models to zero."""

from __future__ import annotations

import os

# onnxruntime 1.32 on Linux queues usage events in ~/.cache/Microsoft/... (three descriptors held
# for the process's life) to send them to Microsoft. A server sends nothing anywhere unless its
# operator asks: off, unless ORT_DISABLE_TELEMETRY is already set. It is read when onnxruntime
# is imported, which is after this in every SnoozeML process.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

# numpy's OpenBLAS starts a thread for each core but one at numpy's import, and they spin (busy)
# for 2**28 cycles, about 0.1 s, before they sleep, at the import and after every BLAS call: a
# core taken from the event loop for nothing, at every start. As onnxruntime's (allow_spinning off,
# runtime/onnx/sessions.py), they sleep as soon as their work is done (the shortest timeout
# OpenBLAS takes, 2**4 cycles), unless the environment says otherwise. Read at numpy's import.
if "OPENBLAS_THREAD_TIMEOUT" not in os.environ and "GOTO_THREAD_TIMEOUT" not in os.environ:
    os.environ["OPENBLAS_THREAD_TIMEOUT"] = "4"

__version__ = "0.1.0"
SERVER_NAME = "snoozeml"
