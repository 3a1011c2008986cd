"""The demo's run history: an earlier, faster run of each demo job, in the demo's own ledger.

``trainmon serve --demo`` records its runs in ``demo-ledger.sqlite3`` beside the
default ledger of the user running it (``demo_ledger_path``: root's
``/var/lib/trainmon/demo-ledger.sqlite3``, any other user's
``$XDG_STATE_HOME/trainmon/demo-ledger.sqlite3``; the CLI makes the folder as
the daemon makes its default one), unless the configuration sets
``collectors.ledger.path``: so that ``trainmon runs --ledger FILE`` finds them
after the demo stopped, and so that simulated runs never land in the ledger a
real daemon of the node keeps. The CLI logs both commands at start.

At every start ``seed_history`` writes, through the ledger API, the record of
each ``EARLIER_RUNS`` run the ledger lacks, so the history stays one copy
however often the demo starts (each start adds its own runs, with new run
ids: per job a run that crashes on purpose and its restart,
``trainmon.demo.jobs.runs_per_start``). A seeded run that ended more than
``STALE_SECONDS`` before a start is dated again, to end 30 minutes before it:
``trainmon doctor`` measures a run against the fastest comparable run of the
last ``contract.THROUGHPUT_BEST_LOOKBACK_SECONDS`` too, so a demo started again
after a week still shows its slowdown. Each earlier run has the config, hence
the ``config_hash``, of today's job, its world size and ranks, and differs from
it in one thing, which made it faster:

- ``demo-healthy-baseline``: ``NCCL_ALGO=Ring`` where today's run sets
  ``Tree``; its gradient sync stayed hidden under compute (0.185 s steps,
  about 690 samples/s per rank against today's 512: today's is 26 % slower);
- ``demo-starved-baseline``: its dataset on the instance's local NVMe
  (``/data``) where today's reads it from CFS; 0.01 s of data wait a step
  instead of 0.14 (0.27 s steps, 237 samples/s per rank against 160: 32 %
  slower).

So ``trainmon compare demo-healthy-baseline <today's run>`` names the NCCL
change and the slowdown, ``trainmon doctor``'s "Run history" measures today's
runs against them (the runs that crashed on purpose are not finished, so they
are passed over), and, for a Prometheus that saw the earlier runs,
``TrainmonThroughputRegression`` pages for both jobs. Each record is what the
recorder (``trainmon.ledger.recorder``) would have written: the description
as the client describes a run (``RunDescriber``: the same versions, host and
git commit as today's), its data paths resolved on the simulated node's
mounts, and the summary computed by the ledger's own math (``RunTotals``) from
two hours of 10-second ticks of the job's simulated progress (its step sketch as
the client sends it: exact percentiles) under a
``compute`` verdict, its GPU time booked as the goodput ledger books it
(productive, data wait, exposed communication, checkpoints), at the
configured price. It ended 30 minutes before the start that seeded (or dated)
it.
"""

from __future__ import annotations

import bisect
import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from trainmon import contract
from trainmon.client.reporter import CHECKPOINT_PHASE
from trainmon.client.run import RunDescriber
from trainmon.contract import STEP_BUCKET_COUNT, STEP_SECONDS_BOUNDS
from trainmon.demo.jobs import (
    CHECKPOINT_INTERVAL_SECONDS,
    DEMO_JOBS,
    RANKS_PER_JOB,
    SimulatedJob,
)
from trainmon.demo.node import MOUNTINFO
from trainmon.ledger import Ledger, RecordUpdate, RunRecord
from trainmon.ledger.config import LedgerConfig
from trainmon.ledger.summary import COMM_PHASE, Progress, RunTotals
from trainmon.node.mounts import classify, find_mount, parse_mountinfo
from trainmon.training.sketch import StepSketch, index_of
from trainmon.training.writers import LOCAL_WRITER

#: The demo's ledger file, in the folder of the user's default ledger.
DEMO_LEDGER_NAME = "demo-ledger.sqlite3"
#: The simulated instance's price of one GPU hour (``collectors.ledger.price_per_gpu_hour``
#: unless the configuration sets one), in the configured currency (USD by default).
PRICE_PER_GPU_HOUR = 2.5
#: How long each earlier run ran, and how long before the first seeding it ended.
EARLIER_RUN_SECONDS = 7200.0
EARLIER_RUN_ENDED_BEFORE_SECONDS = 1800.0
#: A seeded run that ended longer ago than this at a start is dated again (half the
#: look-back of the fastest comparable run: it stays in it for days of a running demo).
STALE_SECONDS = contract.THROUGHPUT_BEST_LOOKBACK_SECONDS / 2
#: The recorder's tick (``collectors.ledger.flush_seconds``' default): one rate bucket.
TICK_SECONDS = LedgerConfig().flush_seconds
#: Tick-to-tick spread of the simulated step time (the ranks' ±10 % per phase, averaged
#: over a tick's steps).
TICK_JITTER = 0.015
#: The keys of a record's description that the recorder copies from the run description.
_DESCRIPTION_KEYS = ("job", "run", "started", "world_size", "config_hash", "config",
                     "environment", "versions", "git", "host", "framework")


@dataclass(frozen=True)
class EarlierRun:
    """A finished run of a demo job from before the demo started."""

    #: The job as it ran then: today's name, config and batch size, other timings and
    #: environment or data paths.
    job: SimulatedJob
    run: str
    #: The diagnosis' verdict while it ran (``trainmon_bottleneck`` kind).
    verdict: str = "compute"

    @property
    def samples_per_second_per_rank(self) -> float:
        return self.job.batch_size / self.job.step_seconds


def _earlier_runs() -> tuple[EarlierRun, ...]:
    jobs = {job.name: job for job in DEMO_JOBS}
    healthy, starved = jobs["demo-healthy"], jobs["demo-starved"]
    return (
        EarlierRun(dataclasses.replace(healthy, compute_seconds=0.17, comm_seconds=0.005,
                                       environment={"NCCL_ALGO": "Ring"}),
                   "demo-healthy-baseline"),
        EarlierRun(dataclasses.replace(starved, data_wait_seconds=0.01,
                                       data_paths=("/data/datasets/demo-starved",)),
                   "demo-starved-baseline"),
    )


EARLIER_RUNS = _earlier_runs()


def demo_ledger_path(default: Path) -> Path:
    """The demo's ledger beside ``default``, the ledger of the user's own daemon."""
    return default.with_name(DEMO_LEDGER_NAME)


def seed_history(
    config: LedgerConfig,
    *,
    sys_root: Path,
    now: float,
    runs: Sequence[EarlierRun] = EARLIER_RUNS,
) -> list[RunRecord]:
    """Write the record of each of ``runs`` that the ledger ``config.file`` lacks, or holds
    as ended more than ``STALE_SECONDS`` before ``now`` (making the file when missing, in
    a folder that must exist); the records written, none when every run is there and
    recent. ``sys_root`` is the simulated node's ``/sys`` (the data paths' storage);
    ``now`` (Unix seconds) dates the runs. ``LedgerError`` when the file cannot be
    used."""
    with Ledger.open(config.file, readonly=False) as ledger:
        missing = [run for run in runs
                   if not any(record.ended is not None and record.ended >= now - STALE_SECONDS
                              for record in ledger.get(run.run, job=run.job.name))]
        updates = [_update(run, config, sys_root, now) for run in missing]
        if updates:
            ledger.write(updates)
    return [update.record for update in updates]


def _update(earlier: EarlierRun, config: LedgerConfig, sys_root: Path,
            now: float) -> RecordUpdate:
    job = earlier.job
    ended = now - EARLIER_RUN_ENDED_BEFORE_SECONDS
    started = ended - EARLIER_RUN_SECONDS
    described = RunDescriber(
        job=job.name, rank=0, reporter_id="0" * 16, world_size=RANKS_PER_JOB,
        run=earlier.run, started=started, environ=dict(job.environment), config=job.config,
        data_paths=job.data_paths,
    ).description()
    description = {key: described[key] for key in _DESCRIPTION_KEYS}
    description["data_paths"] = [_storage(path, sys_root) for path in job.data_paths]
    totals = _totals(earlier, started, ended)
    record = RunRecord(
        job=job.name, run=earlier.run, node=config.node_name,
        config_hash=str(described["config_hash"]), started=started, ended=ended,
        end_reason="finished", updated=ended, world_size=RANKS_PER_JOB, ranks=RANKS_PER_JOB,
        description=description,
        summary=totals.summary(ranks=RANKS_PER_JOB, duration_seconds=EARLIER_RUN_SECONDS,
                               price_per_gpu_hour=config.price_per_gpu_hour,
                               currency=config.currency),
        owner=LOCAL_WRITER,
    )
    return RecordUpdate(record, totals.to_state())


def _totals(earlier: EarlierRun, started: float, ended: float) -> RunTotals:
    """The run's measurements as the recorder adds them up, tick by tick, its steps from
    ``started`` to ``ended`` (Unix)."""
    job = earlier.job
    jitter = random.Random(earlier.run)
    totals = RunTotals()
    totals.note_active(started, ended)
    for _ in range(int(EARLIER_RUN_SECONDS / TICK_SECONDS)):
        samples = 0
        for _rank in range(RANKS_PER_JOB):
            factor = jitter.uniform(1 - TICK_JITTER, 1 + TICK_JITTER)
            step = job.step_seconds * factor
            steps = round(TICK_SECONDS / step)
            buckets = [0] * STEP_BUCKET_COUNT
            buckets[bisect.bisect_left(STEP_SECONDS_BOUNDS, step)] = steps
            comm = steps * job.comm_seconds * factor
            checkpoint = job.checkpoint_seconds * TICK_SECONDS / CHECKPOINT_INTERVAL_SECONDS
            data_wait = steps * job.data_wait_seconds * factor
            totals.add(Progress(
                steps=steps, samples=steps * job.batch_size, step_seconds=steps * step,
                data_wait_seconds=data_wait,
                step_buckets=buckets,
                step_sketch=StepSketch({index_of(step): steps}),
                phase_seconds={COMM_PHASE: comm, CHECKPOINT_PHASE: checkpoint},
                comm_exposed_seconds=comm,
            ))
            # the goodput ledger's booking of the rank's tick (``trainmon.ledger.goodput``)
            totals.add_gpu_seconds({
                "productive": max(TICK_SECONDS - data_wait - comm - checkpoint, 0.0),
                "data_wait": data_wait, "comm_exposed": comm, "checkpoint": checkpoint})
            samples += steps * job.batch_size
        totals.add_window(samples / TICK_SECONDS, TICK_SECONDS)
        totals.add_verdict(earlier.verdict, TICK_SECONDS)
    totals.final_verdict = earlier.verdict
    return totals


def _storage(path: str, sys_root: Path) -> dict[str, str]:
    """Where ``path`` lives on the simulated node, as the recorder stores a data path."""
    mount = find_mount(parse_mountinfo(MOUNTINFO).mounts, path)
    if mount is None:
        return {"path": path, "mountpoint": "", "fstype": "", "storage": "unknown"}
    return {"path": path, "mountpoint": mount.mountpoint, "fstype": mount.fstype,
            "storage": classify(mount, sys_root)}
