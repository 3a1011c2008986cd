"""A 2-D job's samples count once per data-parallel replica in its run's record.

The ranks of one tensor-parallel group (and the stages of one pipeline, and the ranks
of one context-parallel group) train on the same rows, and each client counts them as
it sees its batch: the run ledger adds a rank's samples only where the rank is the
lowest of such groups (its ``comm_groups``' ``root``), so that samples/s is the job's,
not the job's times its tensor- or pipeline-parallel degree
(``tests/ledger/test_parallel_rate_acceptance.py`` holds it to real jobs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.ledger.ledger_support import (
    Clocks,
    description,
    only_record,
    recording,
    send,
    step,
)

#: Steps of 0.1 s and 32 samples each rank does per 10 s interval, and the intervals.
STEPS_PER_INTERVAL = 100
INTERVALS = 5


def groups_of(layout: str, rank: int) -> dict[str, dict[str, object]]:
    """The ``comm_groups`` of ``rank`` (without its counts) in a job laid out as ``layout``."""
    if layout == "dp2_tp2":  # a 2×2 mesh: tp groups {0,1} and {2,3}, dp {0,2} and {1,3}
        return {"tp": {"root": rank - rank % 2}, "dp": {"root": rank % 2}}
    if layout == "pp2":  # two pipeline stages
        return {"pp": {"root": 0}}
    if layout == "tp2_rootless":  # a client that does not say its groups' roots
        return {"tp": {}}
    assert layout == "dp2", layout
    return {"dp": {"root": 0}}


@pytest.mark.parametrize(("layout", "ranks", "counted"), [
    ("dp2_tp2", 4, 2), ("pp2", 2, 1), ("tp2_rootless", 2, 2), ("dp2", 2, 2)])
def test_samples_count_once_per_data_parallel_replica(
        layout: str, ranks: int, counted: int, tmp_path: Path) -> None:
    clocks = Clocks()
    path = tmp_path / "ledger.sqlite3"
    started = clocks.wall

    def report(rank: int, steps: int) -> dict[str, object]:
        seconds = steps * 0.1
        groups = {name: {"collectives": steps, "bytes": steps, "seconds": seconds / 10,
                         **fields} for name, fields in groups_of(layout, rank).items()}
        return step(steps, rank=rank, world_size=ranks, reporter_id=f"reporter{rank:08d}",
                    pid=4242 + rank, run="run-2d", comm_seconds=seconds / 10,
                    comm_bytes=steps, comm_groups=groups)

    def described(rank: int, **changes: object) -> dict[str, object]:
        return description(rank=rank, world_size=ranks, reporter_id=f"reporter{rank:08d}",
                           run="run-2d", started=started, **changes)

    with recording(clocks, path, flush_seconds=3600.0) as (training, ledger):
        for rank in range(ranks):
            send(training, described(rank), report(rank, 0))
        ledger.tick()
        for interval in range(1, INTERVALS + 1):
            clocks.advance(10)
            for rank in range(ranks):
                send(training, report(rank, interval * STEPS_PER_INTERVAL))
            ledger.tick()
        for rank in range(ranks):
            send(training, described(rank, ended="finished"))
        ledger.tick()
    record = only_record(path, job="resnet50")
    summary = record.summary
    samples = counted * INTERVALS * STEPS_PER_INTERVAL * 32
    assert (record.end_reason, record.ranks) == ("finished", ranks)
    assert (summary["steps"], summary["samples"]) == (
        ranks * INTERVALS * STEPS_PER_INTERVAL, samples)
    assert summary["samples_per_second"] == pytest.approx(samples / (INTERVALS * 10.0))
    assert summary["samples_per_second_median"] == pytest.approx(samples / (INTERVALS * 10.0))
