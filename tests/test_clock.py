"""``trainmon.clock.WallSteps``: the wall clock's steps, and the steady time without them."""

from __future__ import annotations

import pytest

from trainmon.clock import MAX_STEPS, WallSteps

WALL = 1_700_000_000.0


def test_the_steady_time_is_the_wall_clock_until_it_steps() -> None:
    steps = WallSteps(1000.0, WALL)
    # slewing (a few ms) is no step: the steady time is the wall clock to the bit
    assert steps.observe(1010.0, WALL + 10.003) == WALL + 10.003
    assert steps.stepped == 0.0
    assert steps.unix(WALL + 5.0) == steps.said(WALL + 5.0) == WALL + 5.0


@pytest.mark.parametrize("jump", [3600.0, -3600.0], ids=["forward", "back"])
def test_a_step_is_taken_out_of_the_steady_time(jump: float) -> None:
    steps = WallSteps(1000.0, WALL)
    assert steps.observe(1030.0, WALL + 30.0 + jump) == WALL + 30.0
    assert steps.stepped == jump
    assert steps.observe(1040.0, WALL + 40.0 + jump) == WALL + 40.0
    # a time before the step: as the wall clock reckons it now, and as it said it then
    assert steps.unix(WALL + 20.0) == WALL + 20.0 + jump
    assert steps.said(WALL + 20.0) == WALL + 20.0
    # a time after it
    assert steps.said(WALL + 35.0) == WALL + 35.0 + jump
    # a Unix time read now (or sent by a process on this clock)
    assert steps.steady(WALL + 38.0 + jump) == WALL + 38.0


def test_steps_forward_and_back_each_count_for_the_times_after_them() -> None:
    steps = WallSteps(0.0, WALL)
    steps.observe(10.0, WALL + 10.0 + 60.0)
    steps.observe(20.0, WALL + 20.0 + 60.0 - 100.0)
    assert steps.stepped == -40.0
    assert [steps.said(WALL + at) - (WALL + at) for at in (5.0, 15.0, 25.0)] == [
        0.0, 60.0, -40.0]


def test_a_time_before_the_steps_remembered_counts_those_forgotten() -> None:
    steps = WallSteps(0.0, WALL)
    for index in range(1, MAX_STEPS + 3):
        steps.observe(10.0 * index, WALL + 10.0 * index + 2.0 * index)
    assert steps.stepped == 2.0 * (MAX_STEPS + 2)
    # the two oldest steps are forgotten: a time before the third counts both
    assert steps.said(WALL + 25.0) == WALL + 25.0 + 4.0
    assert steps.said(WALL + 5.0) == WALL + 5.0 + 4.0
