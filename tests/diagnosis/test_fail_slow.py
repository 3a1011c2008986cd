"""The fail-slow detector on made-up step streams: what it names, and what it must not.

Each test feeds ``FailSlowDetector`` one snapshot per 3-s evaluation, as the daemon's
diagnosis collector does, built from per-step durations it chooses; the real jobs are in
``test_fail_slow_jobs.py``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from trainmon.diagnosis.failslow import FailSlow, FailSlowDetector
from trainmon.diagnosis.samples import ScrapedSamples, labels_of

INTERVAL = 3.0
START = 1_700_000_000.0


@dataclass
class Rank:
    """A rank's cumulative counters."""

    name: str
    steps: float = 0.0
    step_seconds: float = 0.0
    data_wait: float = 0.0
    exposed: float = 0.0
    throttled: float = 0.0
    groups: dict[str, float] = field(default_factory=dict)


@dataclass
class Stream:
    """Snapshots of a job's ranks: ``step(rank, t)`` gives (compute, data wait, exposed
    comm) of one step of ``rank`` at ``t`` seconds into the run."""

    step: Callable[[str, float], tuple[float, float, float]]
    ranks: list[str] = field(default_factory=lambda: ["0", "1"])
    job: str = "llm"
    world_size: float = 2.0
    #: (rank, t) -> cgroup throttled seconds per second
    throttled: Callable[[str, float], float] = lambda rank, t: 0.0
    #: (rank, t) -> the exposed communication of one step per process group (their sum is
    #: the step's); none: the ranks report no groups
    groups: Callable[[str, float], dict[str, float]] | None = None
    #: (rank, t) -> the SM clock (Hz) of the rank's GPU (GPU index = rank); none: no GPU
    gpu_clock: Callable[[str, float], float] | None = None

    def snapshots(self, seconds: float) -> list[ScrapedSamples]:
        state = {name: Rank(name) for name in self.ranks}
        clock = {name: 0.0 for name in self.ranks}
        out = []
        t = 0.0
        while t <= seconds:
            samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
            for name, rank in state.items():
                while clock[name] < t:
                    compute, wait, exposed = self.step(name, clock[name])
                    duration = compute + wait + exposed
                    rank.steps += 1
                    rank.step_seconds += duration
                    rank.data_wait += wait
                    rank.exposed += exposed
                    for group, waited in (self.groups(name, clock[name])
                                          if self.groups else {}).items():
                        rank.groups[group] = rank.groups.get(group, 0.0) + waited
                    clock[name] += duration
                rank.throttled += self.throttled(name, t) * INTERVAL
                labels = labels_of({"job": self.job, "owner": "uid:1000", "rank": name})
                for sample, value in (
                        ("trainmon_training_step_seconds_count", rank.steps),
                        ("trainmon_training_step_seconds_sum", rank.step_seconds),
                        ("trainmon_training_data_wait_seconds_total", rank.data_wait),
                        ("trainmon_training_comm_exposed_seconds_total", rank.exposed),
                        ("trainmon_training_rank_cpu_throttled_seconds_total", rank.throttled)):
                    samples.setdefault(sample, {})[labels] = value
                for group, waited in rank.groups.items():
                    samples.setdefault("trainmon_training_group_comm_exposed_seconds_total",
                                       {})[labels_of({**dict(labels), "group": group})] = waited
                samples.setdefault("trainmon_training_rank_info", {})[labels_of(
                    {"job": self.job, "owner": "uid:1000", "rank": name,
                     "gpu": name if self.gpu_clock else "", "pid": "1"})] = 1.0
                if self.gpu_clock:
                    samples.setdefault("trainmon_gpu_sm_clock_hertz", {})[labels_of(
                        {"gpu": name})] = self.gpu_clock(name, t)
            samples.setdefault("trainmon_training_world_size", {})[labels_of(
                {"job": self.job, "owner": "uid:1000"})] = self.world_size
            out.append(ScrapedSamples(t, START + t, samples))
            t += INTERVAL
        return out


def detect(stream: Stream, seconds: float) -> list[tuple[float, tuple[FailSlow, ...]]]:
    """What the detector holds after each snapshot: (seconds into the run, changes)."""
    detector = FailSlowDetector(ratio=0.1, test_seconds=24, reference_seconds=120,
                                warmup_steps=5)
    return [(snapshot.wall - START, detector.update(snapshot))
            for snapshot in stream.snapshots(seconds)]


def first(held: list[tuple[float, tuple[FailSlow, ...]]]) -> tuple[float, FailSlow]:
    return next((t, changes[0]) for t, changes in held if changes)


def noisy(seed: int, spread: float) -> Callable[[float], float]:
    draw = random.Random(seed)
    return lambda base: base * (1 + draw.uniform(-spread, spread))


def test_one_rank_slowed_in_its_compute_is_named_with_its_cause() -> None:
    jitter = noisy(1, 0.05)

    def step(rank: str, t: float) -> tuple[float, float, float]:
        slow = 0.04 if t >= 90 else 0.0  # rank 1 computes 40 % longer from 90 s on
        compute = jitter(0.10) + (slow if rank == "1" else 0.0)
        # the other rank waits for it in the all-reduce
        return compute, 0.002, 0.01 + (slow if rank == "0" else 0.0)

    held = detect(Stream(step, throttled=lambda rank, t: 0.4 if rank == "1" and t >= 90
                         else 0.0), 200)
    at, change = first(held)
    assert (change.rank, change.part, change.kind, change.cause) == (
        "1", "compute", "scheduling", "cpu_throttled")
    assert 90 < at <= 90 + 60
    assert 0.25 < change.ratio < 0.45
    assert START + 84 <= change.start <= START + 96
    assert held[-1][1] and held[-1][1][0].rank == "1"  # it holds


def test_a_throttled_rank_whose_collectives_slowed_with_it_is_named() -> None:
    """Its compute grew less than the threshold: the job's communication and step grew on
    every rank (the others wait for it; its own collectives run on its throttled CPU), and
    its cgroup's throttling names it, not "the job"."""
    jitter = noisy(3, 0.03)

    def step(rank: str, t: float) -> tuple[float, float, float]:
        late = t >= 90
        compute = jitter(0.10) + (0.008 if late and rank == "1" else 0.0)
        return compute, 0.002, 0.01 + (0.03 if late else 0.0)

    held = detect(Stream(step, throttled=lambda rank, t: 0.3 if rank == "1" and t >= 90
                         else 0.0), 200)
    at, change = first(held)
    assert (change.rank, change.part, change.kind, change.cause) == (
        "1", "step", "scheduling", "cpu_throttled"), change
    assert 90 < at <= 90 + 60
    assert [c.rank for c in held[-1][1]] == ["1"]


def test_a_slower_dataset_is_the_whole_job_and_storage() -> None:
    def step(rank: str, t: float) -> tuple[float, float, float]:
        return 0.1, 0.005 + (0.03 if t >= 90 else 0.0), 0.01

    at, change = first(detect(Stream(step), 200))
    assert (change.rank, change.part, change.kind, change.cause) == (
        "", "data_wait", "storage", "data_loading")
    assert at <= 90 + 60 and change.ratio == pytest.approx(0.26, abs=0.03)


def test_every_rank_waiting_longer_on_a_multi_node_job_points_elsewhere() -> None:
    def step(rank: str, t: float) -> tuple[float, float, float]:
        return 0.1, 0.0, 0.01 + (0.03 if t >= 90 else 0.0)

    def groups(rank: str, t: float) -> dict[str, float]:
        return {"dp": 0.01, "tp": 0.03 if t >= 90 else 0.0}

    _, change = first(detect(Stream(step, world_size=16, groups=groups), 200))
    assert (change.rank, change.part, change.kind, change.cause, change.group) == (
        "", "comm", "scheduling", "other_node", "tp")
    _, single = first(detect(Stream(step), 200))
    assert (single.kind, single.part) == ("communication", "comm")


@pytest.mark.parametrize("shape", ["evaluation", "checkpoint", "both", "batches", "warmup",
                                   "faster", "burst"])
def test_healthy_jobs_stay_silent(shape: str) -> None:
    jitter = noisy(7, 0.3 if shape == "batches" else 0.05)

    def step(rank: str, t: float) -> tuple[float, float, float]:
        extra = 0.0
        if shape in ("evaluation", "both") and t % 20 < 0.1:
            extra += 3.0  # a 3-s evaluation every 20 s, inside the next step
        if shape in ("checkpoint", "both") and t % 15 < 0.1:
            extra += 2.0
        if shape == "warmup" and t < 20:
            extra += 0.5
        base = 0.05 if shape == "faster" and t > 60 else 0.1
        if shape == "burst" and 120 <= t < 145:
            base *= 1.4  # 25 s of CPU contention from another job on the node
        return jitter(base) + extra, 0.002, 0.01

    assert all(not changes for _, changes in detect(Stream(step), 300))


def test_a_change_below_the_threshold_is_not_named() -> None:
    jitter = noisy(3, 0.02)

    def step(rank: str, t: float) -> tuple[float, float, float]:
        return jitter(0.1) + (0.006 if t >= 90 else 0.0), 0.0, 0.01

    assert all(not changes for _, changes in detect(Stream(step), 240))


def test_a_recovery_clears_the_change() -> None:
    def step(rank: str, t: float) -> tuple[float, float, float]:
        return 0.1 + (0.05 if 90 <= t < 150 else 0.0), 0.0, 0.01

    held = detect(Stream(step), 260)
    assert any(changes for _, changes in held)
    assert not held[-1][1]


def test_a_new_run_starts_again() -> None:
    detector = FailSlowDetector(ratio=0.1, test_seconds=24, reference_seconds=120,
                                warmup_steps=5)
    slow = Stream(lambda rank, t: (0.1 if t < 90 else 0.2, 0.0, 0.01))
    for snapshot in slow.snapshots(200):
        assert detector.update(snapshot) is not None
    assert detector.current(slow.snapshots(200)[-1])
    # the counters restart: a new run, whose level is its own
    for snapshot in Stream(lambda rank, t: (0.2, 0.0, 0.01)).snapshots(60):
        moved = ScrapedSamples(snapshot.at + 300, snapshot.wall + 300, snapshot.samples)
        changes = detector.update(moved)
    assert not changes


def test_one_change_per_rank_and_for_the_job_the_largest() -> None:
    def step(rank: str, t: float) -> tuple[float, float, float]:
        # from 90 s the data wait grows by 30 ms and, on its own, the compute by 60 ms
        later = t >= 90
        return 0.1 + (0.06 if later else 0.0), 0.005 + (0.03 if later else 0.0), 0.01

    held = detect(Stream(step), 200)
    assert all(len({change.rank for change in changes}) == len(changes)
               for _, changes in held)
    [change] = held[-1][1]
    assert (change.rank, change.part) == ("", "compute")


def test_a_rank_whose_gpu_clocks_dropped_is_named_with_it() -> None:
    def step(rank: str, t: float) -> tuple[float, float, float]:
        slow = 0.03 if t >= 90 else 0.0
        return 0.1 + (slow if rank == "0" else 0.0), 0.0, 0.01 + (slow if rank == "1" else 0.0)

    _, change = first(detect(Stream(step, gpu_clock=lambda rank, t: 1.4e9 if rank == "0"
                                    and t >= 90 else 1.98e9), 220))
    assert (change.rank, change.part, change.kind, change.cause) == (
        "0", "compute", "scheduling", "gpu_clocks")
    assert (change.evidence_before, change.evidence_now) == (1.98e9, 1.4e9)


@pytest.mark.parametrize("jump", [3600.0, -3600.0], ids=["forward", "back"])
def test_a_wall_clock_step_neither_hides_nor_makes_a_change(jump: float) -> None:
    """The wall clock steps an hour at 60 s (an NTP step, a VM resume), the monotonic
    clock goes on: what the detector names is what it names without the step
    (docs/architecture.md, "Clocks")."""
    def step(rank: str, t: float) -> tuple[float, float, float]:
        return (0.14 if rank == "1" and t >= 90 else 0.10), 0.002, 0.01

    def held(stepped: float) -> list[tuple[float, tuple[FailSlow, ...]]]:
        detector = FailSlowDetector(ratio=0.1, test_seconds=24, reference_seconds=120,
                                    warmup_steps=5)
        return [(snapshot.at, detector.update(ScrapedSamples(
            snapshot.at, snapshot.wall + (stepped if snapshot.at >= 60 else 0.0),
            snapshot.samples))) for snapshot in Stream(step).snapshots(200)]

    steady = held(0.0)
    at, change = first(steady)
    assert change.rank == "1" and 90 < at <= 150
    assert [(t, [(c.rank, c.part, c.ratio) for c in changes]) for t, changes in held(jump)] \
        == [(t, [(c.rank, c.part, c.ratio) for c in changes]) for t, changes in steady]
