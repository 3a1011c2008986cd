"""Slow-changing GPU health readings, re-read at most every ``refresh_seconds``.

What a driver says about a GPU's hardware that moves in minutes, not seconds:
the PCIe link's maximum width and generation, the SM clock's maximum, row
remapping (``nvmlDeviceGetRemappedRows``), page retirement
(``nvmlDeviceGetRetiredPages`` per cause, ``…PendingStatus``), the state of
every NVLink link (``nvmlDeviceGetNvLinkState`` for each of the links field
``NVML_FI_DEV_NVLINK_LINK_COUNT`` names) and NVSwitch fabric registration
(``nvmlDeviceGetGpuFabricInfoV``, version 2; ``nvmlDeviceGetGpuFabricInfo`` on
a driver without it). ``HealthReader.read`` answers from its cache and re-reads
a GPU once its reading is older than ``refresh_seconds`` or the NVML session
changed (a driver reload): about 8 + links calls per GPU per refresh instead of
per scrape. The readings that move with load or count events (current link
width and generation, PCIe replays, the recovery action) are read on every
scrape by ``NVML.read``.

Every call goes through the facade's chokepoint (``NVML.query``): NOT_SUPPORTED
and an older driver's missing function leave the reading out, GPU_IS_LOST raises
``GPULost`` for that GPU (nothing cached), an unexpected error is named in
``GPUHealth.failed`` until the next refresh.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainmon.gpu import nvml as nvml_module
from trainmon.gpu.nvml import (
    CLOCK_SM,
    FABRIC_STATE_COMPLETED,
    FABRIC_STATE_NOT_SUPPORTED,
    FEATURE_ENABLED,
    NVML,
    PAGE_RETIREMENT_DOUBLE_BIT,
    PAGE_RETIREMENT_SINGLE_BIT,
    NVMLSession,
)
from trainmon.gpu.types import GPUHealth

#: Default seconds between two reads of one GPU's slow health readings.
REFRESH_SECONDS = 60.0
_FABRIC_V = "nvmlDeviceGetGpuFabricInfoV"


@dataclass(frozen=True)
class _Cached:
    health: GPUHealth
    generation: int
    read_at: float


class HealthReader:
    """Every GPU's ``GPUHealth``, cached for ``refresh_seconds`` (thread-safe)."""

    def __init__(
        self,
        nvml: NVML,
        *,
        refresh_seconds: float = REFRESH_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nvml = nvml
        self._refresh = refresh_seconds
        self._clock = clock
        self._cache: dict[int, _Cached] = {}
        self._lock = threading.Lock()

    def read(self, index: int) -> GPUHealth:
        """GPU ``index``'s health, re-read when stale; ``GPULost`` while it is lost.

        The lock guards the cache only: two scrapes that meet a stale reading may
        both re-read it, neither waits on the other's NVML calls."""
        with self._lock:
            cached = self._cache.get(index)
        if (
            cached is not None
            and cached.generation == self._nvml.generation
            and self._clock() - cached.read_at < self._refresh
        ):
            return cached.health
        health = self._read(index)
        with self._lock:
            self._cache[index] = _Cached(health, self._nvml.generation, self._clock())
        return health

    def _read(self, index: int) -> GPUHealth:
        session, handle = self._nvml.device(index)
        lib = self._nvml.library
        failed: list[str] = []

        def query(call: Callable[..., Any], *args: Any) -> Any:
            return self._nvml.query(
                index, call, handle, *args, session=session, failed=failed, variant=args
            )

        # the link's maximum, the lower of the GPU's and the host's: a Gen5 GPU in a Gen4
        # slot runs at its best at Gen4 (the GPU's own, nvmlDeviceGetGpuMaxPcieLinkGeneration,
        # would call it degraded for life)
        max_generation = query(lib.nvmlDeviceGetMaxPcieLinkGeneration)
        max_clock = query(lib.nvmlDeviceGetMaxClockInfo, CLOCK_SM)
        remapped = query(lib.nvmlDeviceGetRemappedRows)
        retired: dict[str, int] = {}
        for cause, code in (
            ("single_bit", PAGE_RETIREMENT_SINGLE_BIT),
            ("double_bit", PAGE_RETIREMENT_DOUBLE_BIT),
        ):
            pages = query(lib.nvmlDeviceGetRetiredPages, code)
            if pages is not None:
                retired[cause] = len(pages)
        pending = query(lib.nvmlDeviceGetRetiredPagesPendingStatus)
        return GPUHealth(
            pcie_link_max_width=_whole(query(lib.nvmlDeviceGetMaxPcieLinkWidth)),
            pcie_link_max_generation=_whole(max_generation),
            sm_clock_max_hertz=None if max_clock is None else float(max_clock) * 1e6,  # MHz
            remapped_rows=(
                {}
                if remapped is None
                else {"correctable": int(remapped[0]), "uncorrectable": int(remapped[1])}
            ),
            row_remap_pending=None if remapped is None else bool(remapped[2]),
            row_remap_failed=None if remapped is None else bool(remapped[3]),
            retired_pages=retired,
            retired_pages_pending=None if pending is None else bool(pending),
            nvlink_up=self._nvlink_up(index, handle, session, query, failed),
            fabric_up=self._fabric_up(index, handle, session, failed),
            failed=tuple(failed),
        )

    def _nvlink_up(
        self,
        index: int,
        handle: Any,
        session: NVMLSession,
        query: Callable[..., Any],
        failed: list[str],
    ) -> dict[int, bool]:
        """Link index → active, for each link the GPU has (none without NVLink)."""
        links = self._nvml.nvlink_count(index, handle, session, failed)
        states: dict[int, bool] = {}
        for link in range(links):
            state = query(self._nvml.library.nvmlDeviceGetNvLinkState, link)
            if state is not None:
                states[link] = int(state) == FEATURE_ENABLED
        return states

    def _fabric_up(
        self, index: int, handle: Any, session: NVMLSession, failed: list[str]
    ) -> bool | None:
        """True when fabric registration completed with success; None without a fabric.

        The struct is filled in place (pynvml answers ``NVML_SUCCESS``, 0); the
        call is told apart from an omitted one by its answer not being None.
        ``ctypes`` is imported here, where NVML (which loaded it) already runs: a
        node without a GPU never needs it."""
        import ctypes

        lib = self._nvml.library
        versioned = not self._nvml.is_missing(_FABRIC_V)
        call, info = lib.nvmlDeviceGetGpuFabricInfoV, nvml_module.GPUFabricInfoV()
        if not versioned:
            call, info = lib.nvmlDeviceGetGpuFabricInfo, nvml_module.GPUFabricInfo()
        answered = self._nvml.query(
            index, call, handle, ctypes.byref(info), session=session, failed=failed
        )
        if answered is None and versioned and self._nvml.is_missing(_FABRIC_V):
            return self._fabric_up(index, handle, session, failed)  # older driver: v1 call
        if answered is None or int(info.state) == FABRIC_STATE_NOT_SUPPORTED:
            return None
        return int(info.state) == FABRIC_STATE_COMPLETED and int(info.status) == 0


def _whole(value: Any) -> int | None:
    return None if value is None else int(value)
