"""Where a rank's GPU-seconds go: the booking behind the goodput of a run (issue 26).

Every second a rank holds its GPU is booked to exactly one bucket, so the
buckets of a rank (and of a run, and of a job) add up to the GPU-seconds it
held. The recorder (``trainmon.ledger.recorder``) calls ``RankBooking.book``
at every tick with the rank's cumulative totals and the Unix time its latest
step ended (the sender's, never ahead of the daemon's clock); the booking
keeps ``booked_until``, the instant up to which the rank's time is booked,
and books what lies behind the evidence:

- **Completed steps.** A step runs from the end of the one before to its own
  end (docs/protocol.md), so the time from ``booked_until`` to the latest step
  end is the loop's wall time. It is split by the steps' own totals over the
  same stretch: ``checkpoint`` (``checkpoint_seconds``), ``data_wait``,
  ``comm_exposed`` (measured, else the ``comm`` phase), and ``productive``,
  the rest. The split is scaled to the stretch (a report arrives up to a
  second after its step ended, so the totals and the daemon's clock differ
  by that much), which keeps the sum exact.
- **A stall.** The part of the stretch beyond what its steps typically take
  (their count × the typical step — the job's when the caller knows it, else
  the rank's own: the median mean step of its latest stretches without a
  stall — plus the checkpoint time they report) is ``stalled`` when it
  exceeds ``stall_threshold``: a step that ended after a hang. It is taken
  from ``productive`` first, then from ``data_wait`` and ``comm_exposed`` (a
  loader that hung is a stall, not data wait), never from ``checkpoint``.
  While a rank that has stepped before completes no step for longer than the
  threshold, the time since ``booked_until`` is booked ``stalled`` as it
  passes, so the stall shows while it lasts; the stretch that ends it books
  its excess over its steps' typical time ``stalled`` too, whatever its
  length (the rest of the hang). A save longer than the threshold is booked
  ``stalled`` while it lasts (the rank reports it only when it ends).
- **Before the first step.** Time from the rank's first sight to the start
  of its first step is ``startup``, booked when that step ends (its start is
  its end less its length) or, for a rank that never completes one, when it
  leaves.
- **Time outside the loop** that the steps do not cover (the stretch longer
  than their wall time after the first step: a reporter restarted, or
  paused) is ``other``, as is what ``close`` books when the rank leaves.

- **Waiting for a slower rank.** A rank's *work* per step is its step less its
  exposed communication. In a synchronous job the collective ends when the
  slowest rank arrives, so the exposed communication of a rank whose work is
  below the slowest's (``peers_work``: the largest work per step of the other
  ranks of its run on the node, each from its latest stretch without a stall)
  holds that difference: ``straggler_wait``, per step the slowest's work less
  its own, at most its exposed communication, which keeps the rest. The
  slowest rank's exposed communication is all ``comm_exposed`` (the transfer
  itself), so nothing is counted twice. Only ranks on the node are compared:
  a rank waiting for a slower one on another node books ``comm_exposed``.
- **Redone work.** A rank of a run that restarts a crashed or preempted run
  of the same job is given ``redo_steps``, the steps the crashed rank did
  after its latest checkpoint (``steps_since_checkpoint``); the productive
  time of its first that many steps is ``lost_progress``.

``idle_allocated`` (GPUs a job's processes hold while none of its ranks
report) needs evidence beyond a rank's totals: the recorder books it from
NVML's process list (``trainmon.ledger.holding``). The names of every bucket
are ``BUCKETS``. Standard library only; no clock of its own.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from trainmon.contract import stall_threshold

#: Every bucket of the GPU-second ledger, in the order documents list them.
BUCKETS = ("productive", "data_wait", "comm_exposed", "checkpoint", "straggler_wait",
           "stalled", "startup", "idle_allocated", "lost_progress", "other")
#: The phase whose seconds stand in for exposed communication when not measured.
COMM_PHASE = "comm"
#: Stretches whose mean step makes a rank's typical step (their median), when the caller
#: does not say it.
TYPICAL_STRETCHES = 21




@dataclass(frozen=True)
class RankTotals:
    """The cumulative totals of one rank the booking reads (a subset of its report)."""

    steps: int = 0
    step_seconds: float = 0.0
    data_wait_seconds: float = 0.0
    #: Measured exposed communication; None where the rank does not measure it.
    comm_exposed_seconds: float | None = None
    phase_seconds: Mapping[str, float] = field(default_factory=dict)
    #: Seconds in checkpoint saves; None where the rank does not report them.
    checkpoint_seconds: float | None = None
    #: Checkpoint saves completed; None where the rank does not report them.
    checkpoints: int | None = None
    #: Unix time the latest save completed (the daemon's record of it), if any.
    last_checkpoint_time: float | None = None

    def exposed(self) -> float:
        """Exposed communication: measured, else the ``comm`` phase's seconds."""
        if self.comm_exposed_seconds is not None:
            return self.comm_exposed_seconds
        return self.phase_seconds.get(COMM_PHASE, 0.0)


def empty_buckets() -> dict[str, float]:
    return dict.fromkeys(BUCKETS, 0.0)


@dataclass
class RankBooking:
    """One rank's booking: ``booked_until`` and the seconds booked per bucket."""

    #: Daemon-clock time up to which this rank's GPU time is booked.
    booked_until: float
    #: The totals at ``booked_until`` (what the next stretch is measured from).
    seen: RankTotals = field(default_factory=RankTotals)
    seconds: dict[str, float] = field(default_factory=empty_buckets)
    #: A stall is being booked as it passes (no step since more than the threshold).
    stalling: bool = False
    #: Mean step seconds of the latest stretches without a stall.
    recent_steps: deque[float] = field(default_factory=lambda: deque(maxlen=TYPICAL_STRETCHES))
    #: The rank's steps when its latest checkpoint save was first seen (0: none yet).
    steps_at_checkpoint: int = 0
    #: Steps of this run that redo what a crashed run of the job did after its last
    #: checkpoint: their productive time is ``lost_progress``.
    redo_steps: int = 0
    #: The rank completed a step in this booking (before: its time is ``startup``, and
    #: no stall; a new run's totals may start from an earlier run's).
    stepped: bool = False
    #: Seconds per step of the latest stretch without a stall, less its exposed
    #: communication: what the rank's peers wait for when it is the slowest.
    work_per_step: float | None = None

    @classmethod
    def new_run(cls, began: float, before: RankTotals | None = None) -> RankBooking:
        """A rank of a run this daemon sees from its start, whose reporter began at
        ``began`` (Unix time): every total it reports beyond ``before`` (the rank's
        totals before the run, zero for a new rank) is booked, and the time before its
        first step is ``startup``."""
        return cls(booked_until=began, seen=before or RankTotals(),
                   steps_at_checkpoint=(before or RankTotals()).steps)

    @classmethod
    def resumed(cls, now: float, totals: RankTotals) -> RankBooking:
        """A rank first seen at ``now`` with ``totals`` made before this booking
        existed (a daemon restarted mid-run): those are not booked again."""
        return cls(booked_until=now, seen=totals, stepped=totals.steps > 0)

    def typical_step(self) -> float | None:
        """The median mean step of the rank's latest stretches without a stall."""
        if not self.recent_steps:
            return None
        ordered = sorted(self.recent_steps)
        return ordered[len(ordered) // 2]

    def book(self, now: float, totals: RankTotals, last_step: float | None,
             typical_step_seconds: float | None = None,
             peers_work: float | None = None) -> dict[str, float]:
        """Book the rank's time up to what the evidence at ``now`` covers; returns the
        seconds booked by this call per bucket (only those above zero).
        ``typical_step_seconds``: the job's typical step; None: the rank's own
        (``typical_step``). ``peers_work``: the largest ``work_per_step`` of the other
        ranks of its run; None: none known (no ``straggler_wait``)."""
        booked = empty_buckets()
        if typical_step_seconds is None:
            typical_step_seconds = self.typical_step()
        if totals.steps < self.seen.steps or totals.step_seconds < self.seen.step_seconds:
            self.seen = totals  # the reporter started again: measure from here
        threshold = stall_threshold(typical_step_seconds)
        if totals.steps > self.seen.steps and last_step is not None:
            end = min(max(last_step, self.booked_until), now)
            self._book_steps(booked, end - self.booked_until, totals, typical_step_seconds,
                             threshold, peers_work, ends_stall=self.stalling)
            if (totals.checkpoints or 0) > (self.seen.checkpoints or 0):
                self.steps_at_checkpoint = self._steps_at(totals, end)
            self.booked_until, self.seen, self.stalling = end, totals, False
            self.stepped = True
        since_step = self.booked_until if last_step is None else last_step
        if self.stepped and now - since_step > threshold and now > self.booked_until:
            booked["stalled"] += now - self.booked_until
            self.booked_until, self.stalling = now, True
        return self._add(booked)

    def close(self, now: float) -> dict[str, float]:
        """The rank left at ``now`` (its run ended, its reporter went): the time not
        booked yet is ``startup`` if it never completed a step, else ``other``."""
        booked = empty_buckets()
        if now > self.booked_until:
            booked["other" if self.stepped else "startup"] = now - self.booked_until
            self.booked_until = now
        return self._add(booked)

    def _book_steps(self, booked: dict[str, float], stretch: float, totals: RankTotals,
                    typical_step_seconds: float | None, threshold: float,
                    peers_work: float | None, *, ends_stall: bool) -> None:
        """Split ``stretch`` seconds behind the latest step end by the steps' totals;
        ``ends_stall``: a stall was booked as it passed, and these steps end it."""
        if stretch <= 0:
            return
        before, steps = self.seen, totals.steps - self.seen.steps
        wall = max(totals.step_seconds - before.step_seconds, 0.0)
        if wall < stretch:  # time the steps do not cover
            outside = stretch - wall
            booked["other" if self.stepped else "startup"] += outside
            stretch = wall
        parts = {
            "checkpoint": _increase(totals.checkpoint_seconds, before.checkpoint_seconds),
            "data_wait": max(totals.data_wait_seconds - before.data_wait_seconds, 0.0),
            "comm_exposed": max(totals.exposed() - before.exposed(), 0.0),
        }
        if wall > 0:
            scale = stretch / wall
            parts = {name: value * scale for name, value in parts.items()}
        waiting = sum(parts.values())
        if waiting > stretch:  # overlapping parts: fit them to the stretch
            parts = {name: value * stretch / waiting for name, value in parts.items()}
            waiting = stretch
        parts["productive"] = stretch - waiting
        excess = 0.0
        if typical_step_seconds:
            excess = stretch - steps * typical_step_seconds - parts["checkpoint"]
        if ends_stall or excess > threshold:
            for name in ("productive", "data_wait", "comm_exposed"):
                taken = min(parts[name], max(excess, 0.0))
                parts[name] -= taken
                booked["stalled"] += taken
                excess -= taken
        elif steps > 0 and wall > 0:
            self.recent_steps.append(wall / steps)
            self.work_per_step = (stretch - parts["comm_exposed"]) / steps
            if peers_work is not None and peers_work > self.work_per_step:
                waited = min(parts["comm_exposed"], (peers_work - self.work_per_step) * steps)
                parts["comm_exposed"] -= waited
                booked["straggler_wait"] += waited
        if self.redo_steps > 0 and steps > 0:
            redone = min(self.redo_steps, steps)
            lost = parts["productive"] * redone / steps
            parts["productive"] -= lost
            booked["lost_progress"] += lost
            self.redo_steps -= redone
        for name, value in parts.items():
            booked[name] += value

    def _steps_at(self, totals: RankTotals, end: float) -> int:
        """The rank's steps when its latest save completed, interpolated over the stretch
        that holds it: steps evenly spread over the stretch's time outside its saves (a
        stall would make it approximate)."""
        saved = totals.last_checkpoint_time
        if saved is None or end <= self.booked_until:
            return totals.steps
        saving = _increase(totals.checkpoint_seconds, self.seen.checkpoint_seconds)
        stepping = max(end - self.booked_until - saving, 0.0)
        if stepping <= 0:
            return totals.steps
        # the save's own time comes before its completion, not among the steps before it
        share = min(max((saved - self.booked_until - saving) / stepping, 0.0), 1.0)
        return self.seen.steps + round(share * (totals.steps - self.seen.steps))

    def steps_since_checkpoint(self) -> int:
        """Steps the rank completed after its latest checkpoint (all of them without one):
        what a restart from that checkpoint redoes."""
        return max(self.seen.steps - self.steps_at_checkpoint, 0)

    def _add(self, booked: dict[str, float]) -> dict[str, float]:
        for name, value in booked.items():
            self.seconds[name] += value
        return {name: value for name, value in booked.items() if value > 0}


def _increase(now: float | None, then: float | None) -> float:
    if now is None:
        return 0.0
    return max(now - (then or 0.0), 0.0)


def goodput_ratio(seconds: Mapping[str, float]) -> float | None:
    """Productive seconds over all booked seconds; None before anything is booked."""
    allocated = sum(seconds.values())
    return seconds.get("productive", 0.0) / allocated if allocated > 0 else None
