"""GPM activity: SM, tensor-core and DRAM activity from NVML GPU performance monitoring.

``trainmon_gpu_utilization_ratio`` says only that *a* kernel ran; a GPU that
runs one tiny kernel all the time reads 100 %. GPM (Hopper and later) counts
what the SMs did: the share of SMs busy, warp occupancy, tensor and FP pipe
activity and DRAM bandwidth, over an interval between two samples.

A GPM sample is a buffer NVML allocates (``nvmlGpmSampleAlloc``) and fills
(``nvmlGpmSampleGet``); ``nvmlGpmMetricsGet`` turns two samples of one GPU into
metrics. ``GPMSampler`` owns every buffer on one thread — its own
``BackgroundThread`` once started, the caller's until then (tests) — so none is
ever touched by two threads. It keeps two buffers per GPU and fills them in
turn, one sample every ``interval_seconds`` (≥ 0.1 s, NVIDIA's minimum for
meaningful GPM metrics; default 1 s), and computes the metrics of each
consecutive pair; ``snapshot()`` hands out the latest, which ``collect()``
exports. Every allocation is freed exactly once:

- a lost GPU (``GPU_IS_LOST``): its two buffers are freed and its values
  dropped; the other GPUs go on; it is probed again (support, then new
  buffers) once the facade lets it be, every ``retry_seconds``;
- a lost session (driver reload, ``NVMLUnavailable``) or a new session
  generation: every buffer is freed; buffers are allocated again once NVML
  re-opens;
- ``stop()``: every buffer is freed on the owner thread before it ends.

A GPU without GPM (``nvmlGpmQueryDeviceSupport`` says so, or answers
``NOT_SUPPORTED``, ``FUNCTION_NOT_FOUND``, ``ARGUMENT_VERSION_MISMATCH``) gets
no buffers and no GPM series; ``states()`` (``/healthz``) says why, per GPU.
The metrics are documented in ``docs/metrics.md`` (GPU, "GPM activity").
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainmon.background import BackgroundThread
from trainmon.gpu.nvml import NVML, poll_quietly
from trainmon.gpu.types import GPMActivity, GPULost, NVMLUnavailable

log = logging.getLogger(__name__)

#: The shortest GPM sampling interval that gives meaningful metrics (NVIDIA), seconds.
MIN_INTERVAL_SECONDS = 0.1
SAMPLING = "sampling"


@dataclass
class _Buffers:
    """The two sample buffers of one GPU and which one the next sample goes to."""

    samples: tuple[Any, Any]
    next: int = 0
    filled: int = 0  # consecutive good samples, capped at 2


class GPMSampler:
    """Takes a GPM sample of every supporting GPU every ``interval_seconds``."""

    def __init__(self, nvml: NVML, *, interval_seconds: float = 1.0) -> None:
        if interval_seconds < MIN_INTERVAL_SECONDS:
            raise ValueError(f"GPM interval must be at least {MIN_INTERVAL_SECONDS} s")
        self._nvml = nvml
        self._interval = interval_seconds
        self._buffers: dict[int, _Buffers] = {}  # owner thread only
        self._unsupported: set[int] = set()  # owner thread only; reset per session
        self._generation: int | None = None
        self._lock = threading.Lock()
        self._activity: dict[int, GPMActivity] = {}
        self._states: dict[int, str] = {}
        self._state = "starting"
        self._thread = BackgroundThread("gpu-gpm", self._run)

    # -- any thread ------------------------------------------------------------

    def start(self) -> None:
        """Start the owner thread; from now on only it touches the buffers."""
        self._thread.start()

    def stop(self) -> None:
        """End sampling and free every buffer (on the owner thread)."""
        if self._thread.started:
            self._thread.stop()  # the thread frees its buffers on the way out
        else:
            self.release()

    def snapshot(self) -> Mapping[int, GPMActivity]:
        """The latest activity of every GPU sampled, by NVML index."""
        with self._lock:
            return dict(self._activity)

    def states(self) -> Mapping[str, object]:
        """For ``/healthz``: ``sampling`` or why not, per GPU; or a single state
        while NVML is unavailable."""
        with self._lock:
            if not self._states:
                return {"state": self._state}
            return {str(index): state for index, state in sorted(self._states.items())}

    # -- the owner thread --------------------------------------------------------

    def poll(self) -> None:
        """One sample of every GPU that supports GPM, and their metrics.

        Only the owner thread may call this. Raises ``NVMLUnavailable`` (after
        freeing every buffer) when NVML cannot be used.
        """
        try:
            session = self._nvml.session()
            if self._generation != self._nvml.generation:
                self.release()  # buffers of an older session
                self._generation = self._nvml.generation
            for device in session.devices:
                self._poll_device(device.index)
        except NVMLUnavailable as reason:
            self.release()
            with self._lock:
                self._state = f"waiting for NVML: {reason}"
                self._states.clear()
            raise

    def release(self) -> None:
        """Free every buffer and forget every value (owner thread only)."""
        for index in list(self._buffers):
            self._free(index)
        self._unsupported.clear()
        self._generation = None
        with self._lock:
            self._activity.clear()

    def _poll_device(self, index: int) -> None:
        if index in self._unsupported:
            return
        try:
            self._sample_device(index)
        except GPULost:
            self._free(index)
            self._set_state(index, "GPU lost; probed again every retry_seconds")

    def _sample_device(self, index: int) -> None:
        """Sample GPU ``index`` into its next buffer and measure the last pair."""
        buffers = self._buffers.get(index) or self._open(index)
        if buffers is None:
            return
        sample = buffers.samples[buffers.next]
        if not self._nvml.gpm_sample(index, sample):
            self._sample_failed(index, buffers)
            return
        buffers.next ^= 1
        buffers.filled = min(2, buffers.filled + 1)
        if buffers.filled < 2:
            return
        older = buffers.samples[buffers.next]
        activity = self._nvml.gpm_activity(index, older, sample)
        if activity is None:
            reason = self._nvml.omitted_reason(index, "nvmlGpmMetricsGet")
            if reason is not None:
                self._unsupported_gpu(index, f"nvmlGpmMetricsGet: {reason}")
                return
            with self._lock:
                self._activity.pop(index, None)
                self._states[index] = "nvmlGpmMetricsGet failed (see the log)"
            return
        with self._lock:
            self._activity[index] = activity
            self._states[index] = SAMPLING

    def _open(self, index: int) -> _Buffers | None:
        """Probe GPM support of GPU ``index`` and allocate its two buffers."""
        supported, reason = self._nvml.gpm_support(index)
        if not supported:
            if reason is None:  # failed this time: asked again at the next poll
                self._set_state(index, "nvmlGpmQueryDeviceSupport failed (see the log)")
            else:
                self._unsupported_gpu(index, reason)
            return None
        first = self._nvml.gpm_sample_alloc()
        second = None if first is None else self._nvml.gpm_sample_alloc()
        if first is None or second is None:
            if first is not None:
                self._nvml.gpm_sample_free(first)
            self._set_state(index, "nvmlGpmSampleAlloc failed (see the log)")
            return None
        buffers = self._buffers[index] = _Buffers((first, second))
        self._set_state(index, "starting")
        return buffers

    def _sample_failed(self, index: int, buffers: _Buffers) -> None:
        reason = self._nvml.omitted_reason(index, "nvmlGpmSampleGet")
        if reason is not None:
            self._unsupported_gpu(index, f"nvmlGpmSampleGet: {reason}")
            return
        buffers.filled = 0  # the next pair starts afresh
        with self._lock:
            self._activity.pop(index, None)
            self._states[index] = "nvmlGpmSampleGet failed (see the log)"

    def _unsupported_gpu(self, index: int, reason: str) -> None:
        """No GPM on this GPU for the rest of the session: free its buffers."""
        self._free(index)
        self._unsupported.add(index)
        log.info("GPU %d: no GPM activity metrics (%s)", index, reason)
        self._set_state(index, f"unsupported: {reason}")

    def _free(self, index: int) -> None:
        buffers = self._buffers.pop(index, None)
        if buffers is not None:
            for sample in buffers.samples:
                self._nvml.gpm_sample_free(sample)
        with self._lock:
            self._activity.pop(index, None)

    def _set_state(self, index: int, state: str) -> None:
        with self._lock:
            self._states[index] = state
            self._state = SAMPLING

    def _run(self) -> None:
        stopping = self._thread.stopping
        try:
            while not stopping.is_set():
                started = time.monotonic()
                self._poll_quietly()
                # One sample per interval, however long the poll took.
                stopping.wait(max(0.0, self._interval - (time.monotonic() - started)))
        finally:
            self.release()

    def _poll_quietly(self) -> None:
        poll_quietly(self.poll, "GPM sampler", log)
