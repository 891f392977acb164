"""Fixtures of the runtime's tests."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture
def torch_backend() -> Any:
    """A TorchBackend class (torch is a dev dependency; skipped where it is missing)."""
    pytest.importorskip("torch")
    from snoozeml.runtime.torch.backend import TorchBackend

    return TorchBackend
