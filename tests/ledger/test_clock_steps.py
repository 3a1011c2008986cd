"""The wall clock steps an hour forward or back in the middle of a run (an NTP step, a
VM resume): the run ledger books, times and ends the run by the monotonic clock, and
stores its start and end as the wall clock said them (docs/architecture.md, "Clocks").

The rank reports once a second, ten steps of 0.1 s each, its last step time read on the
same wall clock as the daemon's (one host); the recorder ticks every 5 s.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.ledger.ledger_support import (
    WALL_START,
    Clocks,
    description,
    make_recorder,
    only_record,
    send,
    step,
)

HOUR = 3600.0
SECONDS = 120
STEPPED_AT = 60


@pytest.mark.parametrize("jump", [HOUR, -HOUR], ids=["forward", "back"])
def test_a_run_through_a_clock_step_is_booked_and_timed_by_the_monotonic_clock(
        clocks: Clocks, tmp_path: Path, jump: float) -> None:
    path = tmp_path / "ledger.sqlite3"
    training, ledger = make_recorder(clocks, path, flush_seconds=3600.0, stall_seconds=30.0)()
    ledger.start()
    try:
        send(training, description(), step(0))
        ledger.tick()
        for second in range(1, SECONDS + 1):
            clocks.advance(1.0)
            if second == STEPPED_AT:
                clocks.wall += jump
            send(training, step(10 * second, last_step_time=clocks.wall))
            if second % 5 == 0:
                ledger.tick()
                assert not ledger.recorder.readings().ends, second  # never stalled
        ended_at = clocks.wall
        send(training, description(ended="finished"))
        ledger.tick()
    finally:
        ledger.stop()
        training.stop()
    record = only_record(path)
    assert record.end_reason == "finished"
    assert record.summary["duration_seconds"] == pytest.approx(SECONDS)
    assert (record.started, record.ended) == (WALL_START, ended_at)
    booked = record.summary["gpu_seconds"]
    assert isinstance(booked, dict)
    assert sum(booked.values()) == pytest.approx(SECONDS)
    assert booked["stalled"] == booked["other"] == 0.0
    assert booked["productive"] == pytest.approx(0.65 * SECONDS)  # less data wait, comm


@pytest.mark.parametrize("jump", [HOUR, -HOUR], ids=["forward", "back"])
def test_a_hang_after_a_clock_step_stalls_the_run_after_stall_seconds(
        clocks: Clocks, tmp_path: Path, jump: float) -> None:
    """The rank stops stepping right after the step and goes on reporting (its client's
    heartbeat): the run is stalled 30 s after its last step, not an hour early or late,
    and the hang is booked ``stalled`` as it passes."""
    path = tmp_path / "ledger.sqlite3"
    training, ledger = make_recorder(clocks, path, flush_seconds=3600.0, stall_seconds=30.0)()
    ledger.start()
    try:
        send(training, description(), step(0))
        for second in range(1, 21):
            clocks.advance(1.0)
            send(training, step(10 * second, last_step_time=clocks.wall))
            ledger.tick()
        hung_at = clocks.wall
        clocks.wall += jump
        stalled_after = None
        for second in range(1, 61):
            clocks.advance(1.0)
            send(training, step(200, last_step_time=hung_at + jump))
            ledger.tick()
            if stalled_after is None and ledger.recorder.readings().ends:
                stalled_after = second
        (end,) = ledger.recorder.readings().ends
        booked = ledger.recorder.readings().gpu_seconds["resnet50"]
    finally:
        ledger.stop()
        training.stop()
    assert stalled_after == 30
    assert end.reason == "stalled"
    assert end.ended == hung_at  # the last step's end, as the wall clock said it
    assert booked["stalled"] == pytest.approx(60.0, abs=1.0)
    assert sum(booked.values()) == pytest.approx(80.0)
    # a stalled run's record ends at its last step
    assert only_record(path).summary["duration_seconds"] == pytest.approx(20.0)
