"""High-rate GPU utilization sampling and the sawtooth detector.

Prometheus scrapes every 15–30 s, so it cannot see a GPU that alternates
between busy and idle every few seconds — the signature of a data-starved
training job. The driver, however, keeps a ring buffer of utilization samples
(about 100, one every ~167 ms). ``UtilizationSampler`` drains that buffer from
its own thread once per ``sample_interval_seconds`` (passing the last-seen
timestamp, so no sample is counted twice) and feeds one ``UtilizationTrack``
per GPU.

The detector (pure functions, tested on synthetic traces):

- **Hysteresis.** A sample at or above ``busy_threshold`` (default 0.5) puts the
  GPU in the *busy* state, a sample below ``idle_threshold`` (default 0.1) in
  the *idle* state; anything between keeps the previous state. A *transition*
  is a change between busy and idle. Because the two thresholds are 0.4 apart,
  noise of ±5 % around any steady level can never cause a transition.
- **Sawtooth ratio.** With ``n`` = transitions during the last two windows
  (``2 × window_seconds``, default 120 s)::

      sawtooth_ratio = min(1, n / 4)

  0 for a steady or idle GPU, 0.25 for a single change of regime (a job
  starting or stopping), 0.5 for one full busy/idle cycle, 1 for two cycles or
  more. Two windows are looked at so that an oscillation as slow as two
  windows still shows a full cycle at every moment.
- **Flagged** means ``sawtooth_ratio >= FLAG_THRESHOLD`` (0.5): at least one
  complete busy→idle→busy (or idle→busy→idle) cycle in the last two windows.
  A one-off stall such as a checkpoint flags for at most two windows; alert
  rules therefore require the flag to persist (``for: 5m``).

The time base is the samples' own timestamps, so the detector does not depend
on when the thread happens to run, and idle GPUs for which the driver reports
fewer samples are handled the same way.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from trainmon import contract
from trainmon.background import BackgroundThread
from trainmon.gpu.nvml import NVML, poll_quietly
from trainmon.gpu.types import GPULost

log = logging.getLogger(__name__)

#: ``sawtooth_ratio`` at or above this is "flagged" (alerts and ``doctor`` use it).
FLAG_THRESHOLD = contract.SAWTOOTH_FLAG
#: Transitions in the look-back at which the ratio saturates at 1 (two full cycles).
TRANSITIONS_AT_FULL_STRENGTH = 4
#: The look-back of the ratio, in windows.
LOOKBACK_WINDOWS = 2


class BusyIdle(enum.Enum):
    BUSY = "busy"
    IDLE = "idle"


@dataclass(frozen=True)
class Hysteresis:
    """Thresholds on the busy ratio (0–1) of one utilization sample."""

    idle_threshold: float = contract.SAMPLER_IDLE_LEVEL
    busy_threshold: float = contract.SAMPLER_BUSY_LEVEL

    def __post_init__(self) -> None:
        if not 0 < self.idle_threshold < self.busy_threshold <= 1:
            raise ValueError("need 0 < idle_threshold < busy_threshold <= 1")


def next_state(state: BusyIdle | None, value: float, hysteresis: Hysteresis) -> BusyIdle | None:
    """The busy/idle state after a sample of ``value`` (0–1); None = not known yet."""
    if value >= hysteresis.busy_threshold:
        return BusyIdle.BUSY
    if value < hysteresis.idle_threshold:
        return BusyIdle.IDLE
    return state


def sawtooth_ratio(transitions_in_lookback: int) -> float:
    """``min(1, n / 4)`` for ``n`` transitions in the last two windows (0–1)."""
    return min(1.0, max(0, transitions_in_lookback) / TRANSITIONS_AT_FULL_STRENGTH)


@dataclass(frozen=True)
class UtilizationSnapshot:
    """What the collector exports for one GPU (counters are since trainmon started)."""

    samples_total: int
    idle_samples_total: int
    transitions_total: int
    utilization_ratio: float | None
    sawtooth_ratio: float


class UtilizationTrack:
    """The sample stream of one GPU: counters, state and recent transitions.

    Memory is bounded: only transition times within the look-back are kept.
    """

    def __init__(self, window_seconds: float, hysteresis: Hysteresis) -> None:
        self.lookback_seconds = LOOKBACK_WINDOWS * window_seconds
        self.hysteresis = hysteresis
        self.samples_total = 0
        self.idle_samples_total = 0
        self.transitions_total = 0
        self.state: BusyIdle | None = None
        self.latest: float | None = None
        self.latest_timestamp_us = 0
        self._transitions: deque[int] = deque()

    def add(self, timestamp_us: int, value: float) -> None:
        """One sample: ``timestamp_us`` (µs, increasing) and busy ratio ``value``.

        Samples not newer than the latest one are ignored (never counted twice).
        """
        if timestamp_us <= self.latest_timestamp_us:
            return
        value = min(1.0, max(0.0, value))
        self.samples_total += 1
        if value < self.hysteresis.idle_threshold:
            self.idle_samples_total += 1
        new = next_state(self.state, value, self.hysteresis)
        if self.state is not None and new is not self.state:
            self.transitions_total += 1
            self._transitions.append(timestamp_us)
        self.state = new
        self.latest = value
        self.latest_timestamp_us = timestamp_us
        self._forget_before(timestamp_us)

    def extend(self, samples: Iterable[tuple[int, float]]) -> None:
        for timestamp_us, value in samples:
            self.add(timestamp_us, value)

    def sawtooth_ratio(self) -> float:
        """The ratio over the look-back ending at the latest sample.

        ``add`` already dropped transitions older than the look-back.
        """
        return sawtooth_ratio(len(self._transitions))

    def snapshot(self) -> UtilizationSnapshot:
        return UtilizationSnapshot(
            self.samples_total,
            self.idle_samples_total,
            self.transitions_total,
            self.latest,
            self.sawtooth_ratio(),
        )

    def _forget_before(self, now_us: int) -> None:
        horizon = now_us - self.lookback_seconds * 1e6
        while self._transitions and self._transitions[0] <= horizon:
            self._transitions.popleft()


class UtilizationSampler:
    """Drains every GPU's utilization samples from a background thread."""

    def __init__(
        self,
        nvml: NVML,
        *,
        interval_seconds: float = 1.0,
        window_seconds: float = 60.0,
        hysteresis: Hysteresis | None = None,
    ) -> None:
        self._nvml = nvml
        self._interval = interval_seconds
        self._window = window_seconds
        self._hysteresis = hysteresis or Hysteresis()
        self._tracks: dict[int, UtilizationTrack] = {}
        self._lock = threading.Lock()
        self._thread = BackgroundThread("gpu-sampler", self._run)

    def start(self) -> None:
        """Poll once now (so the first scrape has data), then every interval."""
        if self._thread.started:
            return
        self._poll_quietly()
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop()

    def poll(self) -> None:
        """Drain the new samples of every reachable GPU once.

        Raises ``NVMLUnavailable`` when NVML cannot be used; a lost GPU is skipped.
        """
        for device in self._nvml.devices():
            with self._lock:
                track = self._tracks.get(device.index)
                if track is None:
                    track = self._tracks[device.index] = UtilizationTrack(
                        self._window, self._hysteresis
                    )
                since = track.latest_timestamp_us
            try:
                samples = self._nvml.utilization_samples(device.index, since)
            except GPULost:
                continue
            with self._lock:
                track.extend(samples)

    def snapshot(self) -> Mapping[int, UtilizationSnapshot]:
        """The latest state of every GPU seen so far, by NVML index."""
        with self._lock:
            return {index: track.snapshot() for index, track in self._tracks.items()}

    def _run(self) -> None:
        while not self._thread.stopping.wait(self._interval):
            self._poll_quietly()

    def _poll_quietly(self) -> None:
        poll_quietly(self.poll, "utilization sampler", log)
