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

MIG: on a GPU in MIG mode with GPM, each GPU instance (``NVML.mig_instance_ids``)
gets two buffers of its own, filled with ``nvmlGpmMigSampleGet`` beside the
GPU's; ``mig_snapshot()`` hands out their activity by ``(GPU, instance id)``.
An instance that disappears has its buffers freed; a driver that does not
support per-instance samples stops them for that GPU (the GPU's go on).
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
_Key = tuple[int, int | None]  # (GPU index, GPU instance id or None for the whole GPU)


@dataclass
class _Buffers:
    """The two sample buffers of one GPU and which one the next sample goes to."""

    samples: tuple[Any, Any]
    next: int = 0
    filled: int = 0  # consecutive good samples, capped at 2


class GPMSampler:
    """Takes a GPM sample of every supporting GPU every ``interval_seconds``."""

    #: Buffers, values and states are keyed by ``(GPU, GPU instance id)``; the
    #: instance is None for the whole GPU.
    def __init__(self, nvml: NVML, *, interval_seconds: float = 1.0) -> None:
        if interval_seconds < MIN_INTERVAL_SECONDS:
            raise ValueError(f"GPM interval must be at least {MIN_INTERVAL_SECONDS} s")
        self._nvml = nvml
        self._interval = interval_seconds
        self._buffers: dict[_Key, _Buffers] = {}  # owner thread only
        self._unsupported: set[int] = set()  # owner thread only; reset per session
        self._mig_unsupported: set[int] = set()  # GPUs without per-instance GPM; owner only
        self._generation: int | None = None
        self._lock = threading.Lock()
        self._activity: dict[_Key, GPMActivity] = {}
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
            return {index: value for (index, gi), value in self._activity.items() if gi is None}

    def mig_snapshot(self) -> Mapping[tuple[int, int], GPMActivity]:
        """The latest activity of every MIG GPU instance sampled, by (NVML index, id)."""
        with self._lock:
            return {(i, gi): value for (i, gi), value in self._activity.items() if gi is not None}

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
        for key in list(self._buffers):
            self._free_key(key)
        self._unsupported.clear()
        self._mig_unsupported.clear()
        self._generation = None
        with self._lock:
            self._activity.clear()

    def _poll_device(self, index: int) -> None:
        if index in self._unsupported:
            return
        try:
            self._sample_device(index)
            if index not in self._unsupported and index not in self._mig_unsupported:
                self._sample_instances(index)
        except GPULost:
            self._free(index)
            self._set_state(index, "GPU lost; probed again every retry_seconds")

    def _sample_device(self, index: int) -> None:
        """Sample GPU ``index`` into its next buffer and measure the last pair."""
        buffers = self._buffers.get((index, None)) or self._open(index)
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
                self._activity.pop((index, None), None)
                self._states[index] = "nvmlGpmMetricsGet failed (see the log)"
            return
        with self._lock:
            self._activity[(index, None)] = activity
            self._states[index] = SAMPLING

    def _sample_instances(self, index: int) -> None:
        """Sample every GPU instance of GPU ``index`` (none without MIG mode) into
        its next buffer and measure its last pair; free the buffers of instances
        that are gone."""
        instances = set(self._nvml.mig_instance_ids(index))
        for key in [key for key in self._buffers if key[0] == index and key[1] is not None]:
            if key[1] not in instances:
                self._free_key(key)
        for gi in sorted(instances):
            key = (index, gi)
            buffers = self._buffers.get(key) or self._allocate(key)
            if buffers is None:
                return
            sample = buffers.samples[buffers.next]
            if not self._nvml.gpm_mig_sample(index, gi, sample):
                reason = self._nvml.omitted_reason(index, "nvmlGpmMigSampleGet")
                if reason is not None:
                    self._no_instance_gpm(index, f"nvmlGpmMigSampleGet: {reason}")
                    return
                buffers.filled = 0
                with self._lock:
                    self._activity.pop(key, None)
                continue
            buffers.next ^= 1
            buffers.filled = min(2, buffers.filled + 1)
            if buffers.filled < 2:
                continue
            activity = self._nvml.gpm_activity(index, buffers.samples[buffers.next], sample)
            with self._lock:
                if activity is None:
                    self._activity.pop(key, None)
                else:
                    self._activity[key] = activity

    def _no_instance_gpm(self, index: int, reason: str) -> None:
        """No per-instance GPM on GPU ``index`` this session (the GPU's own goes on)."""
        for key in [key for key in self._buffers if key[0] == index and key[1] is not None]:
            self._free_key(key)
        self._mig_unsupported.add(index)
        log.info("GPU %d: no GPM activity per MIG instance (%s)", index, reason)

    def _allocate(self, key: _Key) -> _Buffers | None:
        """Two new buffers for ``key``; None (and a state saying so) if NVML had none."""
        first = self._nvml.gpm_sample_alloc()
        second = None if first is None else self._nvml.gpm_sample_alloc()
        if first is None or second is None:
            if first is not None:
                self._nvml.gpm_sample_free(first)
            self._set_state(key[0], "nvmlGpmSampleAlloc failed (see the log)")
            return None
        buffers = self._buffers[key] = _Buffers((first, second))
        return buffers

    def _open(self, index: int) -> _Buffers | None:
        """Probe GPM support of GPU ``index`` and allocate its two buffers."""
        supported, reason = self._nvml.gpm_support(index)
        if not supported:
            if reason is None:  # failed this time: asked again at the next poll
                self._set_state(index, "nvmlGpmQueryDeviceSupport failed (see the log)")
            else:
                self._unsupported_gpu(index, reason)
            return None
        buffers = self._allocate((index, None))
        if buffers is not None:
            self._set_state(index, "starting")
        return buffers

    def _sample_failed(self, index: int, buffers: _Buffers) -> None:
        reason = self._nvml.omitted_reason(index, "nvmlGpmSampleGet")
        if reason is not None:
            self._unsupported_gpu(index, f"nvmlGpmSampleGet: {reason}")
            return
        buffers.filled = 0  # the next pair starts afresh
        with self._lock:
            self._activity.pop((index, None), None)
            self._states[index] = "nvmlGpmSampleGet failed (see the log)"

    def _unsupported_gpu(self, index: int, reason: str) -> None:
        """No GPM on this GPU for the rest of the session: free its buffers."""
        self._free(index)
        self._unsupported.add(index)
        log.info("GPU %d: no GPM activity metrics (%s)", index, reason)
        self._set_state(index, f"unsupported: {reason}")

    def _free(self, index: int) -> None:
        """Free the buffers of GPU ``index`` and of its instances."""
        for key in [key for key in self._buffers if key[0] == index]:
            self._free_key(key)
        with self._lock:
            for key in [key for key in self._activity if key[0] == index]:
                del self._activity[key]

    def _free_key(self, key: _Key) -> None:
        buffers = self._buffers.pop(key, None)
        if buffers is not None:
            for sample in buffers.samples:
                self._nvml.gpm_sample_free(sample)
        with self._lock:
            self._activity.pop(key, None)

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
