"""The demo's pynvml-shaped library with the GPU bus ids and processes of one test host.

Tests that join GPUs to ``/sys`` (NUMA nodes by PCI bus id) and processes to
``/proc`` give each case its own bus ids and process lists; the rest of the
simulated 8-GPU node stays as ``trainmon.demo.gpus.SimulatedNVML`` has it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

from trainmon.demo.gpus import SimulatedNVML


class NodeNVML(SimulatedNVML):
    """``bus_ids`` for the first GPUs (the others get unused ids), ``processes`` by GPU index."""

    def __init__(self, bus_ids: Sequence[str], processes: Mapping[int, Sequence[int]]) -> None:
        super().__init__()
        self.bus_ids = list(bus_ids) + [f"00000000:{0xE0 + i:02X}:00.0" for i in range(8)]
        self.pids = processes

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        return SimpleNamespace(busId=self.bus_ids[self._check(handle)])

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        pids = self.pids.get(self._check(handle), ())
        return [SimpleNamespace(pid=pid, usedGpuMemory=2**30) for pid in pids]
