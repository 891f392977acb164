"""A memory probe whose numbers the test sets: what engine/memory/ measures, without a device."""

from __future__ import annotations


class FakeProbe:
    """A MemoryProbe with numbers set by the test: host total, GPU totals, per-device use."""

    def __init__(self, host_total: int, gpu_totals: dict[str, int] | None = None) -> None:
        self.totals = {"cpu": host_total, **(gpu_totals or {})}
        self.process = dict.fromkeys(self.totals, 0)

    def gpus(self) -> list[str]:
        return [device for device in self.totals if device != "cpu"]

    def total(self, device: str) -> int:
        return self.totals[device]

    def used(self, device: str) -> int:
        return self.process[device]

    def reset_peak(self, device: str) -> None:
        pass

    def peak(self, device: str) -> int | None:
        return None  # the fake's use only changes when the test says: no peak to learn
