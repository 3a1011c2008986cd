"""What the goodput ledger costs the daemon: the scrape with 64 jobs booked, and a tick.

In process, without HTTP, alternately so that both see the same machine load:
the exposition (the daemon's ``TextEncoder``, what ``/metrics`` serves in the
text format) of a registry holding this machine's network and disk collectors
(the set ``bench.node_scrape`` runs) and the ``ledger`` collector, once with no
job booked and once with ``MAX_GOODPUT_JOBS`` (64) jobs of ``--ranks`` ranks each
booked (``trainmon_job_gpu_seconds_total``: 640 series, ``trainmon_job_goodput_ratio``
and ``trainmon_job_team_info``: 64 each). The booking itself runs on the recorder's
thread, never in a scrape: its cost per tick (``RunRecorder.tick`` with those jobs
reporting, the ledger file written) is measured too.

    .venv/bin/python -m bench.goodput_scrape                # 2000 expositions each
    .venv/bin/python -m bench.goodput_scrape --rounds 500 --ranks 8

Prints a markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from bench import benchlib
from bench.self_metrics import NODE_ONLY, timed
from trainmon.cli import collectors_for
from trainmon.collectors.ledger import LedgerCollector
from trainmon.collectors.training import TrainingCollector, TrainingConfig
from trainmon.contract import STEP_BUCKET_COUNT
from trainmon.core.exposition import TextEncoder
from trainmon.core.registry import CollectorRegistry
from trainmon.ledger.config import LedgerConfig
from trainmon.ledger.recorder import MAX_GOODPUT_JOBS, RunRecorder
from trainmon.training.receiver import ingest_payload
from trainmon.training.writers import LOCAL_WRITER

#: Seconds between two booking ticks of the simulated reports.
TICK_SECONDS = 10.0


class Clock:
    def __init__(self) -> None:
        self.wall = time.time()

    def now(self) -> float:
        return self.wall


def lines(job: str, rank: int, ranks: int, steps: int, started: float) -> list[dict[str, object]]:
    """A run description and a cumulative step report of ``job``'s rank ``rank``."""
    buckets = [0] * STEP_BUCKET_COUNT
    buckets[5] = steps
    reporter = f"{abs(hash((job, rank))) % 16 ** 16:016x}"
    return [
        {"v": 1, "type": "run", "job": job, "rank": rank, "reporter_id": reporter,
         "run": f"{job}-run", "started": started, "world_size": ranks,
         "config_hash": "sha256:0000000000000000", "config": {}, "environment": {},
         "data_paths": [], "versions": {}, "git": None, "host": "bench", "framework": {}},
        {"v": 1, "job": job, "rank": rank, "world_size": ranks, "pid": 10_000 + rank,
         "reporter_id": reporter, "run": f"{job}-run", "steps": steps, "samples": steps * 32,
         "step_seconds": steps * 0.25, "data_wait_seconds": steps * 0.05,
         "phase_seconds": {"comm": steps * 0.02}, "comm_seconds": steps * 0.1,
         "comm_exposed_seconds": steps * 0.02 + rank * 0.001 * steps,
         "step_buckets": buckets, "dropped_reports": 0},
    ]


def booked_ledger(folder: Path, jobs: int, ranks: int) -> tuple[LedgerCollector, list[float]]:
    """A ledger collector whose recorder booked ``jobs`` jobs of ``ranks`` ranks; and the
    seconds each of its booking ticks took."""
    clock = Clock()
    training = TrainingCollector(
        TrainingConfig(socket=None, ttl_seconds=3600.0, max_jobs=max(jobs, 1),
                       max_ranks_per_job=max(ranks, 1)),
        wall_clock=clock.now)
    training.start()
    recorder = RunRecorder(LedgerConfig(path=folder / "ledger.sqlite3", node="bench",
                                        flush_seconds=3600.0),
                           training.store, training.storage_of, wall_clock=clock.now)
    ledger = LedgerCollector(recorder)
    ledger.start()
    ticks = []
    started = clock.wall
    for tick in range(6):
        for job in range(jobs):
            for rank in range(ranks):
                payload = b"".join(json.dumps(line).encode() + b"\n" for line in lines(
                    f"job-{job:02d}", rank, ranks, 40 * tick, started))
                result = ingest_payload(training.store, payload, "http", 128,
                                        identity=LOCAL_WRITER)
                assert not result.errors, result.errors[:3]
        ticks.append(timed(recorder.tick))
        clock.wall += TICK_SECONDS
    return ledger, ticks[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--ranks", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        for name in ("empty", "full"):
            (Path(scratch) / name).mkdir()
        empty, _ = booked_ledger(Path(scratch) / "empty", 0, 0)
        full, ticks = booked_ledger(Path(scratch) / "full", MAX_GOODPUT_JOBS, args.ranks)
        registries, encoders = {}, {}
        for name, ledger in (("without", empty), ("with", full)):
            registry = CollectorRegistry([*collectors_for(NODE_ONLY), ledger])
            registry.start()
            registries[name], encoders[name] = registry, TextEncoder()

        def expose(name: str) -> bytes:
            return encoders[name].encode(registries[name].collect())

        sizes = {name: len(expose(name)) for name in registries}
        times: dict[str, list[float]] = {"without": [], "with": [], "ledger": []}
        for _ in range(args.rounds):
            times["without"].append(timed(lambda: expose("without")))
            times["with"].append(timed(lambda: expose("with")))
            times["ledger"].append(timed(lambda: list(full.collect())))
        series = sum(len(family.samples) for family in full.collect()
                     if family.name.startswith("trainmon_job_"))
    print(f"{args.rounds} alternating expositions each; {MAX_GOODPUT_JOBS} jobs × "
          f"{args.ranks} ranks booked; {os.cpu_count()} CPUs\n")
    print("| exposition | p50 µs | p99 µs | body bytes |")
    print("| --- | --- | --- | --- |")
    for label, key in (("network+disk+ledger, no job", "without"),
                       (f"network+disk+ledger, {MAX_GOODPUT_JOBS} jobs ({series} job series)",
                        "with")):
        print(f"| {label} | {benchlib.percentile(times[key], 0.5) * 1e6:.0f} | "
              f"{benchlib.percentile(times[key], 0.99) * 1e6:.0f} | {sizes[key]} |")
    base = benchlib.percentile(times["without"], 0.5) * 1e6
    added = benchlib.percentile(times["with"], 0.5) * 1e6 - base
    alone = benchlib.percentile(times["ledger"], 0.5) * 1e6
    print(f"\nledger collector alone with {MAX_GOODPUT_JOBS} jobs: p50 {alone:.0f} µs; "
          f"added to the exposition: p50 {added:+.0f} µs ({added / base:+.0%})")
    print(f"recorder tick ({MAX_GOODPUT_JOBS * args.ranks} ranks booked, the ledger written): "
          f"median {sorted(ticks)[len(ticks) // 2] * 1e3:.1f} ms, max {max(ticks) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
