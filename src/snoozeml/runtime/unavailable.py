"""A backend that always fails to load, with a message saying why (e.g. a missing extra)."""

from __future__ import annotations

from snoozeml.config import ModelConfig
from snoozeml.runtime.base import Instance


class UnavailableBackend:
    def __init__(self, reason: str) -> None:
        self.reason = reason

    def load_blocking(self, spec: ModelConfig) -> Instance:
        raise RuntimeError(self.reason)
