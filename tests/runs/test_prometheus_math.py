"""The arithmetic of ``trainmon.runs.prometheus`` over query results (Prometheus' JSON)."""

from __future__ import annotations

import math

import pytest

from trainmon.runs.prometheus import throughput_summary


def series(values: list[tuple[float, float]], rank: str = "0",
           instance: str = "n1:19400") -> dict[str, object]:
    return {"metric": {"instance": instance, "rank": rank},
            "values": [[t, str(v)] for t, v in values]}


def stepping(first_step_start: float, step_seconds: float, samples_per_step: float,
             steps: int, scrapes: list[float]) -> tuple[list[tuple[float, float]], ...]:
    """A rank's (samples, step seconds, last step end) as scraped at ``scrapes``: ``steps``
    contiguous steps from ``first_step_start``, the first timed from there (the client's
    loop start); the last step end only once a step ended."""
    samples, loop, ends = [], [], []
    for at in scrapes:
        done = min(steps, max(0, math.floor((at - first_step_start) / step_seconds + 1e-9)))
        samples.append((at, done * samples_per_step))
        loop.append((at, done * step_seconds))
        if done:
            ends.append((at, first_step_start + done * step_seconds))
    return samples, loop, ends


def test_samples_per_loop_second_summed_over_ranks_idle_tail_ignored() -> None:
    # rank 0: 100 samples per loop second; rank 1: 50; then both idle (finished)
    times = [1000.0 + i for i in range(60)]
    loop = [(t, min(i, 40) * 1.0) for i, t in enumerate(times)]
    samples0 = [(t, min(i, 40) * 100.0) for i, t in enumerate(times)]
    samples1 = [(t, min(i, 40) * 50.0) for i, t in enumerate(times)]
    ends = [(t, 1000.0 + min(i, 40)) for i, t in enumerate(times) if i]
    result = throughput_summary([series(samples0), series(samples1, rank="1")],
                                [series(loop), series(loop, rank="1")],
                                [series(ends), series(ends, rank="1")])
    assert result["samples_per_second"] == pytest.approx(150.0)
    assert result["samples_per_second_median"] == pytest.approx(150.0)
    assert result["samples_per_second_p10"] == pytest.approx(150.0)
    assert result["samples"] == 40 * 150.0
    assert result["duration_seconds"] == 40.0


def test_the_exact_rate_is_samples_over_the_steps_own_time_not_the_scrapes() -> None:
    # Steps start 0.1 s after a scrape and the last ends 0.1 s after another: the scrapes
    # span 41 s around 40 s of steps (2 400 samples: 58.5/s by the scrapes), and a
    # rank 0.25 s/step beside one 0.5 s/step make 60/s over the node's active time.
    scrapes = [1000.0 + i for i in range(60)]
    fast = stepping(1000.1, 0.25, 10.0, 160, scrapes)
    slow = stepping(1000.1, 0.5, 10.0, 80, scrapes)
    result = throughput_summary([series(fast[0]), series(slow[0], rank="1")],
                                [series(fast[1]), series(slow[1], rank="1")],
                                [series(fast[2]), series(slow[2], rank="1")])
    assert result["samples"] == 2400.0
    assert result["samples_per_second"] == pytest.approx(60.0, rel=1e-9)


def test_nodes_add_up_each_over_its_own_active_time() -> None:
    # n1's ranks step from before its first scrape: the steps before it are counted
    # neither in its samples nor in its time (the scrape interval's precision); n2 ran
    # later and shorter. Each node's rate is exact for what it counts; the run's is the
    # sum, as compare adds the nodes' ledgers up.
    scrapes = [1000.0 + 15 * i for i in range(20)]
    n1 = stepping(995.0, 0.2, 8.0, 1000, scrapes)      # 40/s, 200 s, 5 s before the scrapes
    n2 = stepping(1031.0, 0.5, 10.0, 120, scrapes)     # 20/s, 60 s
    result = throughput_summary(
        [series(n1[0]), series(n2[0], instance="n2:19400")],
        [series(n1[1]), series(n2[1], instance="n2:19400")],
        [series(n1[2]), series(n2[2], instance="n2:19400")])
    assert result["samples"] == (1000 - 25) * 8.0 + 120 * 10.0
    assert result["samples_per_second"] == pytest.approx(60.0, rel=1e-9)


def test_a_warm_up_before_the_first_scrape_is_not_counted() -> None:
    # A 3 s first step (warm-up) ends before the run's first scrape: the ledger's rate
    # counts it (10 samples / 3 s beside 0.1 s steps), Prometheus cannot, and reads the
    # steady 100/s from the first scrape on.
    scrapes = [1003.5 + i for i in range(30)]
    samples = [(at, 10.0 + 10.0 * min(200, math.floor((at - 1003.0) / 0.1 + 1e-9)))
               for at in scrapes]
    loop = [(at, 3.0 + 0.1 * min(200, math.floor((at - 1003.0) / 0.1 + 1e-9)))
            for at in scrapes]
    ends = [(at, 1003.0 + 0.1 * min(200, math.floor((at - 1003.0) / 0.1 + 1e-9)))
            for at in scrapes]
    result = throughput_summary([series(samples)], [series(loop)], [series(ends)])
    assert result["samples_per_second"] == pytest.approx(100.0, rel=1e-9)


def test_a_step_whose_end_prometheus_lacks_leaves_the_exact_rate_unknown() -> None:
    scrapes = [1000.0 + i for i in range(20)]
    samples, loop, ends = stepping(1000.5, 0.5, 10.0, 30, scrapes)
    result = throughput_summary([series(samples)], [series(loop)], [series(ends[:5])])
    assert result["samples_per_second"] is None
    assert result["samples_per_second_median"] == pytest.approx(20.0)


def test_a_reset_interval_is_skipped_not_counted_negative() -> None:
    loop = [(0.0, 0.0), (1.0, 1.0), (2.0, 0.5), (3.0, 1.5)]
    samples = [(0.0, 0.0), (1.0, 10.0), (2.0, 5.0), (3.0, 15.0)]
    ends = [(1.0, 1.0), (2.0, 1.5), (3.0, 2.5)]
    result = throughput_summary([series(samples)], [series(loop)], [series(ends)])
    assert result["samples_per_second_median"] == pytest.approx(10.0)
    assert result["samples"] == 20.0
    # 20 samples of the two intervals counted, from the first step (0 s) to the last end
    assert result["samples_per_second"] == pytest.approx(20.0 / 2.5)


def test_no_samples_no_throughput() -> None:
    result = throughput_summary([], [], [])
    assert result["samples_per_second"] is None
    assert result["samples_per_second_median"] is None
