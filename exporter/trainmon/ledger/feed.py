"""What the run recorder reads of the training store: a read-only interface.

The recorder (``trainmon.ledger.recorder``) needs, once per tick, a
consistent copy of the training store (every reporting rank's cumulative
totals and last checkpoint, every rank's latest run description, the runs
whose end was announced) and, for a data or checkpoint path a training process
named, the storage that path lives on. These protocols say exactly that much,
read-only, so that the ledger depends on no training store or collector module (it shares only
the stall rule of ``trainmon.training.stalls`` and the step sketch of
``trainmon.training.sketch``):
``trainmon.training.store.TrainingStore`` is a ``TrainingSource`` (its
``snapshot()`` is a ``TrainingStoreView``, which is a ``TrainingSnapshot``),
and the training collector's ``storage_of`` a ``StorageResolver``; the ledger
collector (``trainmon.collectors.ledger``) hands both over. A test fake can
be any object of the same shape.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, TypeVar

from trainmon.training.sketch import StepSketch
from trainmon.training.stalls import FrameLike

_Totals = TypeVar("_Totals", bound="StepTotals")


class StepTotals(Protocol):
    """One rank's cumulative totals (``trainmon.training.store.Totals``)."""

    @property
    def steps(self) -> int: ...
    @property
    def samples(self) -> int: ...
    @property
    def step_seconds(self) -> float: ...
    @property
    def data_wait_seconds(self) -> float: ...
    @property
    def step_buckets(self) -> Sequence[int]: ...
    @property
    def phase_seconds(self) -> Mapping[str, float]: ...
    #: None where the rank does not measure communication (unknown, not zero).
    @property
    def comm_exposed_seconds(self) -> float | None: ...
    #: Per process group, what it carried (``trainmon.training.report_fields.CommGroup``).
    @property
    def comm_groups(self) -> Mapping[str, GroupSeen]: ...
    #: None where the rank does not report checkpoints.
    @property
    def checkpoints(self) -> int | None: ...
    #: Seconds in those saves; None where the rank does not report checkpoints.
    @property
    def checkpoint_seconds(self) -> float | None: ...
    #: Step durations by sketch bucket (``trainmon.training.sketch``), cumulative like
    #: ``step_buckets``; None where the rank's client sends none (an older one).
    @property
    def step_sketch(self) -> StepSketch | None: ...

    def covers(self: _Totals, earlier: _Totals) -> bool:
        """True when no total is below ``earlier``'s (the same reporter, no reset)."""
        ...


class GroupSeen(Protocol):
    """One process group's totals of a rank (``trainmon.training.report_fields.CommGroup``)."""

    @property
    def exposed_seconds(self) -> float | None: ...
    #: The lowest global rank in the group; None where the rank does not say.
    @property
    def root(self) -> int | None: ...


class CheckpointSeen(Protocol):
    """The latest checkpoint a rank reported (``trainmon.training.store.LastCheckpoint``)."""

    @property
    def time(self) -> float: ...
    @property
    def duration_seconds(self) -> float: ...
    @property
    def path(self) -> str | None: ...


class StallSeen(Protocol):
    """A rank's latest stall report (``trainmon.training.protocol.StallReport``)."""

    @property
    def where(self) -> str: ...
    @property
    def since(self) -> float: ...
    @property
    def frames(self) -> Sequence[FrameLike]: ...


class ReportingRank(Protocol):
    """One rank's latest state (``trainmon.training.store.RankView``)."""

    @property
    def job(self) -> str: ...
    @property
    def rank(self) -> int: ...
    #: The run id of its latest report that named one.
    @property
    def run(self) -> str | None: ...
    #: The writer identity owning the rank's job.
    @property
    def owner(self) -> str: ...
    @property
    def pid(self) -> int | None: ...
    #: The sender as the kernel names it, for the paths' mount namespace.
    @property
    def sender_pid(self) -> int | None: ...
    @property
    def world_size(self) -> int | None: ...
    #: The NVML index of its GPU as the rank reports it; None when it cannot tell.
    @property
    def gpu(self) -> str | None: ...
    #: Unix time of the rank's latest accepted report.
    @property
    def last_report_time(self) -> float: ...
    #: Unix time its latest step ended (the sender's, never ahead of the daemon's clock).
    @property
    def last_step_time(self) -> float | None: ...
    @property
    def totals(self) -> StepTotals: ...
    @property
    def last_checkpoint(self) -> CheckpointSeen | None: ...
    #: Where its training thread is while its client reports a stall, else None.
    @property
    def stall(self) -> StallSeen | None: ...


class RunDescribed(Protocol):
    """A validated, redacted run description (``trainmon.training.protocol.RunDescription``)."""

    @property
    def job(self) -> str: ...
    @property
    def run(self) -> str: ...
    @property
    def started(self) -> float: ...
    @property
    def world_size(self) -> int | None: ...
    @property
    def config_hash(self) -> str: ...
    @property
    def config(self) -> Mapping[str, object]: ...
    @property
    def environment(self) -> Mapping[str, str]: ...
    @property
    def data_paths(self) -> Sequence[str]: ...
    @property
    def versions(self) -> Mapping[str, str]: ...
    @property
    def git_commit(self) -> str | None: ...
    @property
    def git_dirty(self) -> bool | None: ...
    @property
    def host(self) -> str: ...
    @property
    def framework(self) -> Mapping[str, object]: ...
    #: None while the run goes on; how it ended in its last description.
    @property
    def ended(self) -> str | None: ...


class DescribingRank(Protocol):
    """A rank's latest run description (``trainmon.training.store.DescribedRank``)."""

    @property
    def description(self) -> RunDescribed: ...
    @property
    def owner(self) -> str: ...
    @property
    def sender_pid(self) -> int | None: ...


class AnnouncedEnd(Protocol):
    """A run a description said ended (``trainmon.training.store.EndedRun``)."""

    @property
    def owner(self) -> str: ...
    #: rank -> how its description said the run ended.
    @property
    def said(self) -> Mapping[int, str]: ...


class TrainingSnapshot(Protocol):
    """A consistent copy of the training store (``trainmon.training.store.TrainingStoreView``)."""

    @property
    def ranks(self) -> Sequence[ReportingRank]: ...
    #: (job, rank) -> its latest run description.
    @property
    def descriptions(self) -> Mapping[tuple[str, int], DescribingRank]: ...
    #: (job, run) -> the end announced for it within the training TTL.
    @property
    def ended_runs(self) -> Mapping[tuple[str, str], AnnouncedEnd]: ...


class TrainingSource(Protocol):
    """Where the recorder reads the training store from (``TrainingStore``)."""

    def snapshot(self) -> TrainingSnapshot: ...


class PathLocation(Protocol):
    """The storage a path lives on (``trainmon.node.mounts.PathStorage``)."""

    @property
    def mountpoint(self) -> str: ...
    @property
    def fstype(self) -> str: ...
    #: ``local_nvme``, ``cfs``...; ``unknown`` when it could not be told.
    @property
    def storage(self) -> str: ...


class StorageResolver(Protocol):
    """The storage of a path a training process named, in its mount namespace
    (``TrainingCollector.storage_of``); ``unknown`` when it cannot be told."""

    def __call__(self, path: str, pid: int | None, sender_pid: int | None,
                 owner: str) -> PathLocation:
        """``owner``: the writer identity that named the path, whose permissions it is
        looked up with."""
        ...
