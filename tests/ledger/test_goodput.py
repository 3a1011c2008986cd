"""The GPU-second booking of one rank (``trainmon.ledger.goodput``), against the truth
of a simulated training loop whose every second the test knows.

The loop: ``STARTUP`` seconds before its first step, steps of ``STEP`` seconds of
which a quarter waits for data, a checkpoint save of ``SAVE`` seconds every
``SAVE_EVERY`` steps, and one hang of ``HANG`` seconds. The rank reports its
cumulative totals once a second (a report says the state at its send time, as the
client's sender thread does); the daemon books at ticks ``TICK`` seconds apart,
with the step time of the latest report's arrival, as the training store keeps it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from trainmon.ledger.goodput import (
    BUCKETS,
    RankBooking,
    RankTotals,
    goodput_ratio,
    stall_threshold,
)

STARTUP = 3.0
STEP = 0.2
WAIT = STEP / 4
SAVE = 1.0
SAVE_EVERY = 50
HANG = 20.0
TICK = 5.0
REPORT = 1.0


@dataclass
class Truth:
    seconds: dict[str, float]
    #: (send time, totals, time of the latest step end), one per report.
    reports: list[tuple[float, RankTotals, float | None]]
    end: float


def simulate(steps: int, hang_at: int | None) -> Truth:
    """The loop's timeline, its true buckets, and the reports it sends."""
    truth = dict.fromkeys(BUCKETS, 0.0)
    truth["startup"] = STARTUP
    now, ends = STARTUP, []
    totals = RankTotals()
    states: list[tuple[float, RankTotals]] = []
    for step in range(1, steps + 1):
        length, waited, saved = STEP, WAIT, 0.0
        if step % SAVE_EVERY == 0:
            length += SAVE
            saved = SAVE
        if step == hang_at:
            length += HANG
            truth["stalled"] += HANG
        truth["data_wait"] += waited
        truth["checkpoint"] += saved
        truth["productive"] += length - waited - saved - (HANG if step == hang_at else 0.0)
        now += length
        ends.append(now)
        totals = RankTotals(
            steps=step, step_seconds=totals.step_seconds + length,
            data_wait_seconds=totals.data_wait_seconds + waited,
            checkpoint_seconds=(totals.checkpoint_seconds or 0.0) + saved)
        states.append((now, totals))
    reports, index, at, latest = [], 0, REPORT, (RankTotals(), None)
    while at <= now + REPORT:
        while index < len(states) and states[index][0] <= at:
            latest = (states[index][1], at)
            index += 1
        # the store stamps the step at the arrival of the report whose steps grew
        last_step = next((r[2] for r in reversed(reports) if r[1] is latest[0]), latest[1])
        reports.append((at, latest[0], last_step))
        at += REPORT
    return Truth(truth, reports, now)


def booked(truth: Truth, typical: float | None = STEP) -> RankBooking:
    booking = RankBooking.new_run(0.0)
    tick, index = TICK, 0
    latest: tuple[float, RankTotals, float | None] = (0.0, RankTotals(), None)
    while tick <= truth.end + 2 * TICK:
        while index < len(truth.reports) and truth.reports[index][0] <= tick:
            latest = truth.reports[index]
            index += 1
        booking.book(tick, latest[1], latest[2], typical)
        tick += TICK
    booking.close(truth.end + 2 * TICK)
    return booking


@pytest.mark.parametrize("typical", [STEP, None], ids=["job's step", "rank's own"])
def test_every_second_is_booked_once_and_each_bucket_is_within_5_percent_of_the_truth(
    typical: float | None,
) -> None:
    truth = simulate(steps=600, hang_at=300)
    booking = booked(truth, typical)
    allocated = truth.end + 2 * TICK  # the rank held its GPU from 0 until it left
    assert math.isclose(sum(booking.seconds.values()), allocated, rel_tol=1e-9)
    truth.seconds["other"] += 2 * TICK  # after its last step, until it left
    for bucket in BUCKETS:
        assert abs(booking.seconds[bucket] - truth.seconds[bucket]) <= 0.05 * allocated, (
            bucket, booking.seconds[bucket], truth.seconds[bucket])
    assert booking.seconds["stalled"] == pytest.approx(HANG, abs=2 * REPORT)
    assert booking.seconds["checkpoint"] == pytest.approx(12 * SAVE, rel=0.1)
    ratio = goodput_ratio(booking.seconds)
    assert ratio is not None
    assert ratio == pytest.approx(truth.seconds["productive"] / allocated, abs=0.05)


def test_a_hang_is_booked_stalled_while_it_lasts() -> None:
    """Between the hang's start and its step's end, ticks book it as it passes."""
    truth = simulate(steps=400, hang_at=300)
    booking = RankBooking.new_run(0.0)
    hang_began = STARTUP + 299 * STEP + 5 * SAVE  # the end of step 299
    seen = [r for r in truth.reports if r[0] <= hang_began + 15.0]
    _, totals, last_step = seen[-1]
    for at, report_totals, report_step in seen:
        booking.book(at, report_totals, report_step, STEP)
    assert totals.steps == 299
    assert booking.seconds["stalled"] == pytest.approx(15.0, abs=2 * REPORT)
    assert booking.booked_until == pytest.approx(hang_began + 15.0, abs=REPORT)
    assert last_step is not None and last_step < hang_began + REPORT


def test_slow_regular_steps_are_no_stall() -> None:
    """20 s steps are the job's pace: only a hang many of them long is a stall."""
    assert stall_threshold(20.0) == 200.0
    booking = RankBooking.new_run(0.0)
    for step in range(1, 11):
        end = 20.0 * step
        totals = RankTotals(steps=step, step_seconds=end, data_wait_seconds=step * 1.0)
        booking.book(end + 0.5, totals, end + 0.5, 20.0)
        booking.book(end + 15.0, totals, end + 0.5, 20.0)
    assert booking.seconds["stalled"] == 0.0
    assert booking.seconds["data_wait"] == pytest.approx(10.0, rel=0.05)
    assert booking.seconds["productive"] == pytest.approx(190.5, rel=0.05)


def test_a_resumed_rank_books_only_what_it_does_after_the_daemon_came_back() -> None:
    before = RankTotals(steps=1000, step_seconds=200.0, data_wait_seconds=50.0)
    booking = RankBooking.resumed(500.0, before)
    after = RankTotals(steps=1050, step_seconds=210.0, data_wait_seconds=52.5)
    booking.book(510.0, after, 510.0, STEP)
    assert sum(booking.seconds.values()) == pytest.approx(10.0)
    assert booking.seconds["data_wait"] == pytest.approx(2.5)
    assert booking.seconds["productive"] == pytest.approx(7.5)


def test_a_restarted_reporter_is_measured_from_its_new_totals() -> None:
    """Totals that went down are a new reporter: nothing negative, nothing twice."""
    booking = RankBooking.new_run(0.0)
    booking.book(10.0, RankTotals(steps=50, step_seconds=10.0), 10.0, STEP)
    booking.book(20.0, RankTotals(steps=10, step_seconds=2.0), 20.0, STEP)
    booking.book(30.0, RankTotals(steps=60, step_seconds=12.0), 30.0, STEP)
    assert all(value >= 0 for value in booking.seconds.values())
    assert sum(booking.seconds.values()) == pytest.approx(30.0)


def test_measured_exposed_communication_is_preferred_to_the_comm_phase() -> None:
    booking = RankBooking.new_run(0.0)
    totals = RankTotals(steps=10, step_seconds=10.0, comm_exposed_seconds=2.0,
                        phase_seconds={"comm": 6.0})
    booking.book(10.0, totals, 10.0, 1.0)
    assert booking.seconds["comm_exposed"] == pytest.approx(2.0)
    phase_only = RankBooking.new_run(0.0)
    phase_only.book(10.0, RankTotals(steps=10, step_seconds=10.0,
                                     phase_seconds={"comm": 6.0}), 10.0, 1.0)
    assert phase_only.seconds["comm_exposed"] == pytest.approx(6.0)


def test_a_rank_that_never_steps_is_all_startup_and_nothing_is_booked_twice() -> None:
    booking = RankBooking.new_run(0.0)
    for at in (5.0, 10.0, 15.0):
        assert booking.book(at, RankTotals(), None, None) == {}
    assert booking.close(40.0) == {"startup": 40.0}
    assert booking.close(40.0) == {}
    assert goodput_ratio(booking.seconds) == 0.0
    assert goodput_ratio(RankBooking.new_run(0.0).seconds) is None


def test_a_rank_waiting_for_a_slower_peer_books_straggler_wait_not_comm() -> None:
    """Two ranks of a synchronous job, steps of 1 s: rank 1 works 0.9 s and its
    all-reduce takes 0.1 s; rank 0 works 0.6 s and so waits 0.4 s in the all-reduce.
    Rank 0's 0.3 s a step beyond the transfer is straggler_wait; rank 1's 0.1 s stays
    comm_exposed, and every second is still booked once."""
    fast, slow = RankBooking.new_run(0.0), RankBooking.new_run(0.0)
    for step in range(10, 101, 10):
        at = float(step)
        slow.book(at, RankTotals(steps=step, step_seconds=at, comm_exposed_seconds=0.1 * step),
                  at, 1.0, peers_work=fast.work_per_step)
        fast.book(at, RankTotals(steps=step, step_seconds=at, comm_exposed_seconds=0.4 * step),
                  at, 1.0, peers_work=slow.work_per_step)
    assert fast.seconds["straggler_wait"] == pytest.approx(30.0)
    assert fast.seconds["comm_exposed"] == pytest.approx(10.0)
    assert fast.seconds["productive"] == pytest.approx(60.0)
    assert slow.seconds["straggler_wait"] == 0.0
    assert slow.seconds["comm_exposed"] == pytest.approx(10.0)
    assert sum(fast.seconds.values()) == pytest.approx(100.0)
    assert fast.work_per_step == pytest.approx(0.6)


def test_straggler_wait_never_exceeds_the_exposed_communication() -> None:
    """A peer that is slower by more than this rank waited (it was slow in steps this
    rank did not wait for, or its clock runs differently): at most what was exposed."""
    booking = RankBooking.new_run(0.0)
    booking.book(10.0, RankTotals(steps=10, step_seconds=10.0, comm_exposed_seconds=1.0),
                 10.0, 1.0, peers_work=5.0)
    assert booking.seconds["straggler_wait"] == pytest.approx(1.0)
    assert booking.seconds["comm_exposed"] == 0.0
    assert sum(booking.seconds.values()) == pytest.approx(10.0)


def test_a_restarted_run_loading_its_checkpoint_is_startup_not_a_stall() -> None:
    """The store's totals of a rank go on across its runs: a new run's booking starts
    from the earlier run's totals and its last step long ago. The 30 s it loads before
    its first step are startup, not stalled; the stretch its steps cover is theirs."""
    before = RankTotals(steps=500, step_seconds=100.0)
    booking = RankBooking.new_run(1000.0, before)
    for at in (1010.0, 1020.0, 1030.0):
        assert booking.book(at, before, 900.0, 0.2) == {}
    after = RankTotals(steps=550, step_seconds=110.0)
    booking.book(1040.0, after, 1040.0, 0.2)
    assert booking.seconds["startup"] == pytest.approx(30.0)
    assert booking.seconds["stalled"] == 0.0
    assert booking.seconds["productive"] == pytest.approx(10.0)
