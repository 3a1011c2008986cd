"""The NVML facade — the only module that imports ``pynvml`` (``nvidia-ml-py``).

``NVML`` opens a session lazily, under a lock, on first use, and turns every
NVML call into a plain Python value in base units through one chokepoint,
``NVML.query``, which is the only place NVML return codes are interpreted:

- ``NOT_SUPPORTED`` / ``NO_PERMISSION``: the reading is omitted (``None``),
  logged once per function;
- ``FUNCTION_NOT_FOUND`` (a driver older than the bindings): omitted, one log
  line per function, and that function is not called again;
- ``GPU_IS_LOST``: ``GPULost`` for that GPU only; it is probed again every
  ``retry_seconds``;
- ``UNINITIALIZED`` / ``DRIVER_NOT_LOADED`` / ``LIB_RM_VERSION_MISMATCH``: the
  session is dropped and re-opened (rate-limited) — this is how a driver reload
  is survived; meanwhile ``NVMLUnavailable`` is raised;
- ``ARGUMENT_VERSION_MISMATCH`` (the driver and nvidia-ml-py disagree on a
  struct version): omitted like ``NOT_SUPPORTED``, for the rest of the session;
- anything else: the reading is omitted and the GPU is reported as erroring.

A missing library or driver raises ``NVMLUnavailable`` (a
``CollectorUnavailable``) with a hint, never a crash. The library is any object
with pynvml's function names (``NVMLLibrary``): ``pynvml`` itself, or the
simulated node of ``trainmon.demo.gpus``, so the same code serves both;
``pynvml`` is imported only when a session first opens (a node without
libnvidia-ml.so.1 never imports it, see ``_check_library``). The
values and errors handed out, and ``NVMLLibrary``, are in ``trainmon.gpu.types``;
XID events (an event set and its listener thread) in ``trainmon.gpu.events``;
GPM activity (the sample buffers and the thread that owns them) in
``trainmon.gpu.gpm``, over the ``gpm_*`` calls here; the slow-changing health
readings (row remapping, retired pages, NVLink states, fabric) in
``trainmon.gpu.health``, through ``device`` and ``query``. MIG: a GPU in MIG mode
hands out its GPU instances (``mig_instances``: id, profile, uuid, memory),
their GPM samples (``gpm_mig_sample``) and its processes with their instance;
the layout is read once per session on a GPU without MIG mode, else again
every ``mig_refresh_seconds``; a driver or GPU without the MIG calls (or the
simulated node) simply has no instances.
Device readings are documented in ``docs/metrics.md`` (GPU section).
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple, TypeVar, cast

from trainmon.gpu.types import (
    GPMActivity,
    GPUIdentity,
    GPULost,
    GPUProcess,
    GPUReadings,
    MIGInstance,
    NVMLLibrary,
    NVMLUnavailable,
)
from trainmon.logthrottle import LogThrottle

log = logging.getLogger(__name__)
T = TypeVar("T")

# NVML constants (ABI-stable numbers from nvml.h, named after pynvml's; tests/gpu holds
# them equal to pynvml's), re-exported for the simulated backend. Numbers rather than
# pynvml's names, so that a node without NVML never imports pynvml (with ctypes,
# subprocess, shutil): it is imported when a session is opened (``_import_pynvml``).
ERROR_UNINITIALIZED: int = 1  # NVML_ERROR_UNINITIALIZED
ERROR_NOT_SUPPORTED: int = 3  # NVML_ERROR_NOT_SUPPORTED
ERROR_NO_PERMISSION: int = 4  # NVML_ERROR_NO_PERMISSION
ERROR_NOT_FOUND: int = 6  # NVML_ERROR_NOT_FOUND
ERROR_DRIVER_NOT_LOADED: int = 9  # NVML_ERROR_DRIVER_NOT_LOADED
ERROR_TIMEOUT: int = 10  # NVML_ERROR_TIMEOUT
ERROR_LIBRARY_NOT_FOUND: int = 12  # NVML_ERROR_LIBRARY_NOT_FOUND
ERROR_FUNCTION_NOT_FOUND: int = 13  # NVML_ERROR_FUNCTION_NOT_FOUND
ERROR_GPU_IS_LOST: int = 15  # NVML_ERROR_GPU_IS_LOST
ERROR_LIB_RM_VERSION_MISMATCH: int = 18  # NVML_ERROR_LIB_RM_VERSION_MISMATCH
ERROR_ARGUMENT_VERSION_MISMATCH: int = 25  # NVML_ERROR_ARGUMENT_VERSION_MISMATCH
ERROR_UNKNOWN: int = 999  # NVML_ERROR_UNKNOWN
GPU_UTILIZATION_SAMPLES: int = 1  # NVML_GPU_UTILIZATION_SAMPLES
EVENT_XID_CRITICAL_ERROR: int = 8  # nvmlEventTypeXidCriticalError
TEMPERATURE_GPU: int = 0  # NVML_TEMPERATURE_GPU
CLOCK_SM: int = 1  # NVML_CLOCK_SM
MEMORY_ERROR_CORRECTED: int = 0  # NVML_MEMORY_ERROR_TYPE_CORRECTED
MEMORY_ERROR_UNCORRECTED: int = 1  # NVML_MEMORY_ERROR_TYPE_UNCORRECTED
VOLATILE_ECC: int = 0  # NVML_VOLATILE_ECC
FIELD_PCIE_TX_BYTES: int = 197  # NVML_FI_DEV_PCIE_COUNT_TX_BYTES
FIELD_PCIE_RX_BYTES: int = 198  # NVML_FI_DEV_PCIE_COUNT_RX_BYTES
FIELD_NVLINK_DATA_TX_KIB: int = 138  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX
FIELD_NVLINK_DATA_RX_KIB: int = 139  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
FIELD_NVLINK_LINK_COUNT: int = 91  # NVML_FI_DEV_NVLINK_LINK_COUNT
FIELD_GPU_RECOVERY_ACTION: int = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
PAGE_RETIREMENT_SINGLE_BIT: int = 0  # NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
PAGE_RETIREMENT_DOUBLE_BIT: int = 1  # NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
FEATURE_ENABLED: int = 1  # NVML_FEATURE_ENABLED (an active NVLink)
FABRIC_STATE_NOT_SUPPORTED: int = 0  # NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
FABRIC_STATE_COMPLETED: int = 3  # NVML_GPU_FABRIC_STATE_COMPLETED
MIG_ENABLED: int = 1  # NVML_DEVICE_MIG_ENABLE
#: ``gpuInstanceId`` of a process outside MIG (NVML's 0xFFFFFFFF "invalid").
NO_GPU_INSTANCE = 0xFFFFFFFF
#: Seconds between two reads of a MIG GPU's instance layout (instances come and go
#: without a GPU reset; MIG mode itself changes only with one: read once per session).
MIG_REFRESH_SECONDS = 60.0
#: MIG devices read per GPU at most, whatever ``nvmlDeviceGetMaxMigDeviceCount`` says
#: (every MIG GPU so far, A100 to B200, has at most 7).
MAX_MIG_DEVICES = 8
#: ``scopeId`` that asks an NVLink field for the sum over all links (nvml.h).
SCOPE_ALL_LINKS = 0xFFFFFFFF

#: ``reason`` label → NVML perf policy read with ``nvmlDeviceGetViolationStatus``.
THROTTLE_REASONS: Mapping[str, int] = {
    "power": 0,  # NVML_PERF_POLICY_POWER
    "thermal": 1,  # NVML_PERF_POLICY_THERMAL
    "sync_boost": 2,  # NVML_PERF_POLICY_SYNC_BOOST
    "board_limit": 3,  # NVML_PERF_POLICY_BOARD_LIMIT
    "low_utilization": 4,  # NVML_PERF_POLICY_LOW_UTILIZATION
    "reliability": 5,  # NVML_PERF_POLICY_RELIABILITY
    "app_clocks": 10,  # NVML_PERF_POLICY_TOTAL_APP_CLOCKS
    "base_clocks": 11,  # NVML_PERF_POLICY_TOTAL_BASE_CLOCKS
}
#: GPM metric ids (``nvmlGpmMetricId_t``, percent 0–100) read by ``NVML.gpm_activity``.
GPM_SM_ACTIVE: int = 2  # NVML_GPM_METRIC_SM_UTIL
GPM_SM_OCCUPANCY: int = 3  # NVML_GPM_METRIC_SM_OCCUPANCY
GPM_TENSOR_ACTIVE: int = 5  # NVML_GPM_METRIC_ANY_TENSOR_UTIL
GPM_DRAM_ACTIVE: int = 10  # NVML_GPM_METRIC_DRAM_BW_UTIL
#: ``pipe`` label → GPM metric id of that pipe's activity.
GPM_PIPES: Mapping[str, int] = {
    "fp16": 13,  # NVML_GPM_METRIC_FP16_UTIL
    "fp32": 12,  # NVML_GPM_METRIC_FP32_UTIL
    "fp64": 11,  # NVML_GPM_METRIC_FP64_UTIL
    "tensor_hmma": 7,  # NVML_GPM_METRIC_HMMA_TENSOR_UTIL
    "tensor_imma": 9,  # NVML_GPM_METRIC_IMMA_TENSOR_UTIL
    "tensor_dfma": 6,  # NVML_GPM_METRIC_DFMA_TENSOR_UTIL
}
_GPM_METRICS = (
    GPM_SM_ACTIVE,
    GPM_SM_OCCUPANCY,
    GPM_TENSOR_ACTIVE,
    GPM_DRAM_ACTIVE,
    *GPM_PIPES.values(),
)
#: pynvml's ``NVML_GPM_METRICS_GET_VERSION`` (``nvmlGpmMetricsGet_t`` v1).
GPM_METRICS_GET_VERSION = 1
#: pynvml's ``NVML_VALUE_TYPE_DOUBLE``: an ``nvmlValue_t`` holding ``dVal``.
VALUE_TYPE_DOUBLE = 0
#: ``NVML_ERROR_*`` return code → name, as pynvml defines them (tests/gpu compares the two).
_ERROR_NAMES = {
    1: "UNINITIALIZED",
    2: "INVALID_ARGUMENT",
    3: "NOT_SUPPORTED",
    4: "NO_PERMISSION",
    5: "ALREADY_INITIALIZED",
    6: "NOT_FOUND",
    7: "INSUFFICIENT_SIZE",
    8: "INSUFFICIENT_POWER",
    9: "DRIVER_NOT_LOADED",
    10: "TIMEOUT",
    11: "IRQ_ISSUE",
    12: "LIBRARY_NOT_FOUND",
    13: "FUNCTION_NOT_FOUND",
    14: "CORRUPTED_INFOROM",
    15: "GPU_IS_LOST",
    16: "RESET_REQUIRED",
    17: "OPERATING_SYSTEM",
    18: "LIB_RM_VERSION_MISMATCH",
    19: "IN_USE",
    20: "MEMORY",
    21: "NO_DATA",
    22: "VGPU_ECC_NOT_SUPPORTED",
    23: "INSUFFICIENT_RESOURCES",
    24: "FREQ_NOT_SUPPORTED",
    25: "ARGUMENT_VERSION_MISMATCH",
    26: "DEPRECATED",
    27: "NOT_READY",
    28: "GPU_NOT_FOUND",
    29: "INVALID_STATE",
    30: "RESET_TYPE_NOT_SUPPORTED",
    999: "UNKNOWN",
}
#: The soname pynvml loads on Linux (``CDLL("libnvidia-ml.so.1")``).
_LIBRARY_SONAME = "libnvidia-ml.so.1"
_SESSION_ERRORS = frozenset(
    {ERROR_UNINITIALIZED, ERROR_DRIVER_NOT_LOADED, ERROR_LIB_RM_VERSION_MISMATCH}
)
_OMITTED_ERRORS = frozenset(
    {ERROR_NOT_SUPPORTED, ERROR_NO_PERMISSION, ERROR_ARGUMENT_VERSION_MISMATCH}
)
_UNAVAILABLE_HINTS = {
    ERROR_LIBRARY_NOT_FOUND: "libnvidia-ml.so.1 not found: no NVIDIA driver on this host "
    "(in a container, run with the NVIDIA container toolkit so the driver is mounted)",
    ERROR_DRIVER_NOT_LOADED: "the NVIDIA kernel driver is not loaded (nvidia-smi fails too)",
    ERROR_NO_PERMISSION: "no permission to open /dev/nvidia* (run as root or in the video group)",
    ERROR_LIB_RM_VERSION_MISMATCH: "libnvidia-ml and the kernel driver differ in version "
    "(driver upgraded without reloading the module or rebooting)",
}


def __getattr__(name: str) -> Any:
    """``GPMMetricsGet`` (the ctypes struct of ``nvmlGpmMetricsGet``), ``GPMSample``
    (the sample handle type), ``GPUFabricInfoV`` / ``GPUFabricInfo`` (the structs of
    ``nvmlDeviceGetGpuFabricInfoV``, version 2, and of the older ``…GetGpuFabricInfo``),
    for the simulated node and ``trainmon.gpu.health``: pynvml's, imported on first use."""
    if name == "GPUFabricInfoV":
        return _import_pynvml().c_nvmlGpuFabricInfoV_t
    if name == "GPUFabricInfo":
        return _import_pynvml().c_nvmlGpuFabricInfo_t
    if name == "GPMMetricsGet":
        return _import_pynvml().c_nvmlGpmMetricsGet_t
    if name == "GPMSample":
        return _import_pynvml().c_nvmlGpmSample_t
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _import_pynvml() -> Any:
    """``pynvml``, imported on first use (it brings ctypes, subprocess and shutil)."""
    return importlib.import_module("pynvml")


class _LibraryNotFound(Exception):
    """What pynvml's ``nvmlInit`` raises without libnvidia-ml (its ``NVMLError``
    with ``NVML_ERROR_LIBRARY_NOT_FOUND``), for the check made before importing it."""

    value = 12  # ERROR_LIBRARY_NOT_FOUND


class _Unloaded:
    """The library of an ``NVML()`` whose pynvml is not imported yet."""

    NVMLError = _LibraryNotFound


_UNLOADED: NVMLLibrary = cast(NVMLLibrary, _Unloaded())


def _check_library() -> None:
    """Raise ``_LibraryNotFound`` where pynvml would fail to load libnvidia-ml.so.1.

    The same ``dlopen`` as pynvml's ``CDLL("libnvidia-ml.so.1")`` (through ``_ctypes``,
    without the ``ctypes`` package), so a node without a driver does not import
    pynvml; the handle is left open: pynvml's load takes the same library. Only on
    Linux before pynvml is imported: anywhere else pynvml decides by itself."""
    if "pynvml" in sys.modules or not sys.platform.startswith("linux"):
        return
    import _ctypes

    try:
        _ctypes.dlopen(_LIBRARY_SONAME, os.RTLD_LOCAL)
    except OSError:
        raise _LibraryNotFound from None


def error_name(code: int) -> str:
    """``NVML_ERROR_*`` name of a return code, e.g. ``GPU_IS_LOST``."""
    return str(_ERROR_NAMES.get(code, f"code {code}"))


class _FieldReadings(NamedTuple):
    pcie_transmit: int | None
    pcie_receive: int | None
    nvlink_transmit: int | None
    nvlink_receive: int | None
    recovery_action: int | None


@dataclass
class NVMLSession:
    """One ``nvmlInit`` .. ``nvmlShutdown``: the GPUs, their handles and which are lost."""

    generation: int
    driver_version: str
    devices: tuple[GPUIdentity, ...]
    handles: list[Any]
    lost_since: dict[int, float] = field(default_factory=dict)
    link_counts: dict[int, int] = field(default_factory=dict)
    mig_layouts: dict[int, _MIGLayout] = field(default_factory=dict)


@dataclass(frozen=True)
class _MIGLayout:
    """A GPU's MIG devices: ``(MIG device handle, identity)`` per GPU instance, as
    read at ``read_at``; ``final`` when MIG mode is off or not supported (not
    read again this session)."""

    read_at: float
    final: bool
    instances: tuple[tuple[Any, MIGInstance], ...] = ()


class NVML:
    """Lazily initialised, thread-safe access to NVML for every other module."""

    def __init__(
        self,
        library: NVMLLibrary | None = None,
        *,
        retry_seconds: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        mig_refresh_seconds: float = MIG_REFRESH_SECONDS,
    ) -> None:
        self._mig_refresh_seconds = mig_refresh_seconds
        #: ``_UNLOADED`` until the first session opens: then ``pynvml``, imported there.
        self._library: NVMLLibrary = _UNLOADED if library is None else library
        self._retry_seconds = retry_seconds
        self._clock = clock
        self._wall_clock = wall_clock
        self._lock = threading.RLock()
        self._session: NVMLSession | None = None
        self._generation = 0
        self._unavailable: str | None = None
        self._retry_at = float("-inf")
        self._missing: set[str] = set()
        #: (GPU, function, variant) → the code that made it omitted for this session.
        self._unsupported: dict[tuple[int | None, str, object], int] = {}
        self._logged = LogThrottle(None)  # once per key

    # -- session ---------------------------------------------------------------

    def devices(self) -> tuple[GPUIdentity, ...]:
        """Every GPU NVML enumerates, opening the session if needed."""
        return self.session().devices

    @property
    def driver_version(self) -> str:
        return self.session().driver_version

    @property
    def generation(self) -> int:
        """Bumped whenever a session opens (e.g. after a driver reload)."""
        return self._generation

    @property
    def library(self) -> NVMLLibrary:
        """The library every call goes to (pynvml, or the simulated node of the demo)."""
        with self._lock:
            if self._library is _UNLOADED:
                self._library = _import_pynvml()
            return self._library

    def is_missing(self, function: str) -> bool:
        """True once ``function`` answered FUNCTION_NOT_FOUND (older driver)."""
        return function in self._missing

    def supports(self, index: int | None, function: str) -> bool:
        """False once ``function`` (called without a variant) answered NOT_SUPPORTED or
        NO_PERMISSION for GPU ``index`` in this session, or is missing from the driver."""
        return function not in self._missing and (index, function, None) not in self._unsupported

    def omitted_reason(self, index: int | None, function: str) -> str | None:
        """Why ``function`` (called without a variant) is omitted for GPU ``index``:
        ``NVML_ERROR_FUNCTION_NOT_FOUND`` or the code it answered; None if it is not."""
        if function in self._missing:
            return "NVML_ERROR_FUNCTION_NOT_FOUND"
        code = self._unsupported.get((index, function, None))
        return None if code is None else f"NVML_ERROR_{error_name(code)}"

    def close(self) -> None:
        with self._lock:
            if self._session is not None:
                self._session = None
                self._shutdown()

    def session(self) -> NVMLSession:
        """The open session (devices, handles), opening it if needed; NVMLUnavailable if not."""
        with self._lock:
            if self._session is not None:
                return self._session
            if self._unavailable is not None and self._clock() < self._retry_at:
                raise NVMLUnavailable(self._unavailable)
            try:
                if self._library is _UNLOADED:
                    _check_library()
                    self._library = _import_pynvml()
                self._session = self._open()
            except (self._library.NVMLError, _LibraryNotFound) as error:
                code = error_code(error)
                hint = _UNAVAILABLE_HINTS.get(code, "NVML initialisation failed")
                self._unavailable = (
                    f"GPU collector disabled: {hint} [NVML_ERROR_{error_name(code)}]"
                )
                self._retry_at = self._clock() + self._retry_seconds
                raise NVMLUnavailable(self._unavailable) from None
            self._unavailable = None
            return self._session

    def _open(self) -> NVMLSession:
        library = self._library
        library.nvmlInit()
        try:
            driver = library.nvmlSystemGetDriverVersion()
            count = library.nvmlDeviceGetCount()
            self._generation += 1
            self._unsupported.clear()
            session = NVMLSession(self._generation, _text(driver), (), [None] * count)
            session.devices = tuple(self._identify(session, index) for index in range(count))
        except (library.NVMLError, NVMLUnavailable):
            self._shutdown()
            raise
        log.info(
            "NVML session %d: driver %s, %d GPUs", session.generation, session.driver_version, count
        )
        return session

    def _identify(self, session: NVMLSession, index: int) -> GPUIdentity:
        """Handle and identity of GPU ``index``; empty strings if it is lost."""
        library = self._library
        try:
            handle = self.query(index, library.nvmlDeviceGetHandleByIndex, index, session=session)
            if handle is None:
                return GPUIdentity(index, "", "", "")
            session.handles[index] = handle
            uuid = self.query(index, library.nvmlDeviceGetUUID, handle, session=session)
            name = self.query(index, library.nvmlDeviceGetName, handle, session=session)
            pci = self.query(index, library.nvmlDeviceGetPciInfo, handle, session=session)
        except GPULost:
            return GPUIdentity(index, "", "", "")
        return GPUIdentity(index, _text(uuid), _text(name), _text(getattr(pci, "busId", "")))

    def _shutdown(self) -> None:
        try:
            self._library.nvmlShutdown()
        except self._library.NVMLError as error:
            log.debug("nvmlShutdown: %s", error_name(error_code(error)))

    def _drop_session(self, session: NVMLSession, code: int) -> None:
        with self._lock:
            if self._session is session:
                log.warning(
                    "NVML session %d lost (NVML_ERROR_%s); re-initialising",
                    session.generation,
                    error_name(code),
                )
                self._session = None
                self._shutdown()
                self._unavailable = f"NVML session lost: NVML_ERROR_{error_name(code)}"
                self._retry_at = self._clock()

    # -- the chokepoint -------------------------------------------------------

    def query(
        self,
        index: int | None,
        call: Callable[..., T],
        *args: Any,
        session: NVMLSession | None = None,
        absent: frozenset[int] = frozenset(),
        failed: list[str] | None = None,
        variant: object = None,
    ) -> T | None:
        """Call one NVML function for GPU ``index`` (None: not device-specific).

        Returns None for an omitted reading (see the module docstring) and for
        the codes in ``absent`` (an expected "nothing here", e.g. TIMEOUT).
        ``variant`` tells apart calls of one function whose support differs
        (e.g. the perf policy of a violation counter), for the not-supported
        cache; ``failed`` collects the names of calls that failed unexpectedly.
        """
        function = getattr(call, "__name__", None) or repr(call)
        unsupported_key = (index, function, variant)
        if function in self._missing or unsupported_key in self._unsupported:
            return None
        try:
            return call(*args)
        except self._library.NVMLError as error:
            code = error_code(error)
        current = session or self._session
        if code in absent:
            return None
        if code == ERROR_FUNCTION_NOT_FOUND:
            self._missing.add(function)
            log.warning(
                "%s is not in this NVIDIA driver's NVML; its readings are omitted", function
            )
        elif code in _OMITTED_ERRORS:
            self._unsupported[unsupported_key] = code
            self._log_once(
                ("omitted", function, code),
                "%s: NVML_ERROR_%s on GPU %s; omitted",
                function,
                error_name(code),
                index,
            )
        elif code == ERROR_GPU_IS_LOST and index is not None:
            if current is not None:
                current.lost_since.setdefault(index, self._clock())
            self._log_once(
                ("lost", index, self._generation),
                "GPU %d is lost (fell off the bus); trainmon_gpu_up=0 until it answers again",
                index,
            )
            raise GPULost(f"GPU {index} is lost")
        elif code in _SESSION_ERRORS:
            if current is not None:
                self._drop_session(current, code)
            raise NVMLUnavailable(f"NVML session lost: NVML_ERROR_{error_name(code)}")
        else:
            self._log_once(
                ("failed", index, function, code),
                "%s on GPU %s failed: NVML_ERROR_%s",
                function,
                index,
                error_name(code),
            )
            if failed is not None:
                failed.append(function)
        return None

    def _log_once(self, key: tuple[object, ...], message: str, *args: object) -> None:
        if self._logged.allow(key):
            log.warning(message, *args)

    def device(self, index: int) -> tuple[NVMLSession, Any]:
        """The session and handle of GPU ``index``, for readings made elsewhere
        (``trainmon.gpu.health``) through ``query``; ``GPULost`` while it is lost."""
        return self._device(index)

    def _device(self, index: int) -> tuple[NVMLSession, Any]:
        """The session and handle of GPU ``index``; GPULost while it is lost."""
        session = self.session()
        if not 0 <= index < len(session.handles):
            raise GPULost(f"GPU {index} is not present")
        lost_since = session.lost_since.get(index)
        if lost_since is not None and self._clock() - lost_since < self._retry_seconds:
            raise GPULost(f"GPU {index} is lost")
        handle = session.handles[index]
        if handle is None or lost_since is not None:
            session.lost_since.pop(index, None)
            handle = self.query(index, self._library.nvmlDeviceGetHandleByIndex, index)
            if handle is None:
                raise GPULost(f"GPU {index} has no handle")
            session.handles[index] = handle
        return session, handle

    # -- readings ---------------------------------------------------------------

    def read(self, index: int) -> GPUReadings:
        """Every cheap reading of GPU ``index`` (no blocking throughput calls).

        The recovery action rides in the byte counters' ``nvmlDeviceGetFieldValues``
        call; PCIe link width, generation and replays are one call each."""
        session, handle = self._device(index)
        lib = self._library
        failed: list[str] = []

        def query(call: Callable[..., T], *args: Any) -> T | None:
            return self.query(
                index, call, handle, *args, session=session, failed=failed, variant=args
            )

        memory = query(lib.nvmlDeviceGetMemoryInfo)
        throttle: dict[str, float] = {}
        for reason, policy in THROTTLE_REASONS.items():
            violation = query(lib.nvmlDeviceGetViolationStatus, policy)
            if violation is not None:
                throttle[reason] = int(violation.violationTime) / 1e9  # ns → s
        ecc: dict[str, int] = {}
        for severity, kind in (
            ("corrected", MEMORY_ERROR_CORRECTED),
            ("uncorrected", MEMORY_ERROR_UNCORRECTED),
        ):
            count = query(lib.nvmlDeviceGetTotalEccErrors, kind, VOLATILE_ECC)
            if count is not None:
                ecc[severity] = int(count)
        counters = self._field_readings(index, handle, session, failed)
        return GPUReadings(
            memory_used_bytes=None if memory is None else int(memory.used),
            memory_total_bytes=None if memory is None else int(memory.total),
            power_watts=_scaled(query(lib.nvmlDeviceGetPowerUsage), 1e-3),  # mW → W
            power_limit_watts=_scaled(query(lib.nvmlDeviceGetEnforcedPowerLimit), 1e-3),
            energy_joules=_scaled(query(lib.nvmlDeviceGetTotalEnergyConsumption), 1e-3),  # mJ
            temperature_celsius=_scaled(query(lib.nvmlDeviceGetTemperature, TEMPERATURE_GPU), 1),
            sm_clock_hertz=_scaled(query(lib.nvmlDeviceGetClockInfo, CLOCK_SM), 1e6),  # MHz
            throttle_seconds=throttle,
            pcie_transmit_bytes=counters.pcie_transmit,
            pcie_receive_bytes=counters.pcie_receive,
            nvlink_transmit_bytes=counters.nvlink_transmit,
            nvlink_receive_bytes=counters.nvlink_receive,
            ecc_errors=ecc,
            pcie_link_width=_whole(query(lib.nvmlDeviceGetCurrPcieLinkWidth)),
            pcie_link_generation=_whole(query(lib.nvmlDeviceGetCurrPcieLinkGeneration)),
            pcie_replays=_whole(query(lib.nvmlDeviceGetPcieReplayCounter)),
            recovery_action=counters.recovery_action,
            failed=tuple(failed),
        )

    def _field_values(
        self,
        index: int,
        handle: Any,
        session: NVMLSession,
        requests: list[tuple[int, int]],
        failed: list[str],
    ) -> dict[tuple[int, int], int] | None:
        """``(field id, scope id)`` → value, in one ``nvmlDeviceGetFieldValues``
        call; fields that answered an error are left out. None if the call is."""
        values = self.query(
            index,
            self._library.nvmlDeviceGetFieldValues,
            handle,
            requests,
            session=session,
            failed=failed,
        )
        if values is None:
            return None
        return {
            request: _number(int(value.valueType), value.value)
            for request, value in zip(requests, values, strict=False)
            if int(value.nvmlReturn) == 0
        }

    def _field_readings(
        self, index: int, handle: Any, session: NVMLSession, failed: list[str]
    ) -> _FieldReadings:
        """PCIe and NVLink data byte counters (all links) and the driver's recovery
        action, in one field-value call."""
        requests = [
            (FIELD_PCIE_TX_BYTES, 0),
            (FIELD_PCIE_RX_BYTES, 0),
            (FIELD_NVLINK_DATA_TX_KIB, SCOPE_ALL_LINKS),
            (FIELD_NVLINK_DATA_RX_KIB, SCOPE_ALL_LINKS),
            (FIELD_GPU_RECOVERY_ACTION, 0),
        ]
        values = self._field_values(index, handle, session, requests, failed)
        if values is None:
            return _FieldReadings(None, None, None, None, None)
        nvlink_kib = [values.get(request) for request in requests[2:4]]
        if None in nvlink_kib:
            nvlink_kib = self._nvlink_per_link(index, handle, session, failed)
        tx_kib, rx_kib = nvlink_kib
        return _FieldReadings(
            values.get(requests[0]),
            values.get(requests[1]),
            None if tx_kib is None else tx_kib * 1024,
            None if rx_kib is None else rx_kib * 1024,
            values.get(requests[4]),
        )

    def _nvlink_per_link(
        self, index: int, handle: Any, session: NVMLSession, failed: list[str]
    ) -> list[int | None]:
        """NVLink TX/RX KiB summed over the links, for drivers that reject the
        all-links scope. GPUs without NVLink report 0 links and are asked once."""
        links = self.nvlink_count(index, handle, session, failed)
        if not links:
            return [None, None]
        fields = (FIELD_NVLINK_DATA_TX_KIB, FIELD_NVLINK_DATA_RX_KIB)
        requests = [(field_id, link) for field_id in fields for link in range(links)]
        values = self._field_values(index, handle, session, requests, failed) or {}
        if len(values) != len(requests):
            return [None, None]
        return [sum(values[(field_id, link)] for link in range(links)) for field_id in fields]

    def nvlink_count(
        self, index: int, handle: Any, session: NVMLSession, failed: list[str]
    ) -> int:
        """NVLink links of GPU ``index`` (field ``NVML_FI_DEV_NVLINK_LINK_COUNT``), read
        once per session; 0 without NVLink or where the driver does not say."""
        links = session.link_counts.get(index)
        if links is None:
            count = self._field_values(
                index, handle, session, [(FIELD_NVLINK_LINK_COUNT, 0)], failed
            )
            links = session.link_counts[index] = (count or {}).get((FIELD_NVLINK_LINK_COUNT, 0), 0)
        return links

    def utilization_samples(self, index: int, since_us: int) -> list[tuple[int, float]]:
        """Driver utilization samples of GPU ``index`` newer than ``since_us``.

        ``(timestamp µs, busy ratio 0–1)`` from ``nvmlDeviceGetSamples(
        NVML_GPU_UTILIZATION_SAMPLES)`` (the driver keeps ~100 at ~6 Hz); when it
        has none (idle GPUs) one reading of ``nvmlDeviceGetUtilizationRates``
        stamped with the wall clock. Empty when neither is supported.
        """
        session, handle = self._device(index)
        library = self._library
        result = self.query(
            index,
            library.nvmlDeviceGetSamples,
            handle,
            GPU_UTILIZATION_SAMPLES,
            since_us,
            session=session,
            absent=frozenset({ERROR_NOT_FOUND}),
        )
        if result:
            value_type, samples = result
            fresh = [
                (int(sample.timeStamp), _number(value_type, sample.sampleValue) / 100)
                for sample in samples
                if int(sample.timeStamp) > since_us
            ]
            if fresh:
                return fresh
        rates = self.query(index, library.nvmlDeviceGetUtilizationRates, handle, session=session)
        if rates is None:
            return []
        stamp = max(int(self._wall_clock() * 1e6), since_us + 1)
        return [(stamp, int(rates.gpu) / 100)]

    def processes(self, index: int) -> tuple[GPUProcess, ...] | None:
        """Compute processes on GPU ``index`` (an expensive call: use sparingly)."""
        session, handle = self._device(index)
        infos = self.query(
            index, self._library.nvmlDeviceGetComputeRunningProcesses, handle, session=session
        )
        if infos is None:
            return None
        return tuple(
            GPUProcess(
                int(info.pid),
                None if info.usedGpuMemory is None else int(info.usedGpuMemory),
                _instance_id(getattr(info, "gpuInstanceId", None)),
            )
            for info in infos
        )

    # -- MIG ---------------------------------------------------------------------

    def mig_instances(self, index: int) -> tuple[MIGInstance, ...]:
        """The GPU instances of GPU ``index`` with their memory now (one
        ``nvmlDeviceGetMemoryInfo`` on each MIG device handle); empty when the GPU
        is not in MIG mode, or where MIG is not supported. ``GPULost`` for a lost GPU."""
        session, handle = self._device(index)
        layout = self._mig_layout(index, handle, session)
        instances = []
        for mig_handle, instance in layout.instances:
            memory = self.query(
                index,
                self._library.nvmlDeviceGetMemoryInfo,
                mig_handle,
                session=session,
                variant=("mig", instance.gpu_instance_id),
            )
            if memory is not None:
                instance = replace(
                    instance,
                    memory_used_bytes=int(memory.used),
                    memory_total_bytes=int(memory.total),
                )
            instances.append(instance)
        return tuple(instances)

    def mig_instance_ids(self, index: int) -> tuple[int, ...]:
        """GPU instance ids of GPU ``index`` (the cached layout: no NVML call
        unless it is due); empty without MIG mode."""
        session, handle = self._device(index)
        layout = self._mig_layout(index, handle, session)
        return tuple(instance.gpu_instance_id for _, instance in layout.instances)

    def _mig_layout(self, index: int, handle: Any, session: NVMLSession) -> _MIGLayout:
        """GPU ``index``'s MIG devices, read again once ``mig_refresh_seconds`` passed
        (never again this session where MIG mode is off or unsupported). No lock:
        two threads that both find it due read the same layout twice, harmlessly."""
        layout = session.mig_layouts.get(index)
        if layout is not None and (
            layout.final or self._clock() - layout.read_at < self._mig_refresh_seconds
        ):
            return layout
        layout = session.mig_layouts[index] = self._read_mig_layout(index, handle, session)
        return layout

    def _read_mig_layout(self, index: int, handle: Any, session: NVMLSession) -> _MIGLayout:
        now = self._clock()
        get_mode = getattr(self._library, "nvmlDeviceGetMigMode", None)
        if get_mode is None:  # a library without MIG (the simulated node)
            return _MIGLayout(now, final=True)
        mode = self.query(index, get_mode, handle, session=session)
        if mode is None:  # unsupported: final; failed: asked again after the refresh interval
            return _MIGLayout(now, final=self.omitted_reason(index, get_mode.__name__) is not None)
        if int(mode[0]) != MIG_ENABLED:
            return _MIGLayout(now, final=True)
        library: Any = self._library  # MIG calls: pynvml's (not in ``NVMLLibrary``)
        count = self.query(index, library.nvmlDeviceGetMaxMigDeviceCount, handle, session=session)
        instances = []
        for slot in range(min(int(count or 0), MAX_MIG_DEVICES)):
            mig_handle = self.query(
                index,
                library.nvmlDeviceGetMigDeviceHandleByIndex,
                handle,
                slot,
                session=session,
                absent=frozenset({ERROR_NOT_FOUND}),
            )
            if mig_handle is None:
                continue
            instance = self._identify_mig(index, mig_handle, session)
            if instance is not None:
                instances.append((mig_handle, instance))
        return _MIGLayout(now, final=False, instances=tuple(instances))

    def _identify_mig(
        self, index: int, mig_handle: Any, session: NVMLSession
    ) -> MIGInstance | None:
        """Ids, profile and uuid of one MIG device; None without its GPU instance id."""
        library: Any = self._library

        def query(call: Callable[..., T]) -> T | None:
            return self.query(index, call, mig_handle, session=session, variant="mig")

        gpu_instance = query(library.nvmlDeviceGetGpuInstanceId)
        if gpu_instance is None:
            return None
        compute_instance = query(library.nvmlDeviceGetComputeInstanceId)
        name = _text(query(library.nvmlDeviceGetName))
        return MIGInstance(
            gpu_instance_id=int(gpu_instance),
            compute_instance_id=-1 if compute_instance is None else int(compute_instance),
            profile=mig_profile(name),
            uuid=_text(query(library.nvmlDeviceGetUUID)),
        )

    # -- GPM (GPU performance monitoring, Hopper and later) -----------------------
    # Sample buffers are NVML allocations: ``trainmon.gpu.gpm.GPMSampler`` owns
    # them on one thread and pairs every ``gpm_sample_alloc`` with a free.

    def gpm_support(self, index: int) -> tuple[bool, str | None]:
        """Whether GPU ``index`` can be sampled with GPM: ``(True, None)``; else
        ``(False, why)``, with ``why`` None for a transient failure (ask again).

        ``nvmlGpmQueryDeviceSupport`` (``nvmlGpmSupport_t`` v1): a GPU it calls
        unsupported, ``NOT_SUPPORTED``, ``FUNCTION_NOT_FOUND`` (a driver before
        GPM) or ``ARGUMENT_VERSION_MISMATCH``. Raises ``GPULost`` for a lost GPU.
        """
        session, handle = self._device(index)
        function = "nvmlGpmQueryDeviceSupport"
        support = self.query(
            index, self._library.nvmlGpmQueryDeviceSupport, handle, session=session
        )
        if support is None:
            reason = self.omitted_reason(index, function)
            return False, None if reason is None else f"{function}: {reason}"
        if not int(support.isSupportedDevice):
            return False, f"{function}: this GPU does not support GPM"
        return True, None

    def gpm_sample_alloc(self) -> Any | None:
        """A new GPM sample buffer (``nvmlGpmSampleAlloc``), None if none could be had."""
        return self.query(None, self._library.nvmlGpmSampleAlloc)

    def gpm_sample_free(self, sample: Any) -> None:
        """Free a buffer of ``gpm_sample_alloc`` (also after the session is gone)."""
        library = self._library
        try:
            library.nvmlGpmSampleFree(sample)
        except library.NVMLError as error:
            log.warning("nvmlGpmSampleFree: NVML_ERROR_%s", error_name(error_code(error)))

    def gpm_sample(self, index: int, sample: Any) -> bool:
        """Take a GPM sample of GPU ``index`` into ``sample`` (``nvmlGpmSampleGet``).

        False if it failed or is not supported (``omitted_reason`` tells which);
        ``GPULost`` for a lost GPU, ``NVMLUnavailable`` when the session is gone.
        """
        session, handle = self._device(index)
        failed: list[str] = []
        self.query(
            index, self._library.nvmlGpmSampleGet, handle, sample, session=session, failed=failed
        )
        return not failed and self.supports(index, "nvmlGpmSampleGet")

    def gpm_mig_sample(self, index: int, gpu_instance_id: int, sample: Any) -> bool:
        """Take a GPM sample of one GPU instance of GPU ``index`` (``nvmlGpmMigSampleGet``);
        as ``gpm_sample`` (``omitted_reason(index, "nvmlGpmMigSampleGet")`` says why not)."""
        session, handle = self._device(index)
        failed: list[str] = []
        library: Any = self._library  # pynvml's (not in ``NVMLLibrary``)
        self.query(
            index,
            library.nvmlGpmMigSampleGet,
            handle,
            gpu_instance_id,
            sample,
            session=session,
            failed=failed,
        )
        return not failed and self.supports(index, "nvmlGpmMigSampleGet")

    def gpm_activity(self, index: int, older: Any, newer: Any) -> GPMActivity | None:
        """GPU ``index``'s activity between two of its samples (``nvmlGpmMetricsGet``,
        ``nvmlGpmMetricsGet_t`` v1), percent → ratio 0–1; metrics NVML does not
        report on this GPU are left out. None if the call failed or is unsupported.
        """
        request = _import_pynvml().c_nvmlGpmMetricsGet_t()
        request.version = GPM_METRICS_GET_VERSION
        request.numMetrics = len(_GPM_METRICS)
        request.sample1 = older
        request.sample2 = newer
        slots = request.metrics  # one view of the array, not one per access
        for slot, metric in enumerate(_GPM_METRICS):
            slots[slot].metricId = metric
        result = self.query(index, self._library.nvmlGpmMetricsGet, request)
        if result is None:
            return None
        ratios: dict[int, float] = {}
        slots = result.metrics
        for slot in range(len(_GPM_METRICS)):
            metric = slots[slot]
            value = float(metric.value)
            if int(metric.nvmlReturn) == 0 and math.isfinite(value):
                ratios[int(metric.metricId)] = min(1.0, max(0.0, value / 100))  # % → 0–1
        return GPMActivity(
            sm_active_ratio=ratios.get(GPM_SM_ACTIVE),
            sm_occupancy_ratio=ratios.get(GPM_SM_OCCUPANCY),
            tensor_active_ratio=ratios.get(GPM_TENSOR_ACTIVE),
            dram_active_ratio=ratios.get(GPM_DRAM_ACTIVE),
            pipe_active_ratio={
                pipe: ratios[metric] for pipe, metric in GPM_PIPES.items() if metric in ratios
            },
        )


def poll_quietly(poll: Callable[[], object], what: str, logger: logging.Logger) -> None:
    """One poll of a sampler thread (``what``: "GPM sampler"...): NVML being
    unavailable only idles it (debug); any other failure is logged with its
    traceback and the thread goes on, the next poll retries."""
    try:
        poll()
    except NVMLUnavailable as reason:
        logger.debug("%s idle: %s", what, reason)
    except Exception:  # the thread must outlive a bad poll
        logger.exception("%s poll failed", what)


def error_code(error: BaseException) -> int:
    """The NVML return code an ``NVMLError`` carries (``ERROR_UNKNOWN`` if none)."""
    value = getattr(error, "value", ERROR_UNKNOWN)
    return value if isinstance(value, int) else ERROR_UNKNOWN


def _text(value: object) -> str:
    if value is None:
        return ""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def mig_profile(name: str) -> str:
    """The MIG profile in a MIG device's name, as drivers and ``nvidia-smi -L`` give it:
    ``NVIDIA H100 80GB HBM3 MIG 1g.10gb`` → ``1g.10gb``; empty if the name has none."""
    head, marker, profile = name.rpartition(" MIG ")
    return profile.strip() if marker and head else ""


def _instance_id(value: object) -> int | None:
    """A process's ``gpuInstanceId``: None outside MIG (0xFFFFFFFF) or where not given."""
    if value is None:
        return None
    number = int(cast(int, value))
    return None if number == NO_GPU_INSTANCE else number


def _whole(value: int | None) -> int | None:
    return None if value is None else int(value)


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else float(value) * factor


def _number(value_type: int, value: Any) -> int:
    """The integer in an ``nvmlValue_t`` union of the given ``nvmlValueType_t``."""
    if value_type == VALUE_TYPE_DOUBLE:
        return int(value.dVal)
    member = _VALUE_MEMBERS.get(value_type, "ullVal")
    return int(getattr(value, member))


#: ``NVML_VALUE_TYPE_*`` (unsigned int, long, long long, signed long long, int, short).
_VALUE_MEMBERS = {
    1: "uiVal",
    2: "ulVal",
    3: "ullVal",
    4: "sllVal",
    5: "siVal",
    6: "usVal",
}
