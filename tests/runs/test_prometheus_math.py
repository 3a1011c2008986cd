"""The arithmetic of ``trainmon.runs.prometheus`` over query results (Prometheus' JSON)."""

from __future__ import annotations

import pytest

from trainmon.runs.prometheus import throughput_summary


def series(values: list[tuple[float, float]], rank: str = "0",
           instance: str = "n1:19400") -> dict[str, object]:
    return {"metric": {"instance": instance, "rank": rank},
            "values": [[t, str(v)] for t, v in values]}


def test_samples_per_loop_second_summed_over_ranks_idle_tail_ignored() -> None:
    # rank 0: 100 samples per loop second; rank 1: 50; then both idle (finished)
    times = [1000.0 + i for i in range(60)]
    loop = [(t, min(i, 40) * 1.0) for i, t in enumerate(times)]
    samples0 = [(t, min(i, 40) * 100.0) for i, t in enumerate(times)]
    samples1 = [(t, min(i, 40) * 50.0) for i, t in enumerate(times)]
    result = throughput_summary([series(samples0), series(samples1, rank="1")],
                                [series(loop), series(loop, rank="1")])
    assert result["samples_per_second_median"] == pytest.approx(150.0)
    assert result["samples_per_second_p10"] == pytest.approx(150.0)
    assert result["samples"] == 40 * 150.0
    assert result["duration_seconds"] == 40.0


def test_a_reset_interval_is_skipped_not_counted_negative() -> None:
    loop = [(0.0, 0.0), (1.0, 1.0), (2.0, 0.5), (3.0, 1.5)]
    samples = [(0.0, 0.0), (1.0, 10.0), (2.0, 5.0), (3.0, 15.0)]
    result = throughput_summary([series(samples)], [series(loop)])
    assert result["samples_per_second_median"] == pytest.approx(10.0)
    assert result["samples"] == 20.0


def test_no_samples_no_throughput() -> None:
    assert throughput_summary([], [])["samples_per_second_median"] is None
