"""The sawtooth detector on synthetic utilization traces (requirements of issue #3).

Traces imitate the driver: one sample every 1/6 s whose value is the busy share
of the sample period just ended (so fast waves are smeared the way real samples
are), optionally with noise and with idle samples thinned out.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from trainmon.gpu.sampler import (
    FLAG_THRESHOLD,
    BusyIdle,
    Hysteresis,
    UtilizationTrack,
    sawtooth_ratio,
)

WINDOW = 60.0
PERIOD_US = 166_667  # ~6 Hz, the driver's sampling period
Signal = Callable[[float], float]


def square(period: float, duty: float, busy: float = 1.0, idle: float = 0.0) -> Signal:
    return lambda t: busy if (t % period) / period < duty else idle


def saw(period: float, duty: float, busy: float = 1.0, idle: float = 0.0) -> Signal:
    """Busy work that drains: a ramp from ``busy`` down to half of it over the
    busy share of each period (the prefetch queue empties), then idle."""

    def value(t: float) -> float:
        phase = (t % period) / period
        return busy * (1 - 0.5 * phase / duty) if phase < duty else idle

    return value


def ramp(period: float, duty: float, busy: float = 1.0, idle: float = 0.0) -> Signal:
    """A ramp from idle up to busy over the busy share of each period, then idle."""

    def value(t: float) -> float:
        phase = (t % period) / period
        return idle + (busy - idle) * phase / duty if phase < duty else idle

    return value


def starting(signal: Signal, onset: float, phase_seconds: float) -> Signal:
    """``signal`` begun at time ``onset``, ``phase_seconds`` into its period."""
    return lambda t: signal(t - onset + phase_seconds)


def steady(level: float) -> Signal:
    return lambda t: level


def trace(
    signal: Signal,
    seconds: float,
    *,
    start: float = 0.0,
    noise: float = 0.0,
    sparse_idle: bool = False,
    seed: int = 1,
) -> list[tuple[int, float]]:
    """Driver-like samples of ``signal`` over ``[start, start + seconds)``."""
    rng = random.Random(seed)
    samples = []
    first = int(start * 1e6 / PERIOD_US) + 1
    for k in range(first, first + int(seconds * 1e6 / PERIOD_US)):
        end = k * PERIOD_US / 1e6
        steps = 6  # the busy share of the period just ended
        value = sum(signal(end - PERIOD_US / 1e6 * (j + 0.5) / steps) for j in range(steps)) / steps
        value = min(1.0, max(0.0, value + rng.uniform(-noise, noise)))
        if sparse_idle and value < 0.05 and k % 6:
            continue  # an idle GPU: the driver keeps fewer samples
        samples.append((k * PERIOD_US, value))
    return samples


def ratios(track: UtilizationTrack, samples: list[tuple[int, float]]) -> list[tuple[float, float]]:
    """(time in seconds, sawtooth ratio) after every sample."""
    result = []
    for timestamp_us, value in samples:
        track.add(timestamp_us, value)
        result.append((timestamp_us / 1e6, track.sawtooth_ratio()))
    return result


def new_track() -> UtilizationTrack:
    return UtilizationTrack(WINDOW, Hysteresis())


# -- never flagged ---------------------------------------------------------------


@pytest.mark.parametrize("level", [0.9, 0.93, 0.95, 0.98, 1.0])
def test_steady_high_load_is_never_flagged(level: float) -> None:
    track = new_track()
    result = ratios(track, trace(steady(level), 5 * WINDOW, noise=0.02))
    assert max(ratio for _, ratio in result) == 0
    assert track.transitions_total == 0
    assert track.idle_samples_total == 0
    assert track.samples_total == len(result)


@pytest.mark.parametrize("sparse", [False, True])
def test_idle_gpu_is_never_flagged(sparse: bool) -> None:
    track = new_track()
    samples = trace(steady(0.0), 5 * WINDOW, noise=0.03, sparse_idle=sparse)
    result = ratios(track, samples)
    assert max(ratio for _, ratio in result) == 0
    assert track.idle_samples_total == track.samples_total == len(samples)


@pytest.mark.parametrize("level", [round(0.05 * step, 2) for step in range(21)])
def test_noise_of_five_percent_around_any_level_is_never_flagged(level: float) -> None:
    for seed in range(3):
        track = new_track()
        result = ratios(track, trace(steady(level), 5 * WINDOW, noise=0.05, seed=seed))
        assert max(ratio for _, ratio in result) < FLAG_THRESHOLD
        assert track.transitions_total == 0, (level, seed)


# -- flagged within two windows ----------------------------------------------------

PERIODS = [2, 3, 5, 10, 20, 30, 45, 60, 90, 120]
DUTIES = [0.2, 0.35, 0.5, 0.65, 0.8]
PHASES = (0.0, 0.37, 0.5, 0.71)


def assert_flagged_within_two_windows(
    shape: Callable[..., Signal], period: float, phases: tuple[float, ...]
) -> None:
    """For every duty cycle, start phase and preceding regime (idle or busy):
    flagged no later than two windows after the wave starts (plus the one sample
    or two that show the edge), and flagged from then on — always for periods up to
    1.5 windows, at least 95 % of the time up to two windows (edges age out of
    the look-back just as new ones arrive)."""
    for duty in DUTIES:
        for before in (0.0, 1.0):
            for phase in phases:
                track = new_track()
                ratios(track, trace(steady(before), WINDOW, noise=0.02))
                onset = WINDOW
                wave = starting(shape(period, duty, busy=0.97, idle=0.01), onset, phase * period)
                result = ratios(track, trace(wave, 4 * WINDOW, start=onset, noise=0.02))
                case = (shape.__name__, period, duty, before, phase)
                flagged = [t - onset for t, ratio in result if ratio >= FLAG_THRESHOLD]
                assert flagged and flagged[0] <= 2 * WINDOW + 2 * PERIOD_US / 1e6, case
                late = [ratio >= FLAG_THRESHOLD for t, ratio in result if t - onset > 2 * WINDOW]
                assert sum(late) / len(late) >= (1.0 if period <= 1.5 * WINDOW else 0.95), case


@pytest.mark.parametrize("period", PERIODS)
def test_square_waves_are_flagged_within_two_windows(period: float) -> None:
    assert_flagged_within_two_windows(square, period, PHASES)


@pytest.mark.parametrize("period", PERIODS)
def test_saw_waves_are_flagged_within_two_windows(period: float) -> None:
    assert_flagged_within_two_windows(saw, period, PHASES)


@pytest.mark.parametrize("period", [p for p in PERIODS if p <= 1.5 * WINDOW])
def test_rising_ramps_are_flagged_within_two_windows(period: float) -> None:
    """A ramp from idle spends half its busy share below the busy threshold, so
    its first full cycle completes later: covered up to 1.5 windows."""
    assert_flagged_within_two_windows(ramp, period, PHASES)


def test_fast_waves_saturate_the_ratio() -> None:
    track = new_track()
    result = ratios(track, trace(square(10, 0.65), 3 * WINDOW))
    assert result[-1][1] == 1.0
    assert track.transitions_total == 2 * 3 * WINDOW / 10 - 1  # every edge but the first


def test_sparse_idle_samples_do_not_hide_a_wave() -> None:
    track = new_track()
    result = ratios(track, trace(square(20, 0.3, 0.95, 0.0), 3 * WINDOW, sparse_idle=True))
    assert result[-1][1] == 1.0


# -- the pieces ---------------------------------------------------------------------


def test_ratio_formula_is_transitions_over_four_capped_at_one() -> None:
    assert [sawtooth_ratio(n) for n in range(7)] == [0, 0.25, 0.5, 0.75, 1, 1, 1]


def fed(values: list[float]) -> UtilizationTrack:
    """A track with thresholds 0.1/0.5 after ``values``, one sample per second."""
    track = UtilizationTrack(WINDOW, Hysteresis(idle_threshold=0.1, busy_threshold=0.5))
    track.extend((int((k + 1) * 1e6), value) for k, value in enumerate(values))
    return track


def test_hysteresis_needs_both_thresholds_crossed() -> None:
    between = fed([0.6, 0.3, 0.45, 0.2, 0.55])
    assert (between.transitions_total, between.state) == (0, BusyIdle.BUSY)
    crossing = fed([0.6, 0.05, 0.3, 0.9, 0.09])
    assert (crossing.transitions_total, crossing.state) == (3, BusyIdle.IDLE)
    assert crossing.sawtooth_ratio() == 0.75
    unknown = fed([0.3, 0.3])
    assert (unknown.transitions_total, unknown.state) == (0, None)


def test_a_single_stall_flags_for_at_most_two_windows() -> None:
    track = new_track()
    stall = lambda t: 0.0 if 100 <= t < 110 else 0.95  # noqa: E731 - a checkpoint pause
    result = ratios(track, trace(stall, 5 * WINDOW))
    flagged = [t for t, ratio in result if ratio >= FLAG_THRESHOLD]
    assert flagged and flagged[0] == pytest.approx(110, abs=0.5)
    assert flagged[-1] <= 110 + 2 * WINDOW - 10 + 0.5  # the first edge ages out first


def test_old_and_repeated_samples_are_not_counted_twice() -> None:
    track = new_track()
    track.extend([(1_000_000, 0.9), (2_000_000, 0.0), (2_000_000, 0.0), (1_500_000, 0.9)])
    assert (track.samples_total, track.idle_samples_total, track.transitions_total) == (2, 1, 1)


def test_hysteresis_rejects_inverted_thresholds() -> None:
    with pytest.raises(ValueError):
        Hysteresis(idle_threshold=0.6, busy_threshold=0.5)
