"""The wall clock steps an hour forward or back as a rank hangs: the diagnosis, reading
the real training collector, finds the stalled rank ``stall_seconds`` after its last
step, not at once after a step forward nor an hour late after a step back
(docs/architecture.md, "Clocks")."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.diagnosis.diagnosis_support import diagnosing, evaluated
from tests.ledger.ledger_support import Clocks, send, step
from trainmon.collectors.training import TrainingCollector, TrainingConfig
from trainmon.diagnosis.thresholds import DiagnosisConfig

HOUR = 3600.0
STALL_SECONDS = 60.0
EVALUATION = 5.0


@pytest.fixture
def clocks() -> Clocks:
    return Clocks()


@pytest.fixture
def training(clocks: Clocks) -> Iterator[TrainingCollector]:
    collector = TrainingCollector(TrainingConfig(socket=None, ttl_seconds=600.0),
                                  clock=lambda: clocks.monotonic, wall_clock=lambda: clocks.wall)
    collector.start()
    yield collector
    collector.stop()


@pytest.mark.parametrize("jump", [HOUR, -HOUR], ids=["forward", "back"])
def test_a_hang_across_a_clock_step_is_found_after_stall_seconds(
        training: TrainingCollector, clocks: Clocks, jump: float) -> None:
    registry = diagnosing(DiagnosisConfig(stall_seconds=STALL_SECONDS), training,
                          clock=lambda: clocks.monotonic, wall_clock=lambda: clocks.wall)
    steps = 0
    for second in range(1, 31):  # 30 s of steps, ten a second
        clocks.advance(1.0)
        steps += 10
        send(training, step(steps, last_step_time=clocks.wall))
        if second % EVALUATION == 0:
            evaluated(registry)
    hung_at = clocks.wall
    clocks.wall += jump
    found_after = None
    for second in range(1, 121):  # its client goes on reporting, no step more
        clocks.advance(1.0)
        send(training, step(steps, last_step_time=hung_at + jump))
        if second % EVALUATION == 0:
            stalled = evaluated(registry).value("trainmon_diagnosis_stalled_ranks",
                                                job="resnet50")
            if stalled and found_after is None:
                found_after = second
    assert found_after == STALL_SECONDS + EVALUATION
