"""Per-job, per-rank training state: monotonic totals, caps, LRU, TTL, the data-wait window.

Reports carry cumulative totals per *reporter* (one process run). The store
keeps, for every ``(job, rank)``, exported totals that only ever grow: each
report adds its increase over the same reporter's previous report. A report
from a new ``reporter_id`` (a restarted process) or one whose totals went
backwards is a counter reset; its totals are then added whole, so the
exported counters stay monotonic across restarts and Prometheus never sees a
reset while the rank's series lives. A repeated or stale report adds nothing.
The optional measured-communication totals (``comm_seconds``,
``comm_exposed_seconds``, ``comm_bytes``) follow the same rules; a rank has
them only from its first report that carries them (unknown is not zero), and
a report that lacks them neither resets nor adds to them. The checkpoint
totals (``checkpoints``, ``checkpoint_seconds``) are optional in the same way, and so
is the step sketch (``step_sketch``: a rank's grows by each report's increase,
``trainmon.training.sketch.increase``, bounded like the client's).
So is communication per process group (``comm_groups``), group by group: a
group's totals count from a reporter's first report that carries the group, a
report that lacks a group the reporter sent before neither resets nor adds to
it (its last totals are kept for that reporter), and a group's total going
backwards is a counter reset like any other. Its ``seq`` and ``root`` are not
totals: the rank keeps the latest sent for each group, and forgets them at a
counter reset (they belonged to the previous process). A rank holds at most
``MAX_COMM_GROUPS`` groups; a report that would add more is refused (``limit``).
Each rank also keeps its last checkpoint: the time (the sender's
``last_checkpoint_time``, clamped to this daemon's clock; the arrival time
without it), the duration (the increase of ``checkpoint_seconds`` over the
increase of ``checkpoints`` in the report that advanced the count: exact for
one new checkpoint, the mean of several saved between two reports) and the
path; only a report that advances the count changes them. The path's
filesystem is resolved by the collector at scrape time, not here: ingestion
is on the push path and stays free of I/O.

Memory is bounded by ``max_jobs`` jobs (reports and run descriptions alike),
``max_ranks_per_job`` ranks and as many descriptions per job,
``MAX_REPORTERS_PER_RANK`` remembered reporters, ``MAX_PHASES`` phases and
``MAX_COMM_GROUPS`` process groups per rank (and per remembered reporter), a step
sketch of at most ``STEP_SKETCH_MAX_BUCKETS`` buckets per rank and for its
``SKETCHED_REPORTERS`` latest reporters (about 15 KB each when full), and
``WINDOW_SLOTS`` window samples per rank. A rank (or a description)
that is not refreshed for ``ttl_seconds`` is dropped with its series; a job
goes with its last rank and description. Who may write to a job, and how the
caps are shared between writers, is ``TrainingStore``'s docstring and
docs/security.md.

Runs: each rank remembers the run id of its latest report (``StepReport.run``)
and, separately, the latest run description (``RunDescription``) its reporter
sent, with the sender's pid (for resolving the run's data paths in the right
mount namespace). A description arrives before the first step and is
repeated every minute, so descriptions have their own TTL.
Stalls: a rank whose steps stopped sends stall reports (``StallReport``: where its
training thread is) while it stays stalled; the rank keeps the latest one
(with its arrival time) until a report of the same reporter shows more steps
than the stall's, a report of another reporter arrives (a restart), or the rank
expires. A stall of a rank that never reported is refused (``invalid_field``).
Config, environment and framework values under secret-looking names
(``protocol.is_secret_name``) are redacted here again, whatever the sender
did: nothing downstream (metrics, ledger, logs) can see them.
Clocks (docs/architecture.md, "Clocks"): the TTL and the data-wait window run on
the monotonic clock; a rank's last report, last step and stall arrival are kept on
the steady time (``trainmon.clock``) and shown as the wall clock reckons them at the
snapshot, so that their age is right after the wall clock stepped. A description's
``received`` and a checkpoint's time are Unix times as said, read by no interval.
"""

from __future__ import annotations

import operator
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from trainmon.clock import WallSteps
from trainmon.contract import STEP_BUCKET_COUNT
from trainmon.training.protocol import (
    REDACTED,
    REJECT_REASONS,
    ReportError,
    RunDescription,
    StallReport,
    StepReport,
    is_secret_name,
)
from trainmon.training.report_fields import MAX_COMM_GROUPS, MAX_PHASES, CommGroup
from trainmon.training.sketch import StepSketch
from trainmon.training.sketch import covers as sketch_covers
from trainmon.training.sketch import increase as sketch_increase
from trainmon.training.writers import LOCAL_WRITER, ROOT_WRITER

#: Reporters remembered per rank (more than one only when processes restart or
#: several processes wrongly claim the same rank); the least recent is forgotten.
MAX_REPORTERS_PER_RANK = 8
#: Remembered reporters of a rank that keep their step sketch (the latest ones: a
#: restarted process's predecessor never reports again); an older one that does
#: adds its whole sketch again, so its run's ledger shows no step percentiles.
SKETCHED_REPORTERS = 2
#: The data-wait window keeps about this many samples per rank.
WINDOW_SLOTS = 20
#: Values of the ``reason`` label of ``trainmon_training_evicted_ranks_total``.
EVICTION_REASONS = ("ttl", "max_jobs", "max_jobs_per_writer", "max_ranks")
TRANSPORTS = ("unix", "http")
#: Runs announced ended that are remembered (each for the TTL at most).
MAX_ENDED_RUNS = 4096
#: How often ingestion also sweeps expired ranks (seconds).
EXPIRY_INTERVAL_SECONDS = 1.0
#: Bytes a run description is counted for beside its text (``description_size``): what
#: Python spends on the object and its containers, whatever their content.
DESCRIPTION_OVERHEAD_BYTES = 1024


@dataclass
class Totals:
    """Cumulative counts and seconds of one rank (or one reporter).

    The measured-communication totals are ``None`` until a report carries them
    (the rank does not measure communication: unknown, not zero); so is a process
    group in ``comm_groups`` until a report carries it.
    """

    steps: int = 0
    samples: int = 0
    step_seconds: float = 0.0
    data_wait_seconds: float = 0.0
    step_buckets: list[int] = field(default_factory=lambda: [0] * STEP_BUCKET_COUNT)
    phase_seconds: dict[str, float] = field(default_factory=dict)
    dropped_reports: int = 0
    comm_seconds: float | None = None
    comm_exposed_seconds: float | None = None
    comm_bytes: int | None = None
    checkpoints: int | None = None
    checkpoint_seconds: float | None = None
    #: Communication per process group, by name: cumulative ``collectives``, ``bytes``,
    #: ``seconds`` and ``exposed_seconds`` (None: unknown); ``seq`` and ``root`` as
    #: last sent (of a rank: None after a counter reset until sent again).
    comm_groups: dict[str, CommGroup] = field(default_factory=dict)
    #: Step durations by sketch bucket (``trainmon.training.sketch``), cumulative like
    #: ``step_buckets``; None until a report carries one (an older client).
    step_sketch: StepSketch | None = None

    @classmethod
    def of(cls, report: StepReport) -> Totals:
        return cls(
            steps=report.steps,
            samples=report.samples,
            step_seconds=report.step_seconds,
            data_wait_seconds=report.data_wait_seconds,
            step_buckets=list(report.step_buckets),
            phase_seconds=dict(report.phase_seconds),
            dropped_reports=report.dropped_reports,
            comm_seconds=report.comm_seconds,
            comm_exposed_seconds=report.comm_exposed_seconds,
            comm_bytes=report.comm_bytes,
            checkpoints=report.checkpoints,
            checkpoint_seconds=report.checkpoint_seconds,
            comm_groups=dict(report.comm_groups or {}),
            step_sketch=None if report.step_sketch is None
            else StepSketch(report.step_sketch, report.step_sketch_level or 0),
        )

    def copy(self) -> Totals:
        return replace(
            self, step_buckets=list(self.step_buckets), phase_seconds=dict(self.phase_seconds),
            comm_groups=dict(self.comm_groups),
            step_sketch=None if self.step_sketch is None else self.step_sketch.copy(),
        )

    def covers(self, earlier: Totals) -> bool:
        """True when no total is below ``earlier``'s (same reporter, no reset).

        An optional total (measured communication, checkpoints) that this
        report lacks tells nothing (the reporter stopped sending it), so it
        does not count as a reset.
        """
        return (
            self.steps >= earlier.steps
            and self.samples >= earlier.samples
            and self.step_seconds >= earlier.step_seconds
            and self.data_wait_seconds >= earlier.data_wait_seconds
            and self.dropped_reports >= earlier.dropped_reports
            and all(map(operator.ge, self.step_buckets, earlier.step_buckets))
            and all(self.phase_seconds.get(name, -1.0) >= value
                    for name, value in earlier.phase_seconds.items())
            and all(now is None or then is None or now >= then
                    for now, then in zip(self._optional(), earlier._optional(), strict=True))
            and all(_group_covers(self.comm_groups.get(name), then)
                    for name, then in earlier.comm_groups.items())
            and (self.step_sketch is None or earlier.step_sketch is None
                 or sketch_covers(self.step_sketch, earlier.step_sketch))
        )

    def add_difference(self, newer: Totals, older: Totals) -> None:
        """Add ``newer - older`` field by field (``older`` all zero for a new reporter).

        An optional total (measured communication, each process group's,
        checkpoints, the step sketch) counts from zero where ``older`` lacks it (the reporter's
        first report that carries it) and adds nothing where ``newer`` lacks it.
        """
        self.steps += newer.steps - older.steps
        self.samples += newer.samples - older.samples
        self.step_seconds += newer.step_seconds - older.step_seconds
        self.data_wait_seconds += newer.data_wait_seconds - older.data_wait_seconds
        self.dropped_reports += newer.dropped_reports - older.dropped_reports
        self.step_buckets = [
            total + now - then
            for total, now, then in zip(
                self.step_buckets, newer.step_buckets, older.step_buckets, strict=True
            )
        ]
        for name, value in newer.phase_seconds.items():
            increase = value - older.phase_seconds.get(name, 0.0)
            self.phase_seconds[name] = self.phase_seconds.get(name, 0.0) + increase
        if newer.comm_seconds is not None:
            self.comm_seconds = (self.comm_seconds or 0.0) + (
                newer.comm_seconds - (older.comm_seconds or 0.0))
        if newer.comm_exposed_seconds is not None:
            self.comm_exposed_seconds = (self.comm_exposed_seconds or 0.0) + (
                newer.comm_exposed_seconds - (older.comm_exposed_seconds or 0.0))
        if newer.comm_bytes is not None:
            self.comm_bytes = (self.comm_bytes or 0) + (
                newer.comm_bytes - (older.comm_bytes or 0))
        if newer.checkpoints is not None:
            self.checkpoints = (self.checkpoints or 0) + (
                newer.checkpoints - (older.checkpoints or 0))
        if newer.checkpoint_seconds is not None:
            self.checkpoint_seconds = (self.checkpoint_seconds or 0.0) + (
                newer.checkpoint_seconds - (older.checkpoint_seconds or 0.0))
        for name, group in newer.comm_groups.items():
            self.comm_groups[name] = _group_added(
                self.comm_groups.get(name), group, older.comm_groups.get(name))
        if newer.step_sketch is not None:
            if self.step_sketch is None:
                self.step_sketch = StepSketch()
            self.step_sketch.merge(sketch_increase(newer.step_sketch, older.step_sketch))

    def forget_group_positions(self) -> None:
        """Forget every group's ``seq`` and ``root`` (at a rank's counter reset: they
        were the previous process's), keeping the totals."""
        self.comm_groups = {name: replace(group, seq=None, root=None)
                            for name, group in self.comm_groups.items()}

    def keep_optional_of(self, older: Totals) -> None:
        """Carry ``older``'s optional totals (communication, process groups and their
        exposed seconds, checkpoints, the step sketch) over where this lacks them, so a
        reporter that skips them in one report is not counted twice when they return."""
        if self.comm_seconds is None:
            self.comm_seconds = older.comm_seconds
        if self.comm_exposed_seconds is None:
            self.comm_exposed_seconds = older.comm_exposed_seconds
        if self.comm_bytes is None:
            self.comm_bytes = older.comm_bytes
        if self.checkpoints is None:
            self.checkpoints = older.checkpoints
        if self.checkpoint_seconds is None:
            self.checkpoint_seconds = older.checkpoint_seconds
        if self.step_sketch is None:
            self.step_sketch = older.step_sketch
        for name, then in older.comm_groups.items():
            now = self.comm_groups.get(name)
            if now is None:
                self.comm_groups[name] = then
            elif now.exposed_seconds is None and then.exposed_seconds is not None:
                self.comm_groups[name] = replace(now, exposed_seconds=then.exposed_seconds)

    def _optional(self) -> tuple[float | None, ...]:
        return (self.comm_seconds, self.comm_exposed_seconds, self.comm_bytes,
                self.checkpoints, self.checkpoint_seconds)


def _group_covers(now: CommGroup | None, then: CommGroup) -> bool:
    """True when no total of the group is below ``then``'s; a group the newer report
    lacks (or an ``exposed_seconds`` it lacks) tells nothing."""
    return now is None or (
        now.collectives >= then.collectives
        and now.bytes >= then.bytes
        and now.seconds >= then.seconds
        and (now.exposed_seconds is None or then.exposed_seconds is None
             or now.exposed_seconds >= then.exposed_seconds)
    )


def _group_added(total: CommGroup | None, newer: CommGroup, older: CommGroup | None
                 ) -> CommGroup:
    """``total`` plus ``newer - older`` (``older`` None: from zero); ``exposed_seconds``
    counts from zero where ``older`` lacks it and adds nothing where ``newer`` does;
    ``seq`` and ``root`` are ``newer``'s."""
    base = total or _ZERO_GROUP
    before = older or _ZERO_GROUP
    exposed = base.exposed_seconds
    if newer.exposed_seconds is not None:
        exposed = (exposed or 0.0) + newer.exposed_seconds - (before.exposed_seconds or 0.0)
    return CommGroup(
        collectives=base.collectives + newer.collectives - before.collectives,
        bytes=base.bytes + newer.bytes - before.bytes,
        seconds=base.seconds + newer.seconds - before.seconds,
        exposed_seconds=exposed,
        seq=newer.seq,
        root=newer.root,
    )


_ZERO_GROUP = CommGroup(collectives=0, bytes=0, seconds=0.0)


@dataclass(frozen=True)
class LastCheckpoint:
    """The latest checkpoint a rank reported completing."""

    #: Unix time (seconds) the save completed, never ahead of the daemon's clock.
    time: float
    #: Seconds that save took (the mean when several completed between two reports).
    duration_seconds: float
    #: Absolute path as the training process sees it; None when it sent none.
    path: str | None


_ZERO = Totals()


@dataclass
class _Rank:
    totals: Totals
    #: Identity fields of the rank's latest report.
    gpu: str | None
    pid: int | None
    world_size: int | None
    #: Monotonic time its latest accepted report arrived (a heartbeat: sent ~1/s).
    last_seen: float
    #: The same on the steady time (``trainmon.clock``).
    last_report_at: float
    #: The sending process as the kernel names it in the daemon's pid namespace
    #: (``SCM_CREDENTIALS`` of the unix socket); None over HTTP or from outside it.
    sender_pid: int | None
    #: Steady time its latest step ended: the sender's Unix time, never after the
    #: arrival of the report that said it.
    last_step_at: float | None
    reporters: OrderedDict[str, Totals] = field(default_factory=OrderedDict)
    resets: int = 0
    #: Run id of the rank's latest report that named one.
    run: str | None = None
    #: (monotonic time, exported step seconds, exported data-wait seconds)
    window: deque[tuple[float, float, float]] = field(default_factory=deque)
    last_checkpoint: LastCheckpoint | None = None
    #: Collectives its latest report said it launched (None: not measured).
    collective_seq: int | None = None
    #: The latest stall report while the rank's steps have not moved past it.
    stall: StallReport | None = None
    #: Steady time it arrived.
    stall_received_at: float | None = None


@dataclass(frozen=True)
class RankView:
    """A consistent copy of one rank's state, for ``collect()``."""

    job: str
    rank: int
    gpu: str | None
    pid: int | None
    world_size: int | None
    #: Kernel-verified sender of the latest report (see ``_Rank.sender_pid``).
    sender_pid: int | None
    #: Monotonic totals; ``totals.comm_groups``: communication per process group.
    totals: Totals
    counter_resets: int
    #: Unix time the rank's latest step ended and its latest report arrived, as the wall
    #: clock reckons them at the snapshot: the wall clock less them is their age, also
    #: after the wall clock stepped (``trainmon.clock``).
    last_step_time: float | None
    last_report_time: float
    #: Data wait / step time over the last window; None before any step time.
    data_wait_ratio: float | None
    last_checkpoint: LastCheckpoint | None = None
    #: Run id of the rank's latest report that named one (None from old clients).
    run: str | None = None
    #: The writer identity that owns the rank's job (``trainmon.training.writers``).
    owner: str = LOCAL_WRITER
    #: Collectives its latest report said it launched (None: not measured).
    collective_seq: int | None = None
    #: Where the rank's training thread is while its steps have stopped, if it said so.
    stall: StallReport | None = None
    #: Unix time that stall report arrived.
    stall_received: float | None = None


@dataclass(frozen=True)
class DescribedRank:
    """The latest run description of one (job, rank), secrets redacted."""

    description: RunDescription
    #: Kernel-verified sender (see ``_Rank.sender_pid``), for the data paths' mounts.
    sender_pid: int | None
    #: Unix time it arrived.
    received: float
    #: The writer identity that owns the job (``trainmon.training.writers``).
    owner: str = LOCAL_WRITER


@dataclass(frozen=True)
class EndedRun:
    """A run that a description said ended, remembered for the TTL."""

    #: The writer identity that owned the job when it ended.
    owner: str
    #: rank -> how its description said the run ended (``RUN_END_REASONS``).
    said: Mapping[int, str]


@dataclass(frozen=True)
class TrainingStoreView:
    """A consistent copy of the whole store: every rank, and the intake counters
    (reports accepted per transport, rejected per reason, ranks evicted per reason)."""

    ranks: list[RankView]
    accepted: Mapping[str, int]
    rejected: Mapping[str, int]
    evicted: Mapping[str, int]
    #: Latest run description per (job, rank), for ranks that sent one.
    descriptions: Mapping[tuple[str, int], DescribedRank] = field(default_factory=dict)
    #: (job, run) -> every run a description said ended within the TTL, with its
    #: owner and each rank's word, also when the rank's next run has replaced that
    #: description since.
    ended_runs: Mapping[tuple[str, str], EndedRun] = field(default_factory=dict)


@dataclass
class _Job:
    """One job: its owner, its ranks and the run descriptions of its ranks."""

    #: The writer identity that first reported the job (``trainmon.training.writers``).
    owner: str
    ranks: OrderedDict[int, _Rank] = field(default_factory=OrderedDict)
    #: rank -> (latest description, monotonic time it arrived), least recent first.
    descriptions: OrderedDict[int, tuple[DescribedRank, float]] = field(
        default_factory=OrderedDict)
    #: run id -> the ranks and descriptions that name it (the job's distinct runs).
    runs: dict[str, int] = field(default_factory=dict)
    #: ``description_size`` of its descriptions, summed.
    description_bytes: int = 0

    def name_run(self, run: str | None, count: int) -> None:
        """Count ``count`` (+1 or -1) more ranks or descriptions naming ``run``."""
        if run is None:
            return
        left = self.runs.get(run, 0) + count
        if left > 0:
            self.runs[run] = left
        else:
            self.runs.pop(run, None)

    def drop_rank(self, rank: int) -> None:
        state = self.ranks.pop(rank)
        self.name_run(state.run, -1)

    def drop_description(self, rank: int) -> None:
        kept, _ = self.descriptions.pop(rank)
        self.name_run(kept.description.run, -1)
        self.description_bytes -= description_size(kept.description)


class TrainingStore:
    """Thread-safe state of every reporting rank; fed by the receivers, read by collect().

    Jobs belong to writers (``trainmon.training.writers``): the identity of a
    job's first report or description owns it until the job expires. Reports
    and descriptions of another identity for it are refused (``forbidden``)
    unless that identity is trusted (``local``, ``uid:0``, ``trusted_writers``).
    Reports and descriptions count against the same caps: at most ``max_jobs``
    jobs, ``max_jobs_per_writer`` of them per untrusted writer (its least
    recently updated job makes room for its next one) and ``max_ranks_per_job`` ranks
    (and descriptions) per job. A new job never evicts another writer's live
    job: at ``max_jobs``, a writer with no job of its own to replace is refused
    (``limit``) until a job expires.
    """

    def __init__(
        self,
        *,
        ttl_seconds: float = 300.0,
        max_jobs: int = 64,
        max_ranks_per_job: int = 1024,
        max_jobs_per_writer: int = 16,
        max_ranks_per_writer: int = 256,
        max_runs_per_writer: int = 32,
        max_description_bytes_per_writer: int = 1 << 20,
        trusted_writers: Iterable[str] = (),
        window_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._lock = threading.Lock()
        self._window = window_seconds
        self._clock = clock
        self._wall_clock = wall_clock
        #: The wall clock's steps (read under the lock: ``_now``).
        self._wall_steps = WallSteps(clock(), wall_clock())
        self._set_limits(ttl_seconds, max_jobs, max_ranks_per_job, max_jobs_per_writer,
                         max_ranks_per_writer, max_runs_per_writer,
                         max_description_bytes_per_writer, trusted_writers)
        self._jobs: OrderedDict[str, _Job] = OrderedDict()
        self._accepted = dict.fromkeys(TRANSPORTS, 0)
        self._rejected = dict.fromkeys(REJECT_REASONS, 0)
        self._evicted = dict.fromkeys(EVICTION_REASONS, 0)
        self._next_expiry = float("-inf")
        # (job, run) -> (owner, monotonic time) of runs announced ended, least recent first.
        self._ended: OrderedDict[tuple[str, str], tuple[EndedRun, float]] = OrderedDict()

    def reconfigure(
        self,
        *,
        ttl_seconds: float,
        max_jobs: int,
        max_ranks_per_job: int,
        max_jobs_per_writer: int,
        max_ranks_per_writer: int,
        max_runs_per_writer: int,
        max_description_bytes_per_writer: int,
        trusted_writers: Iterable[str],
    ) -> None:
        """New limits, TTL and trusted writers from now on (a configuration reload):
        what is held stays; a lowered cap refuses what would go past it (and a job
        over it keeps what it has until its ranks expire or leave), a shorter TTL
        expires what is older than it at the next report or read."""
        with self._lock:
            self._set_limits(ttl_seconds, max_jobs, max_ranks_per_job, max_jobs_per_writer,
                             max_ranks_per_writer, max_runs_per_writer,
                             max_description_bytes_per_writer, trusted_writers)
            self._next_expiry = float("-inf")

    def _set_limits(self, ttl_seconds: float, max_jobs: int, max_ranks_per_job: int,
                    max_jobs_per_writer: int, max_ranks_per_writer: int,
                    max_runs_per_writer: int, max_description_bytes_per_writer: int,
                    trusted_writers: Iterable[str]) -> None:
        self._ttl = ttl_seconds
        self._max_jobs = max_jobs
        self._max_ranks = max_ranks_per_job
        self._max_jobs_per_writer = min(max_jobs_per_writer, max_jobs)
        self._max_ranks_per_writer = max_ranks_per_writer
        self._max_runs_per_writer = max_runs_per_writer
        self._max_description_bytes = max_description_bytes_per_writer
        self._trusted = frozenset({LOCAL_WRITER, ROOT_WRITER, *trusted_writers})

    def describe(
        self,
        description: RunDescription,
        transport: str,
        sender_pid: int | None = None,
        identity: str = LOCAL_WRITER,
    ) -> None:
        """Keep ``description`` as its (job, rank)'s latest, secrets redacted again;
        raises ``ReportError`` (``forbidden``, ``limit``) like ``ingest``."""
        redacted = redact(description)
        received = self._wall_clock()
        with self._lock:
            now, _ = self._now()
            self._maybe_expire(now)
            job = self._admit(description.job, identity)
            previous = job.descriptions.get(description.rank)
            if identity not in self._trusted:
                self._within_budget(job, description.job, identity, description=description,
                                    replaced=None if previous is None else previous[0])
            kept = DescribedRank(redacted, sender_pid, received, owner=job.owner)
            if previous is not None:
                job.drop_description(description.rank)
            job.descriptions[description.rank] = (kept, now)
            job.name_run(description.run, 1)
            job.description_bytes += description_size(description)
            while len(job.descriptions) > self._max_ranks:
                job.drop_description(next(iter(job.descriptions)))
            if description.ended is not None:
                # Remembered beyond the description itself: a rank's next run may
                # replace it before the ledger's recorder has read it.
                key = (description.job, description.run)
                known = self._ended.pop(key, None)
                said = dict(known[0].said) if known and known[0].owner == job.owner else {}
                said[description.rank] = description.ended
                self._ended[key] = (EndedRun(job.owner, said), now)
                while len(self._ended) > MAX_ENDED_RUNS:
                    self._ended.popitem(last=False)
            self._jobs.move_to_end(description.job)
            self._accepted[transport] += 1

    def stalled(
        self,
        stall: StallReport,
        transport: str,
        identity: str = LOCAL_WRITER,
    ) -> None:
        """Keep ``stall`` as its rank's latest stall; raises ``ReportError``
        (``forbidden`` like ``ingest``; ``invalid_field`` for a rank that has not
        reported, or a stall of a reporter other than the rank's latest)."""
        with self._lock:
            now, steady = self._now()
            self._maybe_expire(now)
            job = self._jobs.get(stall.job)
            if job is not None and identity != job.owner and identity not in self._trusted:
                raise ReportError("forbidden", f"job {stall.job!r} belongs to another writer")
            state = None if job is None else job.ranks.get(stall.rank)
            latest = None if state is None else next(reversed(state.reporters), None)
            if state is None or latest != stall.reporter_id:
                raise ReportError("invalid_field",
                                  "a stall must come from the rank's reporting reporter")
            reported = state.reporters[latest]
            if reported.steps > stall.steps:
                return  # its steps moved on since: the stall is over
            if stall.steps > reported.steps:
                # a rank cannot be stalled after steps it never reported: its next step
                # report would never pass such a claim, and the stall would never clear
                stall = replace(stall, steps=reported.steps)
            state.stall, state.stall_received_at = stall, steady
            self._accepted[transport] += 1

    def reject(self, reason: str, count: int = 1) -> None:
        """Count ``count`` rejected reports (``reason`` from ``REJECT_REASONS``)."""
        self.reject_counts({reason: count})

    def reject_counts(self, counts: Mapping[str, int]) -> None:
        """Count rejected reports by reason, all at once (one lock round trip)."""
        with self._lock:
            for reason, count in counts.items():
                self._rejected[reason] += count

    def ingest(
        self,
        report: StepReport,
        transport: str,
        sender_pid: int | None = None,
        identity: str = LOCAL_WRITER,
    ) -> None:
        """Apply one valid report from writer ``identity``.

        Raises ``ReportError``: ``forbidden`` when another writer owns the job,
        ``limit`` past the phase cap or when the job cap leaves no room.
        ``sender_pid``: the process that sent it, as the kernel names it in the
        daemon's pid namespace (unix socket credentials), when known.
        """
        with self._lock:
            now, steady = self._now()
            self._maybe_expire(now)
            job = self._admit(report.job, identity)
            state = job.ranks.get(report.rank)
            if identity not in self._trusted:
                self._within_budget(job, report.job, identity, report=report, rank=state)
            if state is None:
                self._add_rank(job, report, now, steady, sender_pid)
            else:
                if report.run is not None and report.run != state.run:
                    job.name_run(state.run, -1)
                    job.name_run(report.run, 1)
                self._update_rank(state, report, now, steady, sender_pid)
                job.ranks.move_to_end(report.rank)
            self._jobs.move_to_end(report.job)
            self._accepted[transport] += 1

    def snapshot(self) -> TrainingStoreView:
        with self._lock:
            now, _ = self._now()
            self._expire(now)
            unix = self._wall_steps.unix
            views = [
                RankView(
                    job=name,
                    rank=rank,
                    gpu=state.gpu,
                    pid=state.pid,
                    world_size=state.world_size,
                    sender_pid=state.sender_pid,
                    totals=state.totals.copy(),
                    counter_resets=state.resets,
                    last_step_time=None if state.last_step_at is None
                    else unix(state.last_step_at),
                    last_report_time=unix(state.last_report_at),
                    data_wait_ratio=self._ratio(state),
                    last_checkpoint=state.last_checkpoint,
                    run=state.run,
                    owner=job.owner,
                    collective_seq=state.collective_seq,
                    stall=state.stall,
                    stall_received=None if state.stall_received_at is None
                    else unix(state.stall_received_at),
                )
                for name, job in self._jobs.items()
                for rank, state in job.ranks.items()
            ]
            descriptions = {
                (name, rank): kept
                for name, job in self._jobs.items()
                for rank, (kept, _) in job.descriptions.items()
            }
            return TrainingStoreView(
                views, dict(self._accepted), dict(self._rejected), dict(self._evicted),
                descriptions, {key: ended for key, (ended, _) in self._ended.items()},
            )

    def job_ranks(self, name: str) -> tuple[str, tuple[int, ...]] | None:
        """Job ``name``'s owner and the ranks that report it now; None when it does not."""
        with self._lock:
            now, _ = self._now()
            self._maybe_expire(now)
            job = self._jobs.get(name)
            return None if job is None else (job.owner, tuple(job.ranks))

    @property
    def trusted_writers(self) -> frozenset[str]:
        """The writers that may report for any job (docs/security.md)."""
        return frozenset(self._trusted)

    def counts(self) -> dict[str, int]:
        """Jobs and ranks held now (for ``/healthz``)."""
        with self._lock:
            return {
                "jobs": len(self._jobs),
                "ranks": sum(len(job.ranks) for job in self._jobs.values()),
            }

    # -- under the lock ---------------------------------------------------------

    def _now(self) -> tuple[float, float]:
        """The monotonic time and the steady time (``trainmon.clock``)."""
        now = self._clock()
        return now, self._wall_steps.observe(now, self._wall_clock())

    def _admit(self, name: str, identity: str) -> _Job:
        """The job ``name`` for a report of ``identity``, created if new; raises
        ``ReportError`` when another writer owns it or no cap leaves room."""
        job = self._jobs.get(name)
        if job is not None:
            if identity != job.owner and identity not in self._trusted:
                raise ReportError("forbidden", f"job {name!r} belongs to another writer")
            return job
        # _jobs is in least-recently-updated order: the first one is replaced first.
        own = [other for other, held in self._jobs.items() if held.owner == identity]
        full = len(self._jobs) >= self._max_jobs
        capped = identity not in self._trusted and len(own) >= self._max_jobs_per_writer
        if full or capped:
            if not own:
                raise ReportError(
                    "limit", f"{len(self._jobs)} jobs of other writers report already "
                    f"(collectors.training.max_jobs {self._max_jobs})")
            self._evict(own[0], "max_jobs" if full else "max_jobs_per_writer")
        job = self._jobs[name] = _Job(owner=identity)
        return job

    def _evict(self, name: str, reason: str) -> None:
        job = self._jobs.pop(name)
        self._evicted[reason] += len(job.ranks)

    def _within_budget(
        self,
        job: _Job,
        name: str,
        identity: str,
        *,
        report: StepReport | None = None,
        rank: _Rank | None = None,
        description: RunDescription | None = None,
        replaced: DescribedRank | None = None,
    ) -> None:
        """Raise ``ReportError`` (``limit``) when ``report`` (of the existing ``rank``, or
        a new rank when None) or ``description`` (replacing ``replaced``) would take
        ``identity`` past one of its writer budgets: ranks, distinct runs, description
        bytes (docs/security.md); a job ``_admit`` made for it alone goes again. Linear
        in the writer's jobs, at most ``max_jobs_per_writer``."""
        try:
            self._check_budget(job, identity, report, rank, description, replaced)
        except ReportError:
            if not job.ranks and not job.descriptions:
                del self._jobs[name]
            raise

    def _check_budget(
        self,
        job: _Job,
        identity: str,
        report: StepReport | None,
        rank: _Rank | None,
        description: RunDescription | None,
        replaced: DescribedRank | None,
    ) -> None:
        own = [held for held in self._jobs.values() if held.owner == identity]
        run = report.run if report is not None else description.run if description else None
        if report is not None and rank is None:
            ranks = sum(len(held.ranks) for held in own)
            if ranks >= self._max_ranks_per_writer:
                raise ReportError("limit", f"{identity} reports {ranks} ranks already "
                                  f"(collectors.training.max_ranks_per_writer)")
        if run is not None and run not in job.runs:
            runs = sum(len(held.runs) for held in own)
            leaving = rank.run if rank is not None else \
                replaced.description.run if replaced is not None else None
            if leaving is not None and job.runs.get(leaving) == 1:
                runs -= 1  # the run it names now is named by nothing else
            if runs >= self._max_runs_per_writer:
                raise ReportError("limit", f"{identity} has {runs} runs already "
                                  f"(collectors.training.max_runs_per_writer)")
        if description is not None:
            held_bytes = sum(held.description_bytes for held in own)
            if replaced is not None:
                held_bytes -= description_size(replaced.description)
            size = description_size(description)
            if held_bytes + size > self._max_description_bytes:
                raise ReportError(
                    "limit", f"{identity}'s run descriptions would hold {held_bytes + size} "
                    "bytes (collectors.training.max_description_bytes_per_writer)")

    def _add_rank(
        self, job: _Job, report: StepReport, now: float, steady: float, sender_pid: int | None
    ) -> None:
        ranks = job.ranks
        if len(ranks) >= self._max_ranks:
            job.drop_rank(next(iter(ranks)))
            self._evicted["max_ranks"] += 1
        totals = Totals.of(report)
        state = _Rank(
            totals=totals,
            gpu=report.gpu,
            pid=report.pid,
            world_size=report.world_size,
            last_seen=now,
            last_report_at=steady,
            sender_pid=sender_pid,
            last_step_at=self._step_at(report, None, steady),
            last_checkpoint=self._checkpoint(report, _ZERO, None),
            run=report.run,
            collective_seq=report.collective_seq,
        )
        state.reporters[report.reporter_id] = Totals.of(report)
        # The reporter started from zero about step_seconds ago: seed the window
        # with that, so the first ratio covers its whole run.
        state.window.append((now - report.step_seconds, 0.0, 0.0))
        state.window.append((now, totals.step_seconds, totals.data_wait_seconds))
        ranks[report.rank] = state
        job.name_run(report.run, 1)

    def _update_rank(
        self, state: _Rank, report: StepReport, now: float, steady: float,
        sender_pid: int | None,
    ) -> None:
        new = Totals.of(report)
        previous = state.reporters.get(report.reporter_id)
        if previous is not None and not new.covers(previous):
            previous = None  # the same reporter id went backwards: a restart
        merged_phases = set(state.totals.phase_seconds) | set(new.phase_seconds)
        if len(merged_phases) > MAX_PHASES:
            raise ReportError("limit", f"more than {MAX_PHASES} phases for one rank")
        if len(state.totals.comm_groups.keys() | new.comm_groups.keys()) > MAX_COMM_GROUPS:
            raise ReportError("limit", f"more than {MAX_COMM_GROUPS} comm_groups for one rank")
        if previous is None:
            state.resets += 1
            state.totals.forget_group_positions()
        state.totals.add_difference(new, previous or _ZERO)
        state.last_checkpoint = self._checkpoint(report, previous or _ZERO, state.last_checkpoint)
        if previous is not None:
            new.keep_optional_of(previous)
        state.reporters[report.reporter_id] = new
        state.reporters.move_to_end(report.reporter_id)
        while len(state.reporters) > MAX_REPORTERS_PER_RANK:
            state.reporters.popitem(last=False)
        if len(state.reporters) > SKETCHED_REPORTERS:
            # the reporter just left behind gives up its sketch (memory: see the top)
            list(state.reporters.values())[-SKETCHED_REPORTERS - 1].step_sketch = None
        steps_advanced = previous is None or new.steps > previous.steps
        stall = state.stall
        if stall is not None and (stall.reporter_id != report.reporter_id
                                  or new.steps > stall.steps):
            state.stall = state.stall_received_at = None  # it steps again, or restarted
        if steps_advanced and new.steps > 0:
            state.last_step_at = self._step_at(report, state.last_step_at, steady)
        state.gpu, state.pid, state.world_size = report.gpu, report.pid, report.world_size
        state.collective_seq = report.collective_seq
        if report.run is not None:
            state.run = report.run
        state.sender_pid = sender_pid
        state.last_seen, state.last_report_at = now, steady
        self._record_window(state, now)

    def _record_window(self, state: _Rank, now: float) -> None:
        sample = (now, state.totals.step_seconds, state.totals.data_wait_seconds)
        window = state.window
        if len(window) >= 2 and now - window[-2][0] < self._window / WINDOW_SLOTS:
            window[-1] = sample
        else:
            window.append(sample)
        while len(window) >= 2 and window[1][0] <= now - self._window:
            window.popleft()

    @staticmethod
    def _ratio(state: _Rank) -> float | None:
        _, anchor_step, anchor_wait = state.window[0]
        step = state.totals.step_seconds - anchor_step
        if step <= 0:
            return None
        wait = state.totals.data_wait_seconds - anchor_wait
        return min(1.0, max(0.0, wait / step))

    def _checkpoint(
        self, report: StepReport, older: Totals, kept: LastCheckpoint | None
    ) -> LastCheckpoint | None:
        """The rank's last checkpoint after ``report``: new where it advanced the
        count over ``older`` (the same reporter's previous totals), else ``kept``."""
        if report.checkpoints is None:
            return kept
        advanced = report.checkpoints - (older.checkpoints or 0)
        if advanced <= 0:
            return kept
        seconds = (report.checkpoint_seconds or 0.0) - (older.checkpoint_seconds or 0.0)
        wall_now = self._wall_clock()
        sent = report.last_checkpoint_time
        return LastCheckpoint(
            time=wall_now if sent is None else min(sent, wall_now),
            duration_seconds=max(0.0, seconds) / advanced,
            path=report.checkpoint_path,
        )

    def _step_at(self, report: StepReport, previous: float | None, steady: float
                 ) -> float | None:
        """The sender's last-step time on the steady time, never after ``steady`` (the
        report's arrival): the sender reads it on its wall clock when it sends the
        report (docs/protocol.md), the daemon's clock when both run on one host."""
        if report.steps == 0:
            return previous
        sent = report.last_step_time
        return steady if sent is None else min(self._wall_steps.steady(sent), steady)

    def _maybe_expire(self, now: float) -> None:
        if now >= self._next_expiry:
            self._expire(now)
            self._next_expiry = now + EXPIRY_INTERVAL_SECONDS

    def _expire(self, now: float) -> None:
        deadline = now - self._ttl
        for name in list(self._jobs):
            job = self._jobs[name]
            for rank in [rank for rank, state in job.ranks.items() if state.last_seen < deadline]:
                job.drop_rank(rank)
                self._evicted["ttl"] += 1
            for rank in [rank for rank, (_, seen) in job.descriptions.items()
                         if seen < deadline]:
                job.drop_description(rank)
            if not job.ranks and not job.descriptions:
                del self._jobs[name]
        while self._ended and next(iter(self._ended.values()))[1] < deadline:
            self._ended.popitem(last=False)


def description_size(description: RunDescription) -> int:
    """About the bytes ``description`` holds: its keys and values, its paths, plus
    ``DESCRIPTION_OVERHEAD_BYTES``. Bounded by the protocol's caps; cheap (no encoding)."""
    size = DESCRIPTION_OVERHEAD_BYTES + len(description.job) + len(description.run)
    for section in (description.config, description.environment, description.framework,
                    description.versions):
        for key, value in section.items():
            size += len(key) + len(str(value))
    return size + sum(len(path) for path in description.data_paths)


def redact(description: RunDescription) -> RunDescription:
    """``description`` with every value under a secret-looking name replaced by ``REDACTED``."""
    return replace(
        description,
        config={key: REDACTED if is_secret_name(key) else value
                for key, value in description.config.items()},
        environment={name: REDACTED if is_secret_name(name) else value
                     for name, value in description.environment.items()},
        framework={key: REDACTED if is_secret_name(key) else value
                   for key, value in description.framework.items()},
    )
