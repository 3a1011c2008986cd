"""The wall clock steps an hour forward or back while a rank reports: its series live for
the TTL on the monotonic clock, and the wall clock less its last step and last report
timestamps stays their age (what the diagnosis and alerts read), docs/architecture.md,
"Clocks"."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from testkit.exposition import scrape
from tests.ledger.ledger_support import Clocks, send, step
from trainmon.collectors.training import TrainingCollector, TrainingConfig

HOUR = 3600.0
TTL = 60.0


@pytest.fixture
def clocks() -> Clocks:
    return Clocks()


@pytest.fixture
def training(clocks: Clocks) -> Iterator[TrainingCollector]:
    collector = TrainingCollector(TrainingConfig(socket=None, ttl_seconds=TTL),
                                  clock=lambda: clocks.monotonic, wall_clock=lambda: clocks.wall)
    collector.start()
    yield collector
    collector.stop()


def ages(training: TrainingCollector, clocks: Clocks) -> tuple[float, float]:
    """The wall clock less the rank's last step and last report timestamps (s)."""
    exposition = scrape(training)
    return (clocks.wall - exposition.value("trainmon_training_last_step_timestamp_seconds",
                                           job="resnet50", rank="0"),
            clocks.wall - exposition.value("trainmon_training_last_report_timestamp_seconds",
                                           job="resnet50", rank="0"))


@pytest.mark.parametrize("jump", [HOUR, -HOUR], ids=["forward", "back"])
def test_a_step_leaves_the_ages_of_the_last_step_and_report_as_they_are(
        training: TrainingCollector, clocks: Clocks, jump: float) -> None:
    send(training, step(10, last_step_time=clocks.wall - 0.5))
    clocks.advance(5.0)
    clocks.wall += jump
    assert ages(training, clocks) == pytest.approx((5.5, 5.0))
    # the rank reports again, its steps stopped: the sender's word is on the new clock
    send(training, step(10, last_step_time=clocks.wall - 5.5))
    clocks.advance(20.0)
    assert ages(training, clocks) == pytest.approx((25.5, 20.0))
    # it steps again, its client reads the last step time on the stepped clock
    send(training, step(20, last_step_time=clocks.wall - 0.25))
    assert ages(training, clocks) == pytest.approx((0.25, 0.0))


@pytest.mark.parametrize("jump", [HOUR, -HOUR], ids=["forward", "back"])
def test_a_rank_expires_after_the_ttl_on_the_monotonic_clock(
        training: TrainingCollector, clocks: Clocks, jump: float) -> None:
    send(training, step(10))
    clocks.advance(TTL / 2)
    clocks.wall += jump
    assert [view.rank for view in training.store.snapshot().ranks] == [0]
    clocks.advance(TTL / 2 + 1.0)
    snapshot = training.store.snapshot()
    assert snapshot.ranks == []
    assert snapshot.evicted["ttl"] == 1
