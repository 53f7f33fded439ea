"""GPU energy through NVML's total-energy counter (millijoules since driver load), when offered.

`EnergyMeter()` opens NVML lazily; `read_j()` returns joules or None (no nvidia-ml-py, no GPU, or a GPU
without the counter, which NVML reports as not supported). Nothing happens at import time.
"""

from __future__ import annotations

from typing import Optional


class EnergyMeter:
    def __init__(self, device: int = 0):
        self.device = device
        self._handle = None
        self._nvml = None
        self._broken = False

    def _open(self) -> bool:
        if self._handle is not None:
            return True
        if self._broken:
            return False
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.device)
            pynvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)
            self._nvml = pynvml
            return True
        except Exception:
            self._broken = True
            self._handle = None
            return False

    def read_j(self) -> Optional[float]:
        """Total energy in joules since the driver loaded, or None when unavailable."""
        if not self._open():
            return None
        try:
            return self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle) / 1000.0
        except Exception:
            return None


def joules_between(start: Optional[float], end: Optional[float]) -> Optional[float]:
    if start is None or end is None or end <= start:
        return None
    return end - start
