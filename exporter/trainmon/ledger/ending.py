"""A run as the recorder holds it, and the end-of-run policy: when and how it ended.

End reasons (``trainmon.ledger.records.END_REASONS``), from what the run's
ranks on this node did: ``crashed`` if any rank's description said
``ended: crashed``; else ``preempted`` if any said ``preempted``; else
``lost`` if any rank went silent without an ``ended`` (it expired past the
training TTL, was evicted, or went on with another run); else ``finished``
once all said ``finished`` (``combined_end_reason``). The run ends when no
rank reports or describes it any more, or as soon as every description of it
says ``ended``. Once an end of the run was announced, a rank that went on with
another run counts as ``finished``: its next run may have replaced its ended
description before a tick read it (the store remembers that some rank
announced an end, not which rank nor the word). ``stalled``: its ranks report
but no step completed for ``stall_seconds`` (cleared when steps resume).
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
    started: float | None = None
    world_size: int | None = None
    #: rank -> how its description said the run ended (``RUN_END_REASONS``).
    said: dict[int, str] = field(default_factory=dict)
    #: The store remembers an end announced for the run (``ended_runs``), maybe by a
    #: description that the rank's next run replaced before a tick read it.
    announced: bool = False
    #: data path -> its storage once resolved: mountpoint, fstype, storage.
    storages: dict[str, dict[str, str]] = field(default_factory=dict)
    last_progress: float | None = None
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

    def record(self, node: str, wall: float, config: LedgerConfig) -> RunRecord:
        started = self.started if self.started is not None else self.first_seen
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
        """What a restarted daemon resumes the run from (``Ledger.state``)."""
        return {**self.totals.to_state(), "data_storage": self.storages}


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
        run.end_reason = end_reason(run, live, index)
        run.ended = wall if run.last_report is None else min(run.last_report, wall)
        return
    if described and not running and (run.said or run.announced):
        run.end_reason, run.ended = end_reason(run, live, index), wall
        return
    since = run.last_progress if run.last_progress is not None else (
        run.started if run.started is not None else run.first_seen)
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
