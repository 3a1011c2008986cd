"""The run recorder: every training run on this node, measured and kept in the ledger.

``RunRecorder`` reads the training store through a read-only interface
(``trainmon.ledger.feed``: a ``TrainingSource`` for counters and
descriptions, a ``StorageResolver`` for the storage of the paths the runs
name) and the verdicts the daemon's evaluations hand it
(``count_verdicts``). The ledger collector (``trainmon.collectors.ledger``)
wires it and exports what ``readings()`` and ``health()`` say.

Three paths:

- the **recorder thread** ("ledger-recorder") wakes every
  ``flush_seconds``: one *tick* reads a store snapshot, adds each rank's
  progress since the previous tick to its run (``trainmon.ledger.summary``
  has the math), decides end reasons (``trainmon.ledger.ending``), and writes
  every changed record in one transaction. Runs are recorded whether or not
  anyone scrapes; the scrape path never touches the file.
- **evaluations** (``count_verdicts()``, from the collector's ``observe()``,
  called by the daemon's evaluation loop after the diagnosis, and by
  scrapes): the time each job spent under its current verdict since the
  previous evaluation that said the same (``verdict_gap``: capped), for the
  runs the last tick left running, and the latest verdict
  (``final_verdict``). It takes only a small lock of its own, never the
  recorder's (which a slow write may hold), and the next tick adds what it
  counted to the runs: verdicts are recorded on a node that nothing scrapes.
- **fail-slow** (``count_fail_slow()``, from the same ``observe()``): the
  fail-slow changes each evaluation names per (job, owner), each counted toward
  the running runs of that job *and owner* only: a change named by consecutive
  evaluations (same rank and part) is one change, its time the gaps between them
  (``verdict_gap``), its start the first one named. Under the same small lock;
  the next tick adds them to the runs' ``fail_slow`` (``RunTotals.note_fail_slow``).
- **profiles** (``note_profile()``, from the profile service's worker,
  ``trainmon.profiling``): a rank's profile of a few steps, for its run of its job
  whose owner is the profile's; under the same small lock, the next tick adds it to
  the run's ``profiles`` (``RunTotals.note_profile``), if the run is still in memory.
- **scrapes** (``readings()``, ``health()``): the runs' changes, the latest
  ends and the ledger's counters; they count no verdict time.

Finished, crashed, preempted and lost runs are closed;
``readings().ends`` holds each of them (and each stalled run) for
``RUN_END_EXPORT_SECONDS`` after its end, at most ``MAX_EXPORTED_RUN_ENDS``
of the latest.

Facts kept to the end: a data path or checkpoint path is resolved to its
storage (the ``StorageResolver``) while its reporter lives and not again once
known, so the record of an ended run still says where its data and its last
checkpoint lived (the reporter's mount namespace is gone by then); the last
verdict, the throughput and the checkpoint count stay in the summary.

The file: opened (created when missing) at start; a missing directory, a
read-only filesystem, or a file that is not a trainmon ledger (never
modified: ``trainmon.ledger.schema``) is reported in ``health()`` and
``readings().up`` (the collector's ``trainmon_ledger_up`` 0, ``/healthz``
state ``degraded``, with the error, also while the last write failed), logged
(rate-limited), and tried again every ``REOPEN_SECONDS`` (a full or read-only
disk: every ``flush_seconds``, at least ``DISK_REOPEN_SECONDS``); recording goes on
in memory meanwhile. A flush whose records cannot reach the file (a failed write,
or the file not open) counts in ``readings().write_errors`` by reason; the runs
still going on are written whole by the next flush that succeeds, and the last
record of each run that ended meanwhile waits in ``_unwritten`` (at most
``MAX_UNWRITTEN``) for it. One daemon records into a file: the recorder takes the
file's writer lock (``trainmon.ledger.files``, ``<ledger>.lock``) before it
opens it and gives it back when it closes it; while another daemon holds it,
the file counts as unusable as above, the holder named. A daemon restarted during
a run resumes its record (rates, verdicts, start, the last checkpoint and the data
paths' storage from the stored state; counts again from the reporters' cumulative
totals). The runs the file holds as going on when it is opened wait for a reporter
until ``RESUME_GRACE_SECONDS`` (``stall_seconds`` if shorter) have passed; the
others, whose reporters vanished while the daemon was down, are then closed
``lost`` at their last report (``RecordedRun.lost_while_away``).

Boundaries and rates: ``trainmon.ledger.ending`` (start, end) and
``trainmon.ledger.summary`` (samples/s and its windows); each tick adds each
rank's steps since the previous one, spanning its last step time less their step
seconds to its last step time, to its run (``RecordedRun.add_steps``). Samples
count once per data-parallel replica: the ranks of one tensor, pipeline or context
parallel group (``SAMPLE_SHARING_GROUPS``) train on the same samples, and each counts
them as it sees its batch; only the group's lowest rank (its ``root`` in the rank's
``comm_groups``) adds them to the run (``shares_samples``). A rank that names no such
group with its root (not instrumented, an older client, a group known by another name)
counts its own.

Owners: each run is recorded with the writer identity that owns its job in
the training store (``ReportingRank.owner``, ``DescribingRank.owner``). A run
whose (job, run, node) row belongs to another non-empty owner is neither
resumed nor overwritten: it is *refused* (counted in ``refused_runs``,
logged rate-limited), so whoever re-uses another user's job name and run id
after that job expired cannot rewrite the old record. Reports and
descriptions of another owner than the one a run in memory started with are
left out of that run. A crashed run's steps are redone (``lost_progress``)
only by its own owner's next run of the job, and a job's GPU-seconds, goodput
window and team are its current owner's: another owner's first booking of
the name starts them again (``readings().owners``, the ``owner`` label).

Retention runs every ``PRUNE_SECONDS`` (``Ledger.prune``: age, then
``max_runs_per_owner``, then ``max_runs`` from the largest owners first),
counted per rule in ``readings().pruned``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from trainmon.background import BackgroundThread
from trainmon.clock import WallSteps
from trainmon.contract import PIPELINE_GROUP
from trainmon.ledger.config import LedgerConfig
from trainmon.ledger.ending import (
    MAX_STARTUP_LOOKBACK_SECONDS,
    RecordedRun,
    SnapshotIndex,
    decide_end,
)
from trainmon.ledger.feed import (
    DescribingRank,
    ReportingRank,
    StepTotals,
    StorageResolver,
    TrainingSnapshot,
    TrainingSource,
)
from trainmon.ledger.files import WriterLock
from trainmon.ledger.goodput import RankBooking, RankTotals, empty_buckets, goodput_ratio
from trainmon.ledger.holding import GpuHoldings, owner_team
from trainmon.ledger.records import FINAL_END_REASONS, RunRecord
from trainmon.ledger.schema import LedgerError, take_writer_lock
from trainmon.ledger.store import Ledger, RecordUpdate, WriteResult
from trainmon.ledger.summary import (
    MAX_RECORDED_PROFILES,
    FailSlowChange,
    Progress,
    RunTotals,
    verdict_gap,
)
from trainmon.logthrottle import LogThrottle
from trainmon.paths import make_state_directory
from trainmon.training.sketch import increase as sketch_increase
from trainmon.training.stalls import SILENT_SECONDS, frame_text
from trainmon.training.writers import LOCAL_WRITER, uid_writer

log = logging.getLogger(__name__)

#: The furthest before the report that carried them that new steps are taken to have
#: ended (the client reports every second by default; a sender's clock far behind, or a
#: made-up ``last_step_time``, would otherwise stretch its run's start and stall it).
MAX_STEP_REPORT_LAG_SECONDS = 60.0
#: Seconds between two attempts to open an unusable ledger.
REOPEN_SECONDS = 30.0
#: Seconds between two attempts to open a ledger whose filesystem was full or read-only
#: (``flush_seconds`` when longer): space or a remount returns by itself, and finding
#: the disk still full or read-only costs a few system calls.
DISK_REOPEN_SECONDS = 1.0
#: ``LedgerError.reason`` of the open failures tried again after ``DISK_REOPEN_SECONDS``.
DISK_REASONS = ("disk_full", "read_only")
#: Process groups (``comm_groups`` names) whose ranks train on the same samples:
#: tensor, pipeline and context parallel. The group's lowest rank counts them.
SAMPLE_SHARING_GROUPS = ("tp", PIPELINE_GROUP, "cp")
#: Seconds between two retention passes.
PRUNE_SECONDS = 3600.0
#: Seconds between two reclaims of the space deleted rows left (``Ledger.reclaim``).
RECLAIM_SECONDS = 300.0
#: Seconds after which a run's record is written again although only the clock moved
#: (its duration and ``updated``; a changed record is written at the next tick).
REWRITE_SECONDS = 60.0
#: Ended runs remembered so that a lingering description does not reopen them.
MAX_CLOSED = 4096
#: Records of ended runs kept in memory while the file cannot be written (full or
#: read-only disk), to be written once it can; beyond, the oldest are dropped (logged).
MAX_UNWRITTEN = 4096
#: Seconds after the ledger was opened by which a reporter must have continued a run
#: the file holds as going on, else it is closed ``lost`` (``stall_seconds`` when
#: shorter): a job that goes on reports within its client's interval (1 s by default).
RESUME_GRACE_SECONDS = 120.0
#: Runs held as going on that one opening of the ledger closes at most (the next
#: opening closes the rest).
MAX_LOST_WHILE_AWAY = 4096
#: ``reason`` of ``trainmon_ledger_write_errors_total`` (``LedgerError.reason``).
WRITE_ERROR_REASONS = ("disk_full", "read_only", "io_error", "busy", "corrupt", "other")
#: ``reason`` of ``trainmon_ledger_pruned_runs_total`` (the rules of ``Ledger.prune``).
PRUNE_REASONS = ("age", "owner_limit", "max_runs")
#: Seconds after its end that a run's ``trainmon_training_run_end_timestamp_seconds``
#: is exported (long enough for Prometheus to keep it, short enough to stay few).
RUN_END_EXPORT_SECONDS = 3600.0
#: Most series of ``trainmon_training_run_end_timestamp_seconds`` at once (the latest ends).
MAX_EXPORTED_RUN_ENDS = 16
#: Runs with profiles waiting for the next tick (the most recently noted).
MAX_PENDING_PROFILE_RUNS = 64
#: A path's storage when it could not be told.
UNKNOWN = "unknown"
#: Jobs whose GPU-seconds are exported at once (the latest booked kept).
MAX_GOODPUT_JOBS = 64
#: Seconds over which ``trainmon_job_goodput_ratio`` is taken.
GOODPUT_WINDOW_SECONDS = 600.0
#: End reasons after which the job's next run redoes the steps since the last checkpoint.
LOSING_END_REASONS = ("crashed", "preempted")
#: Seconds after such an end within which a new run of the job counts as its restart.
REDO_HORIZON_SECONDS = 3600.0
#: Jobs known only by GPUs their processes hold (no rank reports) that one user may
#: have booked ``idle_allocated`` at once (more are not booked: docs/security.md).
MAX_IDLE_JOBS_PER_USER = 4
#: The longest gap between two ticks booked as ``idle_allocated`` (a daemon that was
#: stopped or suspended does not know what the GPUs did meanwhile).
MAX_IDLE_GAP_SECONDS = 60.0


@dataclass
class _Redo:
    """What a crashed or preempted run left for its owner's next run of the job to redo
    (another owner's run of the same job name redoes nothing of it)."""

    ended: float
    crashed: tuple[str, str]
    #: The writer identity of the crashed run (``trainmon.training.writers``).
    owner: str
    #: rank -> its steps after its latest checkpoint.
    steps: dict[int, int]
    #: The run that redoes them, once one started.
    restarted: tuple[str, str] | None = None

    def steps_of(self, rank: int) -> int:
        """The steps rank ``rank`` redoes (a rank the crashed run lacked: the most any did)."""
        return self.steps.get(rank, max(self.steps.values(), default=0))


@dataclass(frozen=True)
class RunEnd:
    """A run that ended (or stalled) lately: its reason and Unix end time."""

    job: str
    run: str
    reason: str
    ended: float
    #: The run's goodput on this node, once it is closed (None: a stalled run, or none
    #: booked).
    goodput: float | None = None
    #: The writer identity that owned the run ("" when not known).
    owner: str = ""


@dataclass(frozen=True)
class RecorderReadings:
    """What the recorder exports, read at one instant (``RunRecorder.readings``)."""

    #: (job, owner, run, changed) of every run in memory that knows what changed, by
    #: (job, run).
    changes: tuple[tuple[str, str, str, str], ...]
    #: The latest ends within ``RUN_END_EXPORT_SECONDS``, by (job, run).
    ends: tuple[RunEnd, ...]
    #: The file is open and its last write succeeded.
    up: bool
    writes: int
    write_errors: Mapping[str, int]
    refused_runs: int
    pruned: Mapping[str, int]
    #: Records in the file; None until it was counted once.
    stored_runs: int | None
    #: job -> GPU-seconds per bucket (``trainmon.ledger.goodput.BUCKETS``) booked for its
    #: ranks on this node since the daemon started.
    gpu_seconds: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    #: job -> productive over all booked GPU-seconds in the last ``GOODPUT_WINDOW_SECONDS``.
    goodput: Mapping[str, float] = field(default_factory=dict)
    #: Jobs whose GPU-seconds were dropped to keep ``MAX_GOODPUT_JOBS``.
    goodput_evicted_jobs: int = 0
    #: Records of ended runs waiting in memory for a ledger that cannot be written.
    unwritten_runs: int = 0
    #: Such records dropped to keep ``MAX_UNWRITTEN``.
    dropped_unwritten_runs: int = 0
    #: job -> its team (``trainmon.ledger.holding``), for the jobs of ``gpu_seconds``.
    teams: Mapping[str, str] = field(default_factory=dict)
    #: job -> the writer identity its GPU-seconds, goodput and team are booked for, for
    #: the jobs of ``gpu_seconds`` (a job name that changes owner starts them again).
    owners: Mapping[str, str] = field(default_factory=dict)
    #: GPU-seconds of processes not booked to the job they name: another user's job.
    refused_idle_seconds: float = 0.0
    #: job -> the tensor pipes' active share while productive, where GPM tells
    #: (``RunRecorder.observe_tensor_activity``).
    productive_tensor_active: Mapping[str, float] = field(default_factory=dict)


class RunRecorder:
    """Records runs from the training store into the ledger at ``config.file``."""

    def __init__(
        self,
        config: LedgerConfig,
        training: TrainingSource,
        storage_of: StorageResolver,
        *,
        holdings: GpuHoldings | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        #: The ``collectors.ledger`` section it records by.
        self.config = config
        self._training = training
        self._storage_of = storage_of
        self._holdings = holdings
        self._clock = clock
        self._wall_clock = wall_clock
        #: The wall clock's steps (read under ``_lock``): every time the recorder holds
        #: is on their steady time (module docstring).
        self._wall_steps = WallSteps(clock(), wall_clock())
        self._node = config.node_name
        self._lock = threading.Lock()
        #: Held for a whole tick, the file's write included (``_lock`` is not).
        self._tick_lock = threading.Lock()
        self._thread = BackgroundThread("ledger-recorder", self._loop)
        self._errors = LogThrottle(clock=clock)
        self._ledger: Ledger | None = None
        #: The ledger's writer lock, held from before the file is opened until it is
        #: closed (one recording daemon per file).
        self._writer: WriterLock | None = None
        #: (job, run) -> owner of the runs the file held as going on when it was opened,
        #: until a reporter continues them or they are closed ``lost`` (monotonic time
        #: ``_away_due``).
        self._away: dict[tuple[str, str], str] = {}
        self._away_due = float("inf")
        self._error: str | None = None
        #: Why the file could not be opened last (None once it is open).
        self._open_error: LedgerError | None = None
        #: (job, run) -> the latest record not yet written of a run no longer in
        #: ``_runs`` (ended while the file could not be written), oldest first.
        self._unwritten: OrderedDict[tuple[str, str], RecordUpdate] = OrderedDict()
        self._dropped_unwritten = 0
        self._next_open = float("-inf")
        self._next_prune = float("-inf")
        #: Rows were deleted since the last ``Ledger.reclaim``; the next one not before.
        self._reclaim_due = False
        self._next_reclaim = float("-inf")
        self._runs: dict[tuple[str, str], RecordedRun] = {}
        self._closed: OrderedDict[tuple[str, str], None] = OrderedDict()
        #: (job, run, owner) refused: the row belongs to another owner.
        self._refused: OrderedDict[tuple[str, str, str], None] = OrderedDict()
        self._refused_runs = 0
        self._pruned = dict.fromkeys(PRUNE_REASONS, 0)
        self._seen: dict[tuple[str, int], tuple[str, StepTotals]] = {}
        #: (job, run) -> (reason, Unix end time) of the runs closed lately, oldest first.
        #: (job, run) -> (reason, Unix end time, the run's goodput) of the runs closed
        #: lately, oldest first.
        self._recent_ends: OrderedDict[tuple[str, str], tuple[str, float, float | None]] = \
            OrderedDict()
        # Evaluations (count_verdicts) touch only these, under their own lock.
        self._verdict_lock = threading.Lock()
        #: job -> (verdict kind, monotonic time of the evaluation that said it first).
        self._verdicts: dict[str, tuple[str, float]] = {}
        #: job -> its runs that the last tick left running.
        self._recording: dict[str, tuple[tuple[str, str], ...]] = {}
        #: (job, run) -> kind -> seconds, and the latest kind, for the next tick.
        self._pending_verdicts: dict[tuple[str, str], dict[str, float]] = {}
        self._pending_final: dict[tuple[str, str], str] = {}
        #: (job, run) -> the owner of each run of ``_recording``.
        self._recording_owners: dict[tuple[str, str], str] = {}
        #: (job, owner) -> (rank, part) -> (the start first named, monotonic time of the
        #: latest evaluation) of the fail-slow changes the latest evaluation named.
        self._fail_slow: dict[tuple[str, str], dict[tuple[str, str], tuple[float, float]]] = {}
        #: (job, run) -> (rank, part, start) -> (the change as last named, with the largest
        #: ratio seen, and the seconds it held), for the next tick.
        self._pending_fail_slow: dict[tuple[str, str],
                                      dict[tuple[str, str, float], tuple[FailSlowChange,
                                                                         float]]] = {}
        #: (job, run) -> the profiles (owner, ledger entry) noted since the last tick.
        self._pending_profiles: dict[tuple[str, str], list[tuple[str, dict[str, object]]]] = {}
        self._writes = 0
        self._write_errors = dict.fromkeys(WRITE_ERROR_REASONS, 0)
        self._stored_runs: int | None = None
        self._last_write: float | None = None
        #: job -> GPU-seconds per bucket booked since the daemon started, the latest last.
        self._gpu_seconds: OrderedDict[str, dict[str, float]] = OrderedDict()
        #: job -> (Unix time, productive, all booked) at each booking of the window.
        self._goodput_history: dict[str, deque[tuple[float, float, float]]] = {}
        #: Jobs whose GPU-seconds were dropped for newer ones (``MAX_GOODPUT_JOBS``).
        self._goodput_evicted = 0
        #: (job, owner) -> what the owner's latest crashed or preempted run of the job
        #: left to redo.
        self._redo: OrderedDict[tuple[str, str], _Redo] = OrderedDict()
        #: job -> the writer identity its GPU-seconds are booked for (the latest booked;
        #: a change starts the job's counters, window and team again).
        self._job_owners: dict[str, str] = {}
        #: (job, run) -> the owner of each run closed lately (those of ``_recent_ends``).
        self._end_owners: dict[tuple[str, str], str] = {}
        #: job -> its team, as its processes or its owner tell.
        self._teams: dict[str, str] = {}
        #: Jobs booked only from GPUs their processes hold, per writer identity.
        self._idle_jobs: dict[str, set[str]] = {}
        self._last_idle: float | None = None
        self._refused_idle = 0.0
        #: job -> (Unix time, mean tensor-pipe activity of its GPUs) of each evaluation
        #: in the goodput window, for the jobs with goodput series.
        self._tensor: dict[str, deque[tuple[float, float]]] = {}
        #: job -> the sum of its ``_tensor`` values (a scrape reads means, never sums).
        self._tensor_sums: dict[str, float] = {}

    # -- lifecycle ------------------------------------------------------------------

    @property
    def training(self) -> TrainingSource:
        """The training store it records from."""
        return self._training

    @property
    def holdings(self) -> GpuHoldings | None:
        """Who holds each GPU (None: no GPUs on this node's wiring)."""
        return self._holdings

    def start(self) -> None:
        with self._lock:
            self._ensure_open(self._clock())
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop(timeout=max(5.0, self.config.flush_seconds))
        self.tick()
        with self._lock:
            self._close()

    def _close(self) -> None:
        """Close the file, then give its writer lock back."""
        if self._ledger is not None:
            self._ledger.close()
            self._ledger = None
        if self._writer is not None:
            self._writer.release()
            self._writer = None

    def _loop(self) -> None:
        while not self._thread.stopping.wait(self.config.flush_seconds):
            try:
                self.tick()
            except Exception:  # the recorder must outlive any one bad tick
                log.exception("ledger tick failed")

    # -- the recorder -------------------------------------------------------------

    def tick(self) -> None:
        """Read the training store, update every run, write the changed records.

        Linear in the store's size (``SnapshotIndex``); a run whose record did not
        change but for the clock is written again only every ``REWRITE_SECONDS``. The
        file is written outside ``_lock``, which scrapes and ``/healthz`` take: they
        never wait for the disk (``_tick_lock`` keeps ticks one at a time)."""
        snapshot = self._training.snapshot()
        with self._tick_lock:
            with self._lock:
                now = self._clock()
                wall = self._wall_steps.observe(now, self._wall_clock())
                updates = self._update(snapshot, now, wall)
                ledger = self._ledger
                reclaim = self._reclaim_due and now >= self._next_reclaim
                if reclaim:
                    self._reclaim_due, self._next_reclaim = False, now + RECLAIM_SECONDS
            written = _store(ledger, updates, self.config.max_runs_per_owner, reclaim)
            if written is None and ledger is None and updates \
                    and self._open_error is not None:
                written = self._open_error  # a flush with records that cannot be written
            with self._lock:
                self._written(written, updates, self._wall_steps.unix(wall))
                self._publish_recording()

    def _update(self, snapshot: TrainingSnapshot, now: float, wall: float
                ) -> list[RecordUpdate]:
        """The tick's work on the runs in memory; the records to write."""
        self._ensure_open(now)
        index = SnapshotIndex(snapshot)
        live = self._progress(snapshot.ranks, snapshot.descriptions, now, wall)
        self._take_verdicts()
        updates = []
        for key, run in list(self._runs.items()):
            ended = snapshot.ended_runs.get(key)
            if ended is not None and ended.owner == run.owner:
                # even if the rank's next run replaced the line: its word stays
                run.announced = True
                for rank, reason in ended.said.items():
                    run.said.setdefault(rank, reason)
            decide_end(run, live.get(key, []), index, wall, self.config.stall_seconds)
            if run.end_reason in FINAL_END_REASONS:
                run.close_window(set(), ending=True)
                run.totals.close_stalls(run.ended if run.ended is not None else wall)
                self._close_bookings(run, wall)
            self._describe(run, index)
            state = run.state()
            fingerprint = hash(json.dumps([state, run.end_reason,
                                           run.ended, run.changed, run.config_hash,
                                           run.start_time(), run.world_size,
                                           sorted(run.ranks), run.descriptions_taken],
                                          sort_keys=True, default=str))
            if fingerprint != run.written_fingerprint \
                    or now - run.written_at >= REWRITE_SECONDS:
                updates.append(self._as_said(run.record(self._node, wall, self.config), state))
                run.written_fingerprint, run.written_at = fingerprint, now
            if run.end_reason in FINAL_END_REASONS:
                del self._runs[key]
                self._closed[key] = None
                while len(self._closed) > MAX_CLOSED:
                    self._closed.popitem(last=False)
                self._recent_ends.pop(key, None)
                self._recent_ends[key] = (run.end_reason, run.ended or wall,
                                          goodput_ratio(run.totals.gpu_seconds))
        updates += self._close_lost_while_away(now, wall)
        if self._unwritten:  # ended while the file could not be written: theirs first
            fresh = {(update.record.job, update.record.run) for update in updates}
            updates[:0] = [update for key, update in self._unwritten.items()
                           if key not in fresh]
            self._unwritten.clear()
        while self._recent_ends and (
                len(self._recent_ends) > MAX_EXPORTED_RUN_ENDS
                or wall - next(iter(self._recent_ends.values()))[1] > RUN_END_EXPORT_SECONDS):
            self._recent_ends.popitem(last=False)
        self._book_idle(snapshot.ranks, wall)
        return updates

    def _close_lost_while_away(self, now: float, wall: float) -> list[RecordUpdate]:
        """The records that close ``lost`` the runs the file held as going on when it was
        opened and that no reporter continued by ``_away_due`` (their reporters vanished
        while the daemon was down: restart, upgrade, reboot). One that a reporter
        continues is resumed instead (``_run``); one closed here that a reporter
        continues later is resumed too, its end undone."""
        for key in [key for key in self._away if key in self._runs]:
            del self._away[key]
        if not self._away or now < self._away_due or self._ledger is None:
            return []
        away, self._away = self._away, {}
        updates, closed = [], []
        for (job, run_id), owner in away.items():
            try:
                stored = self._ledger.stored(job, run_id, self._node)
            except LedgerError as error:
                self._failed(error)
                break
            if stored is None or stored[0].end_reason in FINAL_END_REASONS \
                    or stored[0].owner != owner:
                continue
            run = RecordedRun.lost_while_away(*stored)
            # its times are the file's, as the wall clock said them
            updates.append(RecordUpdate(run.record(self._node, self._wall_steps.unix(wall),
                                                   self.config), run.state()))
            ended = wall if run.ended is None else self._on_timeline(run.ended)
            self._recent_ends.pop((job, run_id), None)
            self._recent_ends[(job, run_id)] = ("lost", ended,
                                                goodput_ratio(run.totals.gpu_seconds))
            self._end_owners[(job, run_id)] = owner
            closed.append(f"{run_id} of {job}")
        if closed:
            log.warning("run ledger: %d run(s) no reporter continued since the daemon started "
                        "closed as lost at their last report: %s%s", len(closed),
                        ", ".join(closed[:5]), " ..." if len(closed) > 5 else "")
        return updates

    def _take_verdicts(self) -> None:
        """Add the verdict time the evaluations counted since the last tick to the runs."""
        with self._verdict_lock:
            pending, self._pending_verdicts = self._pending_verdicts, {}
            final, self._pending_final = self._pending_final, {}
            fail_slow, self._pending_fail_slow = self._pending_fail_slow, {}
            profiles, self._pending_profiles = self._pending_profiles, {}
        for key, noted in profiles.items():
            run = self._runs.get(key)
            if run is not None:
                for owner, entry in noted:
                    if run.owner == owner:  # another owner's run of the same names
                        run.totals.note_profile(entry)
        for key, changes in fail_slow.items():
            run = self._runs.get(key)
            if run is not None:
                for change, seconds in changes.values():
                    run.totals.note_fail_slow(change, seconds)
        for key, kinds in pending.items():
            run = self._runs.get(key)
            if run is not None:
                for kind, seconds in kinds.items():
                    run.totals.add_verdict(kind, seconds)
        for key, kind in final.items():
            run = self._runs.get(key)
            if run is not None:
                run.totals.final_verdict = kind

    def _publish_recording(self) -> None:
        """Tell the evaluations which runs of each job go on (not ended, not stalled)."""
        recording: dict[str, list[tuple[str, str]]] = {}
        owners: dict[tuple[str, str], str] = {}
        for key, run in self._runs.items():
            if run.end_reason is None:
                recording.setdefault(run.job, []).append(key)
                owners[key] = run.owner
        with self._verdict_lock:
            self._recording = {job: tuple(keys) for job, keys in recording.items()}
            self._recording_owners = owners

    def _progress(
        self,
        ranks: Sequence[ReportingRank],
        descriptions: Mapping[tuple[str, int], DescribingRank],
        now: float,
        wall: float,
    ) -> dict[tuple[str, str], list[ReportingRank]]:
        """Add each rank's progress since the last tick to its run, and the span of its
        new steps to the run's active time and open window (``RecordedRun.add_steps``);
        the live ranks per run."""
        live: dict[tuple[str, str], list[ReportingRank]] = {}
        seen: dict[tuple[str, int], tuple[str, StepTotals]] = {}
        for (job, _), kept in descriptions.items():
            key = (job, kept.description.run)
            if kept.description.ended is None and key not in self._closed:
                self._run(key, wall, kept.owner)
        for view in ranks:
            run_id = view.run or self._described_run(descriptions, view)
            if run_id is None:
                continue
            key = (view.job, run_id)
            seen[(view.job, view.rank)] = (run_id, view.totals)
            if key in self._closed:
                continue
            run = self._run(key, wall, view.owner)
            if run is None:
                continue
            previous = self._seen.get((view.job, view.rank))
            first = previous is None or previous[0] != run_id
            progress = _difference(view.totals, previous[1] if previous else None)
            restarted = progress is None  # the rank's totals went backwards
            if progress is None:
                progress = _difference(view.totals, None)
            assert progress is not None
            if progress.samples and shares_samples(view):
                progress = replace(progress, samples=0)  # its group's root counts them
            run.totals.add(progress)
            self._book(run, view, descriptions.get((view.job, view.rank)),
                       None if previous is None else previous[1], first=first, wall=wall)
            self._note_checkpoint(run, view)
            run.ranks.add(view.rank)
            if run.world_size is None:
                run.world_size = view.world_size
            first_step = None
            if progress.steps > 0:
                run.last_progress = wall
                reported = self._on_timeline(view.last_report_time)
                end = reported if view.last_step_time is None else max(
                    self._on_timeline(view.last_step_time),
                    reported - MAX_STEP_REPORT_LAG_SECONDS)
                fresh = first or restarted
                after = None if fresh else run.rank_last_step.get(view.rank)
                # the client times its steps back to back: they began step_seconds before
                # the last one ended
                start = after if after is not None else end - progress.step_seconds
                run.add_steps(view.rank, progress.samples, start, end, fresh=fresh)
                first_step = start
            run.note_report(view.rank, self._on_timeline(view.last_report_time), first=first,
                            first_step=first_step)
            live.setdefault(key, []).append(view)
        self._seen = seen
        self._note_stalls(ranks, wall)
        for key, views in live.items():
            self._runs[key].close_window({view.rank for view in views})
        return live

    def _note_stalls(self, ranks: Sequence[ReportingRank], wall: float) -> None:
        """Each running run's stalled ranks and silent ones, for its record of stalls
        (``RunTotals.note_stalls``)."""
        stalled: dict[tuple[str, str], dict[int, tuple[str, str, float]]] = {}
        gone: dict[tuple[str, str], list[int]] = {}
        for view in ranks:
            key = (view.job, view.run or "")
            run = self._runs.get(key)
            if run is None or run.owner != view.owner:
                continue
            if wall - self._on_timeline(view.last_report_time) > SILENT_SECONDS:
                gone.setdefault(key, []).append(view.rank)
            elif view.stall is not None:
                stalled.setdefault(key, {})[view.rank] = (
                    view.stall.where, frame_text(view.stall.frames),
                    self._on_timeline(view.stall.since))
        for key, run in self._runs.items():
            if run.end_reason in FINAL_END_REASONS:
                continue
            run.totals.note_stalls(wall, stalled.get(key, {}), gone.get(key, []))

    def _book(self, run: RecordedRun, view: ReportingRank, described: DescribingRank | None,
              before: StepTotals | None, *, first: bool, wall: float) -> None:
        """Book the rank's GPU-seconds up to what its latest totals cover
        (``trainmon.ledger.goodput``), into its run and its job's counters. A rank seen
        from its first report is booked from its reporter's start (its run
        description's ``started``, at most ``MAX_STARTUP_LOOKBACK_SECONDS`` before it
        was first seen), else from the start of its first step; ``before``: the rank's
        totals at the previous tick (an earlier run's, which the store's cumulative
        totals still hold), where its new run's are counted from."""
        saved = view.last_checkpoint
        totals = _totals_of(view.totals, None if saved is None else self._on_timeline(saved.time))
        reported = self._on_timeline(view.last_report_time)
        last_step = None if view.last_step_time is None \
            else self._on_timeline(view.last_step_time)
        booking = run.bookings.get(view.rank)
        if booking is None:
            if run.resumed or not first:
                booking = RankBooking.resumed(wall, totals)
            else:
                baseline = RankTotals() if before is None else _totals_of(before)
                # the rank's last step is this run's only if it stepped since the baseline
                # (the store keeps an earlier run's last step until the new one steps)
                stepped = last_step if totals.steps > baseline.steps else None
                began = (stepped or wall) - (totals.step_seconds - baseline.step_seconds)
                if (described is not None and described.description.run == run.run
                        and described.owner == run.owner):
                    began = min(began, max(self._on_timeline(described.description.started),
                                           wall - MAX_STARTUP_LOOKBACK_SECONDS))
                booking = RankBooking.new_run(min(began, wall), baseline)
                booking.redo_steps = self._steps_to_redo(run, view.rank, wall)
            run.bookings[view.rank] = booking
        peers = [other.work_per_step for rank, other in run.bookings.items()
                 if rank != view.rank and other.work_per_step is not None]
        # up to its latest report: a rank that went silent (crashed) is not booked on
        # while the run's end is decided
        self._add_booked(run, booking.book(min(wall, reported), totals, last_step,
                                           peers_work=max(peers, default=None)), wall)

    def _close_bookings(self, run: RecordedRun, wall: float) -> None:
        """The run ended: each rank's time up to its last report that its booking has
        not covered is booked. A crashed or preempted run leaves the steps after each
        rank's latest checkpoint for its owner's next run of the job to redo (never
        another owner's: a run's word about its steps cannot make another user's run
        book lost progress)."""
        for rank, booking in run.bookings.items():
            left = min(run.last_reports.get(rank, run.ended or wall), wall)
            self._add_booked(run, booking.close(max(left, booking.booked_until)), wall,
                             closing=True)
        key = (run.job, run.run)
        self._end_owners = {kept: owner for kept, owner in self._end_owners.items()
                            if kept in self._recent_ends}
        self._end_owners[key] = run.owner
        if run.end_reason in LOSING_END_REASONS and run.bookings:
            self._redo.pop((run.job, run.owner), None)
            redo = self._redo[(run.job, run.owner)] = _Redo(
                wall, key, run.owner,
                {rank: booking.steps_since_checkpoint() for rank, booking
                 in run.bookings.items()})
            while len(self._redo) > MAX_GOODPUT_JOBS:
                self._redo.popitem(last=False)
            # the restart may have reported in the tick that learnt of the crash
            began = run.start_time()
            for other_key, other in self._runs.items():
                if other.job == run.job and other.owner == redo.owner and other is not run \
                        and other.end_reason is None \
                        and other.start_time() > began and not other.resumed:
                    redo.restarted = other_key
                    for rank, booking in other.bookings.items():
                        booking.redo_steps = redo.steps_of(rank)
                    break

    def _steps_to_redo(self, run: RecordedRun, rank: int, wall: float) -> int:
        """The steps rank ``rank`` of ``run`` redoes: those its owner's crashed run of the
        job did after the rank's latest checkpoint, for the owner's first run of the job
        that starts within ``REDO_HORIZON_SECONDS`` of the crash (0 for any other, and
        for every run of another owner)."""
        redo = self._redo.get((run.job, run.owner))
        if redo is None or redo.owner != run.owner \
                or wall - redo.ended > REDO_HORIZON_SECONDS \
                or redo.crashed == (run.job, run.run):
            return 0
        if redo.restarted is None:
            redo.restarted = (run.job, run.run)
        if redo.restarted != (run.job, run.run):
            return 0
        return redo.steps_of(rank)

    def _add_booked(self, run: RecordedRun, booked: Mapping[str, float], wall: float, *,
                    closing: bool = False) -> None:
        """Add ``booked`` to the run and to its job's counters. The job's counters are
        its owner's: the first booking of another owner (the training store vouches for
        the job's owner) starts them again; the closing bookings of a run whose job name
        another owner booked since reach the run's record only."""
        if not booked:
            return
        run.totals.add_gpu_seconds(booked)
        held = self._job_owners.get(run.job)
        if closing and held is not None and held != run.owner:
            return
        if held != run.owner:
            # the training store vouches for the job's owner: its runs take the job over
            self._forget_idle_job(run.job)
        self._add_job_seconds(run.job, run.owner, booked, wall)
        self._teams.setdefault(run.job, owner_team(run.owner))

    def _add_job_seconds(self, job: str, owner: str, booked: Mapping[str, float],
                         wall: float) -> None:
        """Add ``booked`` to the job's counters and its goodput window, booked for
        ``owner``; a job name that changed owner starts its counters, window, team and
        tensor activity again (the previous owner's series end)."""
        if self._job_owners.get(job, owner) != owner:
            self._forget_job_seconds(job)
        self._job_owners[job] = owner
        seconds = self._gpu_seconds.pop(job, None) or empty_buckets()
        history = self._goodput_history.setdefault(job, deque())
        if not history:  # the window starts before the job's first booking in it
            history.append((wall, seconds["productive"], sum(seconds.values())))
        for bucket, value in booked.items():
            seconds[bucket] += value
        self._gpu_seconds[job] = seconds  # the latest booked last
        while len(self._gpu_seconds) > MAX_GOODPUT_JOBS:
            evicted = next(iter(self._gpu_seconds))
            self._forget_job_seconds(evicted)
            self._forget_idle_job(evicted)
            self._job_owners.pop(evicted, None)
            self._goodput_evicted += 1
        history.append((wall, seconds["productive"], sum(seconds.values())))
        while history and wall - history[0][0] > GOODPUT_WINDOW_SECONDS:
            history.popleft()

    def _forget_job_seconds(self, job: str) -> None:
        """Drop the job's counters, goodput window, team and tensor activity."""
        self._gpu_seconds.pop(job, None)
        self._goodput_history.pop(job, None)
        self._teams.pop(job, None)
        self._tensor.pop(job, None)
        self._tensor_sums.pop(job, None)

    def _book_idle(self, ranks: Sequence[ReportingRank], wall: float) -> None:
        """Book ``idle_allocated``: the GPUs that a job's processes hold and on which no
        rank of a run the recorder is recording reports (by pid or GPU), for the time
        since the previous tick; name each job's team from its processes.

        A process is booked to the job its environment names only for that job's owner:
        the writer identity of the job's reports in the store (else of its first booking)
        must be the process's user (or in-process, ``local``); otherwise its seconds are
        counted in ``refused_idle_seconds``. A user books at most
        ``MAX_IDLE_JOBS_PER_USER`` jobs that no rank reports for. A GPU allocated to a
        pod (``holding.pod_holding``) is booked to its pseudo-job only while no process
        holds it and no rank reports on it."""
        interval = None if self._last_idle is None else wall - self._last_idle
        self._last_idle = wall
        if self._holdings is None:
            return
        holdings = self._holdings()
        owners: dict[str, str] = {}
        covered: dict[str, tuple[set[int], set[str]]] = {}
        for view in ranks:
            owners.setdefault(view.job, view.owner)
            run_id = view.run or None
            if run_id is not None and (view.job, run_id) in self._runs:
                pids, gpus = covered.setdefault(view.job, (set(), set()))
                pids.update(pid for pid in (view.pid, view.sender_pid) if pid is not None)
                if view.gpu is not None:
                    gpus.add(view.gpu)
        idle: dict[str, set[int]] = {}
        idle_owner: dict[str, str] = {}
        # the teams the processes tell, named once the bookings (which start a job that
        # changed owner again) are done: a covered process's team wins over the rest
        told: dict[str, str] = {}
        idle_told: dict[str, str] = {}
        # a pod's allocated GPU is idle only where no process holds it and no rank reports
        used = {gpu for _, gpus in covered.values() for gpu in gpus} | {
            str(holding.gpu) for holding in holdings if holding.owner is None}
        for holding in holdings:
            if holding.owner is not None:
                if holding.job is None or str(holding.gpu) in used:
                    continue
                identity = holding.owner
            elif holding.job is None or holding.uid is None:
                continue
            else:
                identity = uid_writer(holding.uid)
            pids, gpus = covered.get(holding.job, (set(), set()))
            if holding.pid in pids or str(holding.gpu) in gpus:
                if holding.team:
                    told[holding.job] = holding.team
                continue
            owner = owners.get(holding.job) or self._job_owners.get(holding.job) or identity
            if owner not in (identity, LOCAL_WRITER):
                if interval is not None:
                    self._refused_idle += min(interval, MAX_IDLE_GAP_SECONDS)
                continue
            idle.setdefault(holding.job, set()).add(holding.gpu)
            idle_owner[holding.job] = owner
            if holding.team:
                idle_told.setdefault(holding.job, holding.team)
        if interval is not None and interval > 0:
            seconds = min(interval, MAX_IDLE_GAP_SECONDS)
            for job, held in sorted(idle.items()):
                owner = idle_owner[job]
                if job not in self._gpu_seconds and job not in owners:
                    mine = self._idle_jobs.setdefault(owner, set())
                    if len(mine) >= MAX_IDLE_JOBS_PER_USER and job not in mine:
                        self._refused_idle += seconds * len(held)
                        continue
                    mine.add(job)
                self._add_job_seconds(job, owner, {"idle_allocated": seconds * len(held)},
                                      wall)
        for job, team in idle_told.items():
            self._teams.setdefault(job, team)
        self._teams.update(told)

    def _forget_idle_job(self, job: str) -> None:
        for jobs in self._idle_jobs.values():
            jobs.discard(job)

    def _note_checkpoint(self, run: RecordedRun, view: ReportingRank) -> None:
        """Keep the run's latest checkpoint, its path resolved while the rank lives (a
        path already known is not resolved again)."""
        last = view.last_checkpoint
        kept = run.totals.last_checkpoint
        if last is None or (kept is not None and _number(kept.get("time")) >= last.time):
            return
        entry: dict[str, object] = {"time": last.time, "duration_seconds": last.duration_seconds,
                                    "path": last.path, "mountpoint": "", "fstype": "",
                                    "storage": UNKNOWN}
        if last.path is not None:
            if kept is not None and kept.get("path") == last.path and kept.get("storage") \
                    not in (None, UNKNOWN):
                where = {key: kept.get(key) for key in ("mountpoint", "fstype", "storage")}
            else:
                found = self._storage_of(last.path, view.pid, view.sender_pid, view.owner)
                where = {"mountpoint": found.mountpoint, "fstype": found.fstype,
                         "storage": found.storage}
            entry.update(where)
        run.totals.last_checkpoint = entry

    @staticmethod
    def _described_run(
        descriptions: Mapping[tuple[str, int], DescribingRank], view: ReportingRank
    ) -> str | None:
        kept = descriptions.get((view.job, view.rank))
        return None if kept is None else kept.description.run

    def _run(self, key: tuple[str, str], wall: float, owner: str) -> RecordedRun | None:
        """The run ``key`` of ``owner``, created (resumed from its row) when new; None when
        refused: the run in memory or its row belongs to another owner."""
        run = self._runs.get(key)
        if run is not None:
            if run.owner != owner:
                self._refuse(key, owner, run.owner)
                return None
            return run
        if (*key, owner) in self._refused:
            return None
        state = None
        if self._ledger is not None:
            try:
                stored_owner = self._ledger.owner(key[0], key[1], self._node)
                if stored_owner not in (None, "", owner):
                    self._refuse(key, owner, stored_owner)
                    return None
                state = self._ledger.state(key[0], key[1], self._node)
            except LedgerError as error:
                self._failed(error)
        run = self._runs[key] = RecordedRun(job=key[0], run=key[1], first_seen=wall, owner=owner)
        if state is not None:
            run.resumed = True
            run.totals = RunTotals.from_state(state).resumed()
            run.storages = _storages(state.get("data_storage"))
            run.resume(state)
            log.info("resuming the ledger record of run %s of job %s", key[1], key[0])
        return run

    def _refuse(self, key: tuple[str, str], owner: str, holder: str | None) -> None:
        """Count and log (rate-limited) that ``owner``'s run ``key`` is not recorded
        because its record belongs to ``holder``."""
        refused = (*key, owner)
        if refused in self._refused:
            return
        self._refused[refused] = None
        while len(self._refused) > MAX_CLOSED:
            self._refused.popitem(last=False)
        self._refused_runs += 1
        held_back = self._errors.admit("refused")
        if held_back is not None:
            log.warning(
                "run ledger: not recording run %s of job %s for %s: its record on node %s "
                "belongs to %s (a job name and run id re-used by another writer)%s",
                key[1], key[0], owner, self._node, holder,
                f"; {held_back} more refused since the last such line" if held_back else "")

    def _describe(self, run: RecordedRun, index: SnapshotIndex) -> None:
        mine = sorted(index.described(run).items(), key=lambda item: item[0])
        if not mine:
            return
        rank, kept = mine[0]
        run.take_started(self._on_timeline(min(kept.description.started for _, kept in mine)))
        run.ranks.update(rank for rank, _ in mine)
        if kept.description is run.source:
            return
        description = kept.description
        pid = index.pid(run.job, rank, run.owner)
        unresolved = [path for path in description.data_paths
                      if run.storages.get(path, {}).get("storage", UNKNOWN) == UNKNOWN]
        if unresolved and pid is None and kept.sender_pid is None:
            return  # resolve in the reporter's mount namespace once its pid is known
        for path in unresolved:
            # once known, never resolved again: the reporter (and its mount namespace)
            # may be gone when its final description arrives
            where = self._storage_of(path, pid, kept.sender_pid, run.owner)
            run.storages[path] = {"mountpoint": where.mountpoint, "fstype": where.fstype,
                                  "storage": where.storage}
        data_paths = [{"path": path, **run.storages[path]} for path in description.data_paths]
        run.source = description
        run.descriptions_taken += 1
        run.config_hash = description.config_hash
        run.world_size = description.world_size or run.world_size
        run.description = {
            "job": description.job,
            "run": description.run,
            "started": description.started,
            "world_size": description.world_size,
            "config_hash": description.config_hash,
            "config": dict(description.config),
            "environment": dict(description.environment),
            "data_paths": data_paths,
            "versions": dict(description.versions),
            "git": None if description.git_commit is None else {
                "commit": description.git_commit, "dirty": description.git_dirty},
            "host": description.host,
            "framework": dict(description.framework),
        }
        if run.changed is None and self._ledger is not None:
            try:
                previous = self._ledger.previous(run.job, None, before=run.start_time())
            except LedgerError as error:
                self._failed(error)
            else:
                run.changed = "" if previous is None else changed_keys(
                    previous.description, run.description)

    # -- the file -----------------------------------------------------------------

    def _ensure_open(self, now: float) -> None:
        if self._ledger is None and now >= self._next_open:
            self._next_open = now + REOPEN_SECONDS
            # The default folder is made when missing (trainmon.paths); a configured
            # one is not: it may be a filesystem that is not mounted yet.
            try:
                made = [] if self.config.path is not None else make_state_directory(
                    self.config.file.parent)
            except OSError as error:
                self._failed(LedgerError(f"cannot use the folder of {self.config.file}: "
                                         f"{error.strerror or error}"))
                return
            for folder in made:
                log.info("created %s for the run ledger", folder)
            try:
                if self._writer is None:
                    self._writer = take_writer_lock(self.config.file)
                self._ledger = Ledger.open(self.config.file, readonly=False)
            except LedgerError as error:
                self._open_error = error
                self._next_open = now + self._reopen_seconds(error)
                self._failed(error)
                return
            self._open_error = None
            self._error = None
            self._errors.forget("ledger")
            log.info("run ledger at %s", self.config.file)
            try:
                self._stored_runs = self._ledger.count()
                self._away = {(job, run_id): owner for job, run_id, owner
                              in self._ledger.unfinished(self._node, MAX_LOST_WHILE_AWAY)}
            except LedgerError as error:
                self._failed(error)
            self._away_due = now + min(self.config.stall_seconds, RESUME_GRACE_SECONDS)
        if self._ledger is not None and now >= self._next_prune:
            self._next_prune = now + PRUNE_SECONDS
            try:
                pruned = self._ledger.prune(
                    now=self._wall_clock(),
                    retention_seconds=self.config.retention_days * 86400,
                    max_runs=self.config.max_runs,
                    max_runs_per_owner=self.config.max_runs_per_owner)
            except LedgerError as error:
                self._failed(error)
            else:
                self._pruned["age"] += pruned.age
                self._pruned["owner_limit"] += pruned.owner_limit
                self._pruned["max_runs"] += pruned.max_runs
                self._reclaim_due = self._reclaim_due or pruned.total > 0
                if pruned.total:
                    log.info("run ledger: %d runs deleted (%d ended more than %g days ago, "
                             "%d beyond max_runs_per_owner, %d beyond max_runs); per owner: %s",
                             pruned.total, pruned.age, self.config.retention_days,
                             pruned.owner_limit, pruned.max_runs,
                             ", ".join(f"{owner or '(none)'} {count}" for owner, count
                                       in sorted(pruned.by_owner.items())))

    def _written(self, written: tuple[WriteResult, int, int] | LedgerError | None,
                 updates: list[RecordUpdate], wall: float) -> None:
        """Take in what ``_store`` did with ``updates``: counters, errors, refused rows."""
        if written is None:
            return
        if isinstance(written, LedgerError):
            reason = written.reason if written.reason in self._write_errors else "other"
            self._write_errors[reason] += 1
            self._failed(written)
            for update in updates:  # written again at the next tick
                key = (update.record.job, update.record.run)
                run = self._runs.get(key)
                if run is not None:
                    run.written_fingerprint = None
                else:  # ended: its last record is kept until the file takes it
                    self._unwritten.pop(key, None)
                    self._unwritten[key] = update
            if len(self._unwritten) > MAX_UNWRITTEN:
                dropped = len(self._unwritten) - MAX_UNWRITTEN
                for _ in range(dropped):
                    self._unwritten.popitem(last=False)
                self._dropped_unwritten += dropped
                log.warning("run ledger: %d records of ended runs dropped: more than %d "
                            "waiting for the file (%s)", dropped, MAX_UNWRITTEN, written)
            return
        result, self._stored_runs, reclaimed = written
        if result.owner_limit:
            self._pruned["owner_limit"] += result.owner_limit
            self._reclaim_due = True
        if reclaimed:
            log.info("run ledger: %d MiB of deleted runs given back to the filesystem",
                     reclaimed >> 20)
        self._writes += 1
        self._last_write = wall
        self._error = None
        self._errors.forget("ledger")
        self._drop_refused(result)

    def _drop_refused(self, result: WriteResult) -> None:
        """Forget the runs whose rows turned out to belong to another owner (a row the
        recorder could not check when the run began: the ledger was not open then)."""
        for (job, run_id, _), holder in result.refused:
            run = self._runs.pop((job, run_id), None)
            if run is not None:
                self._refuse((job, run_id), run.owner, holder)

    def _reopen_seconds(self, error: LedgerError) -> float:
        """Seconds until the next attempt to open the file after ``error``."""
        if error.reason in DISK_REASONS:
            return min(REOPEN_SECONDS, max(DISK_REOPEN_SECONDS, self.config.flush_seconds))
        return REOPEN_SECONDS

    def _failed(self, error: LedgerError) -> None:
        self._error = str(error)
        if self._errors.allow("ledger", self._error):
            retry = ("written again at the next flush" if self._ledger is not None
                     else f"opened again every {self._reopen_seconds(error):g} s")
            log.error("run ledger: %s (recording goes on in memory, %s)", error, retry)
        if self._ledger is not None and not self.config.file.exists():
            self._close()


    # -- the recorder's time and the wall clock's ------------------------------------

    def _on_timeline(self, unix: float) -> float:
        """Unix time as the wall clock reckons it now (a snapshot's, a sender's) on the
        steady time, the recorder's."""
        return self._wall_steps.steady(unix)

    def _said(self, time: float) -> float:
        """The recorder's ``time`` as Unix time as the wall clock said it then."""
        return self._wall_steps.said(time)

    def _as_said(self, record: RunRecord, state: dict[str, object]) -> RecordUpdate:
        """``record`` and ``state`` of a run in memory with their times (the recorder's)
        as the wall clock said them; the duration stays the monotonic one."""
        record = replace(record, started=self._said(record.started),
                         ended=None if record.ended is None else self._said(record.ended),
                         updated=self._wall_steps.unix(record.updated))
        for name in ("started", "first_report", "last_report", "active_start", "active_end"):
            value = state.get(name)
            if isinstance(value, float):
                state[name] = self._said(value)
        return RecordUpdate(record, state)

    # -- evaluations and scrapes ------------------------------------------------------

    def count_verdicts(self, current: Mapping[str, str]) -> None:
        """One evaluation of the diagnosis, ``current`` its verdict kind per job: count
        the time since the previous one toward each running run's verdict when the
        job's verdict held (module docstring)."""
        now = self._clock()
        with self._verdict_lock:
            for job, kind in current.items():
                before = self._verdicts.get(job)
                keys = self._recording.get(job, ())
                if before is not None and before[0] == kind:
                    seconds = verdict_gap(now - before[1])
                    for key in keys:
                        kinds = self._pending_verdicts.setdefault(key, {})
                        kinds[kind] = kinds.get(kind, 0.0) + seconds
                for key in keys:
                    self._pending_final[key] = kind
                self._verdicts[job] = (kind, now)
            for job in set(self._verdicts) - set(current):
                del self._verdicts[job]

    def note_profile(self, job: str, run: str, owner: str, entry: Mapping[str, object]) -> None:
        """A profile of a rank of run ``run`` of ``job`` whose owner is ``owner``, as the
        ledger keeps it (``trainmon.ledger.summary``, "profiles"), for the next tick."""
        with self._verdict_lock:
            noted = self._pending_profiles.setdefault((job, run), [])
            noted.append((owner, dict(entry)))
            del noted[:-MAX_RECORDED_PROFILES]
            while len(self._pending_profiles) > MAX_PENDING_PROFILE_RUNS:
                del self._pending_profiles[next(iter(self._pending_profiles))]

    def count_fail_slow(self, current: Sequence[FailSlowChange]) -> None:
        """One evaluation of the diagnosis, ``current`` the fail-slow changes it names
        (every job's; a job without one has none now): each toward the running runs of
        its job and owner (module docstring)."""
        now = self._clock()
        with self._verdict_lock:
            seen: dict[tuple[str, str], dict[tuple[str, str], tuple[float, float]]] = {}
            for change in current:
                held = self._fail_slow.get((change.job, change.owner), {}).get(
                    (change.rank, change.part))
                start, seconds = change.start, 0.0
                if held is not None:
                    start, seconds = held[0], verdict_gap(now - held[1])
                seen.setdefault((change.job, change.owner), {})[
                    (change.rank, change.part)] = (start, now)
                for key in self._recording.get(change.job, ()):
                    if self._recording_owners.get(key) != change.owner:
                        continue  # another owner's run of the same job name
                    pending = self._pending_fail_slow.setdefault(key, {})
                    identity = (change.rank, change.part, start)
                    named, total = replace(change, start=start), seconds
                    before = pending.get(identity)
                    if before is not None:  # evaluations since the last tick
                        cause = before[0].cause if change.cause == "unknown" \
                            else change.cause
                        named = replace(named, ratio=max(change.ratio, before[0].ratio),
                                        cause=cause)
                        total += before[1]
                    pending[identity] = (named, total)
            self._fail_slow = seen

    def observe_tensor_activity(self, activity: Mapping[str, float]) -> None:
        """One evaluation's mean tensor-pipe activity (GPM) of each job's GPUs over the
        diagnosis window, for ``productive_tensor_active``."""
        now = self._clock()
        with self._lock:
            for job, value in activity.items():
                if job not in self._gpu_seconds:
                    continue  # bounded by the jobs with goodput series
                samples = self._tensor.setdefault(job, deque())
                samples.append((now, value))
                self._tensor_sums[job] = self._tensor_sums.get(job, 0.0) + value
                while samples and now - samples[0][0] > GOODPUT_WINDOW_SECONDS:
                    self._tensor_sums[job] -= samples.popleft()[1]
            for job in set(self._tensor) - set(self._gpu_seconds):
                del self._tensor[job]
                self._tensor_sums.pop(job, None)

    def _productive_tensor_active(self, goodput: Mapping[str, float]) -> dict[str, float]:
        """Tensor pipes' active share while productive: their mean activity over the
        goodput window, over the productive share of that window. Data wait, exposed
        communication, checkpoints and stalls keep the tensor pipes idle, so the mean
        activity is the productive time's activity times its share."""
        shares = {}
        for job, samples in self._tensor.items():
            ratio = goodput.get(job)
            if samples and ratio:
                mean = self._tensor_sums[job] / len(samples)
                shares[job] = min(mean / ratio, 1.0)
        return shares

    def readings(self) -> RecorderReadings:
        """The runs' changes, the latest ends and the counters, at one instant."""
        with self._lock:
            wall = self._wall_steps.observe(self._clock(), self._wall_clock())
            changes = tuple((job, run.owner, run_id, run.changed)
                            for (job, run_id), run in sorted(self._runs.items())
                            if run.changed is not None)
            ended: list[tuple[float, tuple[str, str], str, float | None, str]] = [
                (end, key, reason, ratio, self._end_owners.get(key, ""))
                for key, (reason, end, ratio) in self._recent_ends.items()]
            # a stalled run goes on: its goodput is not final
            ended += [(run.ended, key, "stalled", None, run.owner)
                      for key, run in self._runs.items()
                      if run.end_reason == "stalled" and run.ended is not None]
            recent = sorted((item for item in ended if wall - item[0] <= RUN_END_EXPORT_SECONDS),
                            reverse=True)[:MAX_EXPORTED_RUN_ENDS]
            ends = tuple(RunEnd(job, run_id, reason, self._said(end), ratio, owner)
                         for end, (job, run_id), reason, ratio, owner
                         in sorted(recent, key=lambda item: item[1]))
            goodput = {job: ratio for job, history in self._goodput_history.items()
                       if (ratio := _window_ratio(history)) is not None}
            return RecorderReadings(
                changes=changes, ends=ends,
                up=self._ledger is not None and self._error is None,
                writes=self._writes, write_errors=dict(self._write_errors),
                refused_runs=self._refused_runs, pruned=dict(self._pruned),
                stored_runs=self._stored_runs,
                gpu_seconds={job: dict(seconds) for job, seconds in self._gpu_seconds.items()},
                goodput=goodput,
                productive_tensor_active=self._productive_tensor_active(goodput),
                goodput_evicted_jobs=self._goodput_evicted,
                unwritten_runs=len(self._unwritten),
                dropped_unwritten_runs=self._dropped_unwritten,
                teams={job: self._teams[job] for job in self._gpu_seconds if job in self._teams},
                owners={job: self._job_owners[job] for job in self._gpu_seconds},
                refused_idle_seconds=self._refused_idle)

    def health(self) -> Mapping[str, object]:
        """The ``/healthz`` state of the ledger (``degraded`` while nothing reaches the file).

        Without ``_lock``, which a tick holds while it updates the runs: ``/healthz``
        never waits for a tick. Each value is one attribute read (atomic in CPython);
        together they may straddle a tick, which a health answer can afford."""
        ledger, error = self._ledger, self._error
        state: dict[str, object] = {
            "path": str(self.config.file),
            "open": ledger is not None,
            "recording_runs": len(self._runs),
            "stored_runs": self._stored_runs,
            "last_write_timestamp": self._last_write,
        }
        if error is not None:
            state["ledger_error"] = error
        if ledger is None or error is not None:
            # recording goes on in memory, but nothing reaches the file
            state["state"] = "degraded"
            state["error"] = error or f"the run ledger {self.config.file} is not open"
        return state


def _store(ledger: Ledger | None, updates: list[RecordUpdate], max_runs_per_owner: int,
           reclaim: bool) -> tuple[WriteResult, int, int] | LedgerError | None:
    """Write ``updates`` to ``ledger`` (outside the recorder's lock), each owner kept to
    ``max_runs_per_owner`` rows, and ``reclaim`` the space of deleted rows: the result,
    the records stored now and the bytes given back; the error; or None when there was
    nothing to do."""
    if ledger is None or not (updates or reclaim):
        return None
    try:
        result = ledger.write(updates, max_runs_per_owner) if updates else WriteResult(0)
        reclaimed = ledger.reclaim() if reclaim else 0
        return result, ledger.count(), reclaimed
    except LedgerError as error:
        return error


def _difference(now: StepTotals, before: StepTotals | None) -> Progress | None:
    """``now - before`` as progress; None when a total went backwards (the rank restarted)."""
    if before is None:
        return Progress(
            steps=now.steps, samples=now.samples, step_seconds=now.step_seconds,
            data_wait_seconds=now.data_wait_seconds, step_buckets=list(now.step_buckets),
            phase_seconds=dict(now.phase_seconds), comm_exposed_seconds=now.comm_exposed_seconds,
            checkpoints=now.checkpoints, group_exposed_seconds=_group_exposed(now, None),
            step_sketch=None if now.step_sketch is None else now.step_sketch.copy())
    if not now.covers(before):
        return None
    exposed = None
    if now.comm_exposed_seconds is not None:
        exposed = now.comm_exposed_seconds - (before.comm_exposed_seconds or 0.0)
    checkpoints = None
    if now.checkpoints is not None:
        checkpoints = now.checkpoints - (before.checkpoints or 0)
    return Progress(
        steps=now.steps - before.steps,
        samples=now.samples - before.samples,
        step_seconds=now.step_seconds - before.step_seconds,
        data_wait_seconds=now.data_wait_seconds - before.data_wait_seconds,
        step_buckets=[a - b for a, b in zip(now.step_buckets, before.step_buckets, strict=True)],
        phase_seconds={name: seconds - before.phase_seconds.get(name, 0.0)
                       for name, seconds in now.phase_seconds.items()},
        comm_exposed_seconds=exposed,
        checkpoints=checkpoints,
        group_exposed_seconds=_group_exposed(now, before),
        # the steps since the previous tick, by duration (covers() checked the sketch too)
        step_sketch=None if now.step_sketch is None
        else sketch_increase(now.step_sketch, before.step_sketch),
    )


def shares_samples(view: ReportingRank) -> bool:
    """Whether ``view``'s samples are another rank's too, which counts them: the rank is
    in a ``SAMPLE_SHARING_GROUPS`` group whose lowest rank is another."""
    groups = view.totals.comm_groups
    for name in SAMPLE_SHARING_GROUPS:
        group = groups.get(name)
        if group is not None and group.root is not None and group.root != view.rank:
            return True
    return False


def _group_exposed(now: StepTotals, before: StepTotals | None) -> dict[str, float]:
    """The increase of each group's exposed seconds (those that say it)."""
    increase = {}
    for name, group in now.comm_groups.items():
        if group.exposed_seconds is None:
            continue
        earlier = before.comm_groups.get(name) if before is not None else None
        previous = earlier.exposed_seconds if earlier is not None else None
        increase[name] = max(group.exposed_seconds - (previous or 0.0), 0.0)
    return increase


def _number(value: object) -> float:
    """``value`` as a number (a stored fact); -inf when it is none."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return float("-inf")


def _storages(value: object) -> dict[str, dict[str, str]]:
    """Data path -> storage as ``RecordedRun.state`` saved it; {} where it does not parse."""
    if not isinstance(value, Mapping):
        return {}
    return {str(path): {key: str(where.get(key, "")) for key in ("mountpoint", "fstype",
                                                                  "storage")}
            for path, where in value.items() if isinstance(where, Mapping)}


def changed_keys(before: Mapping[str, object], after: Mapping[str, object]) -> str:
    """Names of what differs between two run descriptions, sorted and comma-joined:
    config keys, environment variable names, ``data``, ``versions.<name>``, ``world_size``."""
    names: set[str] = set()
    for part, prefix in (("config", ""), ("environment", ""), ("versions", "versions.")):
        a, b = _mapping(before.get(part)), _mapping(after.get(part))
        names.update(prefix + key for key in set(a) | set(b) if a.get(key) != b.get(key))
    if _data_changed(_data(before), _data(after)):
        names.add("data")
    if before.get("world_size") != after.get("world_size"):
        names.add("world_size")
    return ",".join(sorted(names))


def _mapping(value: object) -> Mapping[str, object]:
    return value if isinstance(value, Mapping) else {}


def _data(description: Mapping[str, object]) -> dict[object, object]:
    """Data path → storage kind of a description."""
    paths = description.get("data_paths")
    if not isinstance(paths, list):
        return {}
    return {p.get("path"): p.get("storage") for p in paths if isinstance(p, Mapping)}


def _data_changed(before: Mapping[object, object], after: Mapping[object, object]) -> bool:
    """Other paths, or a path on another storage kind (an ``unknown`` kind matches any)."""
    if set(before) != set(after):
        return True
    return any(before[path] != after[path] and "unknown" not in (before[path], after[path])
               for path in before)


def _totals_of(totals: StepTotals, last_checkpoint_time: float | None = None) -> RankTotals:
    return RankTotals(
        steps=totals.steps, step_seconds=totals.step_seconds,
        data_wait_seconds=totals.data_wait_seconds,
        comm_exposed_seconds=totals.comm_exposed_seconds,
        phase_seconds=dict(totals.phase_seconds),
        checkpoint_seconds=totals.checkpoint_seconds, checkpoints=totals.checkpoints,
        last_checkpoint_time=last_checkpoint_time)


def _window_ratio(history: deque[tuple[float, float, float]]) -> float | None:
    """Productive over booked GPU-seconds between the window's first and last booking."""
    if len(history) < 2:
        return None
    (_, productive_then, booked_then), (_, productive, booked) = history[0], history[-1]
    return (productive - productive_then) / (booked - booked_then) \
        if booked > booked_then else None
