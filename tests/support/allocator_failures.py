"""Errors a backend must and must not take for out of memory: the table every backend's
`is_out_of_memory` is held to."""

from __future__ import annotations

import pytest

ALLOCATOR_FAILURES = [
    pytest.param(MemoryError(), True, id="MemoryError"),
    pytest.param(MemoryError("cannot allocate array"), True, id="MemoryError-with-text"),
    pytest.param(RuntimeError(
        "[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status code returned while "
        "running MatMul node. Status Message: bfc_arena.cc:376 Failed to allocate memory for "
        "requested buffer of size 4000000000000"
    ), True, id="onnxruntime-arena"),
    pytest.param(RuntimeError("std::bad_alloc"), True, id="bad_alloc"),
    pytest.param(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"), True,
                 id="cuda-out-of-memory"),
    pytest.param(RuntimeError("CUDA failure 2: cudaErrorMemoryAllocation"), True,
                 id="cudaErrorMemoryAllocation"),
    pytest.param(ValueError("shapes (2,3) and (4,5) not aligned"), False, id="a-normal-error"),
    pytest.param(RuntimeError("Failed to load model with error: file not found"), False,
                 id="a-failure-that-is-not-memory"),
    pytest.param(KeyError("memory"), False, id="a-mention-of-memory-alone"),
]
