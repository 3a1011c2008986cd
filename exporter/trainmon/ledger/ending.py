"""A run as the recorder holds it, and the end-of-run policy: when and how it ended.

End reasons (``trainmon.ledger.records.END_REASONS``), from what the run's
ranks on this node did: ``crashed`` if any rank's description said
``ended: crashed``; else ``preempted`` if any said ``preempted``; else
``lost`` if any rank went silent without an ``ended`` (it expired past the
training TTL, was evicted, or went on with another run); else ``finished``
once all said ``finished`` (``combined_end_reason``). The run ends when no
rank reports or describes it any more, or as soon as every description of it
says ``ended``.

Boundaries (docs/runs.md, "Duration and samples/s"): a run *starts* at its first
report (the earliest evidence of its ranks: a report, or the start of their first
step), or at its description's ``started`` (when its reporter was made) when that
is earlier, by at most ``MAX_STARTUP_LOOKBACK_SECONDS``; it *ends* at its ranks'
last report or last step, whichever is later (``last_known``): the final report
that ``close()`` sends with the ended description, or the last one a rank sent
before it went silent; never at the tick that noticed the end. A stall still open
when the run ends is closed then (``RunTotals.close_stalls``).

Once an end of the run was announced, a rank that went on with
another run counts as ``finished``: its next run may have replaced its ended
description before a tick read it (the store remembers that some rank
announced an end, not which rank nor the word). ``stalled``: its ranks report
but no step completed for ``stall_seconds`` after its last step's end (cleared when
steps resume).
Finished, crashed, preempted and lost runs are closed (``FINAL_END_REASONS``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from trainmon.ledger.config import LedgerConfig
from trainmon.ledger.feed import DescribingRank, ReportingRank, RunDescribed, TrainingSnapshot
from trainmon.ledger.goodput import RankBooking
from trainmon.ledger.records import RunRecord, combined_end_reason
from trainmon.ledger.summary import RunTotals

#: The furthest before its first report that a run's start (its run description's
#: ``started``, the sender's word) is taken.
MAX_STARTUP_LOOKBACK_SECONDS = 600.0


class SnapshotIndex:
    """One tick's snapshot indexed once, so that each run's lookups cost its own ranks,
    not the whole store (a tick stays linear in the store's size)."""

    def __init__(self, snapshot: TrainingSnapshot) -> None:
        self.snapshot = snapshot
        #: (job, run, owner) -> rank -> that rank's latest description of the run.
        self._described: dict[tuple[str, str, str], dict[int, DescribingRank]] = {}
        #: job -> the ranks with a description or a report in the store.
        self._present: dict[str, set[int]] = {}
        #: (job, rank, owner) -> the pid of the rank's latest report.
        self._pids: dict[tuple[str, int, str], int | None] = {}
        for (job, rank), kept in snapshot.descriptions.items():
            self._described.setdefault((job, kept.description.run, kept.owner), {})[rank] = kept
            self._present.setdefault(job, set()).add(rank)
        for view in snapshot.ranks:
            self._present.setdefault(view.job, set()).add(view.rank)
            self._pids[(view.job, view.rank, view.owner)] = view.pid

    def described(self, run: RecordedRun) -> Mapping[int, DescribingRank]:
        """rank -> its description of ``run``, of the run's owner."""
        return self._described.get((run.job, run.run, run.owner), {})

    def present(self, job: str) -> set[int]:
        return self._present.get(job, set())

    def pid(self, job: str, rank: int, owner: str) -> int | None:
        return self._pids.get((job, rank, owner))


@dataclass
class RecordedRun:
    """One run of one job on this node, while the recorder follows it."""

    job: str
    run: str
    first_seen: float
    #: The writer identity of the run's job when it was first seen.
    owner: str = ""
    totals: RunTotals = field(default_factory=RunTotals)
    ranks: set[int] = field(default_factory=set)
    description: Mapping[str, object] | None = None
    #: The description it was built from, to rebuild only on change.
    source: RunDescribed | None = None
    #: Descriptions it was built from so far (its record changed with each).
    descriptions_taken: int = 0
    config_hash: str = ""
    #: The earliest ``started`` of its descriptions, where within the look-back.
    started: float | None = None
    #: Unix time of the run's earliest evidence on this node: the first report of a rank
    #: as the first tick that saw it found it, or the start of its first step if earlier.
    first_report: float | None = None
    world_size: int | None = None
    #: rank -> how its description said the run ended (``RUN_END_REASONS``).
    said: dict[int, str] = field(default_factory=dict)
    #: The store remembers an end announced for the run (``ended_runs``), maybe by a
    #: description that the rank's next run replaced before a tick read it.
    announced: bool = False
    #: data path -> its storage once resolved: mountpoint, fstype, storage.
    storages: dict[str, dict[str, str]] = field(default_factory=dict)
    last_progress: float | None = None
    #: Unix time of the latest report of its ranks.
    last_report: float | None = None
    end_reason: str | None = None
    ended: float | None = None
    changed: str | None = None
    #: rank -> the booking of its GPU-seconds (``trainmon.ledger.goodput``).
    bookings: dict[int, RankBooking] = field(default_factory=dict)
    #: Resumed from a stored row (a restarted daemon): ranks' totals so far are not booked.
    resumed: bool = False
    #: rank -> Unix time of its latest report (where its booking ends when the run does).
    last_reports: dict[int, float] = field(default_factory=dict)
    #: What its record said when last handed to the file (None: to be written), and
    #: the recorder's monotonic time then.
    written_fingerprint: int | None = None
    written_at: float = float("-inf")
    #: rank -> the end of its latest step in this run (Unix), where the next window of
    #: its steps begins.
    rank_last_step: dict[int, float] = field(default_factory=dict)
    #: rank -> [samples, seconds] of its steps in the window not yet closed.
    window: dict[int, list[float]] = field(default_factory=dict)
    #: The open window holds no rank's totals so far (``trainmon.ledger.summary``).
    window_counted: bool = True
    #: Where the open window began (the end of the previous one); None before the first.
    window_from: float | None = None

    @classmethod
    def lost_while_away(cls, record: RunRecord, state: Mapping[str, object]) -> RecordedRun:
        """A run the ledger held as going on that no reporter continued after the daemon
        came back: closed ``lost`` at its last known time (its ranks' last report or last
        step as stored, else the record's ``updated``), its open stall with it."""
        run = cls(job=record.job, run=record.run, first_seen=record.started,
                  owner=record.owner, totals=RunTotals.from_state(state),
                  description=dict(record.description), config_hash=record.config_hash,
                  world_size=record.world_size)
        run.resume(state)
        if run.started is None and run.first_report is None:  # an older daemon's state
            run.started = record.started
        if not run.ranks:
            run.ranks = set(range(record.ranks))
        run.end_reason, run.ended = "lost", run.last_known(record.updated)
        run.totals.close_stalls(run.ended)
        return run

    def start_time(self) -> float:
        """When the run started (module docstring)."""
        known = [time for time in (self.started, self.first_report) if time is not None]
        return min(known) if known else self.first_seen

    def take_started(self, started: float) -> None:
        """A description's ``started``: the run's start if earlier, within the look-back
        from its first report."""
        first = self.first_report if self.first_report is not None else self.first_seen
        if started >= first - MAX_STARTUP_LOOKBACK_SECONDS:
            self.started = started if self.started is None else min(self.started, started)

    def note_report(self, rank: int, time: float, *, first: bool,
                    first_step: float | None) -> None:
        """A rank's latest report (Unix ``time``); ``first``: the first that this daemon
        saw of it in the run, ``first_step``: the start of its first step there."""
        self.last_report = time if self.last_report is None else max(self.last_report, time)
        self.last_reports[rank] = time
        if first:
            earliest = time if first_step is None else min(time, first_step)
            self.first_report = earliest if self.first_report is None else min(
                self.first_report, earliest)

    def last_known(self, wall: float) -> float:
        """The run's end as it stands: its ranks' last report or last step, whichever is
        later, not after ``wall``; ``wall`` when nothing was reported."""
        known = [time for time in (self.last_report, self.totals.active_end)
                 if time is not None]
        return min(max(known), wall) if known else wall

    def add_steps(self, rank: int, samples: int, start: float, end: float, *,
                  fresh: bool) -> None:
        """Rank ``rank`` did steps of ``samples`` samples from ``start`` to ``end`` (Unix)
        since the previous tick; ``fresh``: they are its totals so far, not a window's
        (a rank first seen once the run was under way, or whose totals restarted)."""
        self.totals.note_active(start, end)
        self.rank_last_step[rank] = max(end, self.rank_last_step.get(rank, end))
        if fresh and self.window_from is not None:
            self.window_counted = False
        pending = self.window.setdefault(rank, [0.0, 0.0])
        pending[0] += samples
        pending[1] += max(end - start, 0.0)

    def close_window(self, live: set[int], *, ending: bool = False) -> None:
        """Close the open window once each live rank that stepped in the run stepped in it
        (``ending``: whatever it holds): its rate is the sum of each rank's samples over
        the length of its steps in it (``RunTotals.add_window``)."""
        end = self.totals.active_end
        if not self.window or end is None:
            return
        if not ending and not all(rank in self.window for rank in live
                                  if rank in self.rank_last_step):
            return
        rate = sum(samples / seconds for samples, seconds in self.window.values()
                   if seconds > 0)
        began = self.window_from if self.window_from is not None else self.totals.active_start
        if began is not None:
            self.totals.add_window(rate, end - began, counted=self.window_counted)
        self.window.clear()
        self.window_counted = True
        self.window_from = end

    def record(self, node: str, wall: float, config: LedgerConfig) -> RunRecord:
        started = self.start_time()
        end = self.ended if self.ended is not None else wall
        ranks = max(len(self.ranks), 1)
        summary = self.totals.summary(
            ranks=ranks, duration_seconds=end - started,
            price_per_gpu_hour=config.price_per_gpu_hour, currency=config.currency)
        return RunRecord(
            job=self.job, run=self.run, node=node, config_hash=self.config_hash,
            started=started, ended=self.ended, end_reason=self.end_reason, updated=wall,
            world_size=self.world_size, ranks=len(self.ranks),
            description=dict(self.description or {}), summary=summary, owner=self.owner)

    def state(self) -> dict[str, object]:
        """What a restarted daemon resumes the run from (``Ledger.state``), and what it
        closes the run ``lost`` with when no reporter continues it (``resume``)."""
        return {**self.totals.to_state(), "data_storage": self.storages,
                "started": self.started, "first_report": self.first_report,
                "last_report": self.last_report, "ranks": sorted(self.ranks)}

    def resume(self, state: Mapping[str, object]) -> None:
        """Take back what ``state`` kept of the run beyond its totals: its start, first and
        last report and ranks (absent from the states of older daemons)."""
        for name in ("started", "first_report", "last_report"):
            value = state.get(name)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                setattr(self, name, float(value))
        ranks = state.get("ranks")
        if isinstance(ranks, list):
            self.ranks.update(rank for rank in ranks
                              if isinstance(rank, int) and not isinstance(rank, bool))
        self.window_from = self.totals.active_end


def decide_end(
    run: RecordedRun,
    live: Sequence[ReportingRank],
    index: SnapshotIndex,
    wall: float,
    stall_seconds: float,
) -> None:
    """Set ``run.end_reason`` and ``run.ended`` from this tick's snapshot, indexed
    (module docstring): ended, stalled, or going on (both None)."""
    described = {rank: kept.description for rank, kept in index.described(run).items()}
    for rank, description in described.items():
        if description.ended is not None:
            run.said[rank] = description.ended
    running = [d for d in described.values() if d.ended is None]
    if not live and not running:
        run.end_reason, run.ended = end_reason(run, live, index), run.last_known(wall)
        return
    if described and not running and (run.said or run.announced):
        run.end_reason, run.ended = end_reason(run, live, index), run.last_known(wall)
        return
    since = run.totals.active_end
    if since is None:
        since = run.last_progress if run.last_progress is not None else run.start_time()
    if live and wall - since >= stall_seconds:
        run.end_reason, run.ended = "stalled", since
    else:
        run.end_reason, run.ended = None, None


def end_reason(
    run: RecordedRun, live: Sequence[ReportingRank], index: SnapshotIndex
) -> str:
    """How the run ended on this node (module docstring): what its ranks said,
    ``lost`` for a rank that went silent without a word."""
    reasons = set(run.said.values())
    reporting = {view.rank for view in live}
    present = index.present(run.job)
    for rank in run.ranks - run.said.keys() - reporting:
        # gone from the store, or on with another run without an end announced
        moved_on_after_an_end = run.announced and rank in present
        reasons.add("finished" if moved_on_after_an_end else "lost")
    return combined_end_reason(reasons) or ("finished" if run.announced else "lost")
