"""TrainingCollector: reports in through POST, exposition out; resets, caps, TTL, window."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import cast

import pytest

from testkit.exposition import scrape
from tests.training.training_support import FakeClock, line, push, report
from trainmon.collectors.training import TrainingCollector
from trainmon.contract import STEP_BUCKET_COUNT
from trainmon.training.protocol import REJECT_REASONS
from trainmon.training.writers import uid_writer

#: The owner of the jobs these tests push: from loopback, by this test's own user.
OWNER = uid_writer(os.geteuid())

Make = Callable[..., TrainingCollector]


def totals(steps: int, seconds: float, wait: float, **changes: object) -> bytes:
    """A report line with ``steps`` steps of ``seconds / steps`` each (bucket le=1.0)."""
    buckets = [0] * STEP_BUCKET_COUNT
    buckets[6] = steps
    fields: dict[str, object] = {
        "steps": steps, "samples": steps * 32, "step_seconds": seconds,
        "data_wait_seconds": wait, "step_buckets": buckets, "phase_seconds": {},
    }
    fields.update(changes)
    return line(**fields)


def accept(collector: TrainingCollector, body: bytes) -> None:
    response = collector.handle_push(push(body))
    assert response.status == 200, response.payload


def test_report_becomes_every_rank_series(make_collector: Make) -> None:
    collector = make_collector()
    accept(collector, line())
    result = scrape(collector)
    rank = {"job": "resnet50", "owner": OWNER, "rank": "0"}
    assert result.value("trainmon_training_steps_total", **rank) == 10
    assert result.value("trainmon_training_samples_total", **rank) == 320
    assert result.value("trainmon_training_data_wait_seconds_total", **rank) == 0.5
    assert result.value("trainmon_training_phase_seconds_total", phase="comm", **rank) == 0.25
    assert result.value("trainmon_training_step_seconds_count", **rank) == 10
    assert result.value("trainmon_training_step_seconds_sum", **rank) == 2.0
    assert result.value("trainmon_training_step_seconds_bucket", le="0.1", **rank) == 0
    assert result.value("trainmon_training_step_seconds_bucket", le="0.25", **rank) == 10
    assert result.value("trainmon_training_step_seconds_bucket", le="+Inf", **rank) == 10
    assert result.value("trainmon_training_data_wait_ratio", **rank) == 0.25
    assert result.value("trainmon_training_last_step_timestamp_seconds", **rank) == 1.7e9
    assert result.labelsets("trainmon_training_rank_info") == [
        {"job": "resnet50", "owner": OWNER, "rank": "0", "gpu": "0", "pid": "4242"}
    ]
    assert result.value("trainmon_training_world_size", job="resnet50", owner=OWNER) == 8
    assert result.value("trainmon_training_reports_total", transport="http") == 1
    for reason in REJECT_REASONS:
        assert result.value("trainmon_training_rejected_reports_total", reason=reason) == 0
    assert "# TYPE trainmon_training_step_seconds histogram" in result.text


def test_unknown_gpu_and_pid_are_empty_labels(make_collector: Make) -> None:
    collector = make_collector()
    accept(collector, line(gpu=None, pid=None))
    assert scrape(collector).labelsets("trainmon_training_rank_info") == [
        {"job": "resnet50", "owner": OWNER, "rank": "0", "gpu": "", "pid": ""}
    ]


def test_repeated_and_stale_free_reports_change_nothing(make_collector: Make) -> None:
    collector = make_collector()
    for _ in range(3):
        accept(collector, totals(10, 5.0, 1.0))
    result = scrape(collector)
    assert result.value("trainmon_training_steps_total", job="resnet50", rank="0") == 10
    assert result.value("trainmon_training_reporter_resets_total", job="resnet50", rank="0") == 0


def test_reporter_restart_keeps_counters_monotonic(make_collector: Make) -> None:
    collector = make_collector()
    accept(collector, totals(100, 50.0, 10.0, reporter_id="first"))
    accept(collector, totals(120, 60.0, 12.0, reporter_id="first"))
    accept(collector, totals(5, 2.5, 0.5, reporter_id="second"))  # the process restarted
    accept(collector, totals(8, 4.0, 0.8, reporter_id="second"))
    result = scrape(collector)
    rank = {"job": "resnet50", "rank": "0"}
    assert result.value("trainmon_training_steps_total", **rank) == 128
    assert result.value("trainmon_training_samples_total", **rank) == 128 * 32
    assert result.value("trainmon_training_step_seconds_count", **rank) == 128
    assert result.value("trainmon_training_step_seconds_sum", **rank) == pytest.approx(64.0)
    assert result.value("trainmon_training_data_wait_seconds_total", **rank) == pytest.approx(12.8)
    assert result.value("trainmon_training_reporter_resets_total", **rank) == 1


def test_totals_going_backwards_for_one_reporter_is_a_reset(make_collector: Make) -> None:
    collector = make_collector()
    accept(collector, totals(100, 50.0, 10.0))
    accept(collector, totals(3, 1.5, 0.3))
    result = scrape(collector)
    assert result.value("trainmon_training_steps_total", job="resnet50", rank="0") == 103
    assert result.value("trainmon_training_reporter_resets_total", job="resnet50", rank="0") == 1


def test_two_live_reporters_on_one_rank_add_up(make_collector: Make) -> None:
    collector = make_collector()
    for step in (1, 2, 3):
        accept(collector, totals(step, step * 0.5, 0.0, reporter_id="alpha"))
        accept(collector, totals(step * 10, step * 5.0, 0.0, reporter_id="beta"))
    assert scrape(collector).value(
        "trainmon_training_steps_total", job="resnet50", rank="0"
    ) == 33


def test_phases_accumulate_across_restarts_and_stay_monotonic(make_collector: Make) -> None:
    collector = make_collector()
    accept(collector, totals(10, 5.0, 0.0, phase_seconds={"comm": 2.0}))
    accept(collector, totals(2, 1.0, 0.0, phase_seconds={"checkpoint": 0.5}, reporter_id="new1"))
    result = scrape(collector)
    rank = {"job": "resnet50", "rank": "0"}
    assert result.value("trainmon_training_phase_seconds_total", phase="comm", **rank) == 2.0
    assert result.value("trainmon_training_phase_seconds_total", phase="checkpoint", **rank) == 0.5


COMM_FAMILIES = (
    "trainmon_training_comm_seconds_total",
    "trainmon_training_comm_exposed_seconds_total",
    "trainmon_training_comm_bytes_total",
)


def test_measured_comm_is_exported_per_rank(make_collector: Make) -> None:
    collector = make_collector()
    accept(collector, totals(10, 5.0, 0.5, comm_seconds=2.0, comm_exposed_seconds=0.5,
                             comm_bytes=4_000_000))
    accept(collector, totals(10, 5.0, 0.5, rank=1))  # measures no communication
    result = scrape(collector)
    rank0 = {"job": "resnet50", "owner": OWNER, "rank": "0"}
    assert result.value("trainmon_training_comm_seconds_total", **rank0) == 2.0
    assert result.value("trainmon_training_comm_exposed_seconds_total", **rank0) == 0.5
    assert result.value("trainmon_training_comm_bytes_total", **rank0) == 4_000_000
    for name in COMM_FAMILIES:
        # Unknown is not zero: the rank that does not measure has no sample.
        assert result.labelsets(name) == [rank0], name
        assert f"# TYPE {name} counter" in result.text


def test_comm_without_exposed_or_bytes_exports_only_what_is_measured(
    make_collector: Make,
) -> None:
    collector = make_collector()
    accept(collector, totals(10, 5.0, 0.5, comm_seconds=2.0))
    result = scrape(collector)
    assert result.value("trainmon_training_comm_seconds_total", job="resnet50", rank="0") == 2.0
    assert result.labelsets("trainmon_training_comm_exposed_seconds_total") == []
    assert result.labelsets("trainmon_training_comm_bytes_total") == []


def test_measured_comm_stays_monotonic_across_restarts_and_resets(make_collector: Make) -> None:
    collector = make_collector()
    measured = {"comm_seconds": 3.0, "comm_exposed_seconds": 1.0, "comm_bytes": 1000}
    accept(collector, totals(100, 50.0, 10.0, reporter_id="first", **measured))
    accept(collector, totals(120, 60.0, 12.0, reporter_id="first", comm_seconds=4.0,
                             comm_exposed_seconds=1.5, comm_bytes=1500))
    accept(collector, totals(120, 60.0, 12.0, reporter_id="first", comm_seconds=4.0,
                             comm_exposed_seconds=1.5, comm_bytes=1500))  # repeated
    accept(collector, totals(5, 2.5, 0.5, reporter_id="second", comm_seconds=0.5,
                             comm_exposed_seconds=0.25, comm_bytes=100))  # restarted
    # The same reporter's comm totals going backwards is a reset too.
    accept(collector, totals(6, 3.0, 0.6, reporter_id="second", comm_seconds=0.2,
                             comm_exposed_seconds=0.1, comm_bytes=10))
    result = scrape(collector)
    rank = {"job": "resnet50", "rank": "0"}
    assert result.value("trainmon_training_comm_seconds_total", **rank) == pytest.approx(4.7)
    assert result.value(
        "trainmon_training_comm_exposed_seconds_total", **rank) == pytest.approx(1.85)
    assert result.value("trainmon_training_comm_bytes_total", **rank) == 1610
    assert result.value("trainmon_training_reporter_resets_total", **rank) == 2
    assert result.value("trainmon_training_steps_total", **rank) == 120 + 5 + 6


def test_a_report_without_comm_neither_resets_nor_double_counts_it(make_collector: Make) -> None:
    collector = make_collector()
    accept(collector, totals(10, 5.0, 0.5, comm_seconds=2.0, comm_exposed_seconds=0.5))
    accept(collector, totals(12, 6.0, 0.6))  # this report lacks the comm totals
    accept(collector, totals(14, 7.0, 0.7, comm_seconds=2.8, comm_exposed_seconds=0.7))
    result = scrape(collector)
    rank = {"job": "resnet50", "rank": "0"}
    assert result.value("trainmon_training_comm_seconds_total", **rank) == pytest.approx(2.8)
    assert result.value(
        "trainmon_training_comm_exposed_seconds_total", **rank) == pytest.approx(0.7)
    assert result.value("trainmon_training_reporter_resets_total", **rank) == 0
    assert result.value("trainmon_training_steps_total", **rank) == 14


def test_a_rank_that_starts_measuring_comm_gets_its_series_then(make_collector: Make) -> None:
    collector = make_collector()
    accept(collector, totals(10, 5.0, 0.5))
    assert scrape(collector).labelsets("trainmon_training_comm_seconds_total") == []
    accept(collector, totals(12, 6.0, 0.6, comm_seconds=1.0))
    accept(collector, totals(14, 7.0, 0.7, comm_seconds=1.5))
    assert scrape(collector).value(
        "trainmon_training_comm_seconds_total", job="resnet50", rank="0") == 1.5


def test_measured_comm_goes_with_the_expired_rank(make_collector: Make, clock: FakeClock) -> None:
    collector = make_collector(ttl_seconds=60.0)
    accept(collector, totals(10, 5.0, 0.5, comm_seconds=2.0, comm_exposed_seconds=0.5,
                             comm_bytes=10))
    clock.advance(61.0)
    result = scrape(collector)
    for name in COMM_FAMILIES:
        assert result.labelsets(name) == [], name


def test_dropped_reports_told_by_the_client_are_exported(make_collector: Make) -> None:
    collector = make_collector()
    accept(collector, line(dropped_reports=7))
    assert scrape(collector).value(
        "trainmon_training_dropped_reports_total", job="resnet50", rank="0"
    ) == 7


def test_silent_rank_expires_after_ttl(make_collector: Make, clock: FakeClock) -> None:
    collector = make_collector(ttl_seconds=300)
    accept(collector, line(rank=0))
    accept(collector, line(rank=1))
    clock.advance(200)
    accept(collector, line(rank=1))
    clock.advance(150)  # rank 0 silent for 350 s, rank 1 for 150 s
    result = scrape(collector)
    assert [labels["rank"] for labels in result.labelsets("trainmon_training_steps_total")] == ["1"]
    assert result.value("trainmon_training_evicted_ranks_total", reason="ttl") == 1
    clock.advance(200)
    result = scrape(collector)
    assert result.labelsets("trainmon_training_steps_total") == []
    assert result.labelsets("trainmon_training_world_size") == []
    assert result.value("trainmon_training_evicted_ranks_total", reason="ttl") == 2


def test_job_cap_evicts_least_recently_updated_job(make_collector: Make, clock: FakeClock) -> None:
    collector = make_collector(max_jobs=3)
    for job in ("a", "b", "c"):
        accept(collector, line(job=job))
        clock.advance(1)
    accept(collector, line(job="a"))  # a is now the most recent
    accept(collector, line(job="d"))  # evicts b
    result = scrape(collector)
    jobs = sorted(labels["job"] for labels in result.labelsets("trainmon_training_steps_total"))
    assert jobs == ["a", "c", "d"]
    assert result.value("trainmon_training_evicted_ranks_total", reason="max_jobs") == 1


def test_rank_cap_evicts_least_recently_updated_rank(make_collector: Make) -> None:
    collector = make_collector(max_ranks_per_job=2)
    for rank in (0, 1, 0, 2):
        accept(collector, line(rank=rank))
    result = scrape(collector)
    ranks = sorted(labels["rank"] for labels in result.labelsets("trainmon_training_steps_total"))
    assert ranks == ["0", "2"]
    assert result.value("trainmon_training_evicted_ranks_total", reason="max_ranks") == 1


def test_phase_cap_per_rank_rejects_with_limit(make_collector: Make) -> None:
    collector = make_collector()
    accept(collector, line(phase_seconds={f"a{i}": 1.0 for i in range(20)}))
    response = collector.handle_push(
        push(line(reporter_id="other", phase_seconds={f"b{i}": 1.0 for i in range(20)}))
    )
    assert response.status == 400
    assert response.payload["error"] == "limit"
    result = scrape(collector)
    assert result.value("trainmon_training_rejected_reports_total", reason="limit") == 1
    assert result.value("trainmon_training_reporter_resets_total", job="resnet50", rank="0") == 0


def test_data_wait_ratio_follows_the_sliding_window(
    make_collector: Make, clock: FakeClock
) -> None:
    collector = make_collector(window_seconds=60)
    seconds = wait = 0.0
    steps = 0
    for _ in range(120):  # two minutes starved: 50 % of each second waiting
        clock.advance(1)
        steps, seconds, wait = steps + 1, seconds + 1.0, wait + 0.5
        accept(collector, totals(steps, seconds, wait))
    ratio = scrape(collector).value("trainmon_training_data_wait_ratio", job="resnet50", rank="0")
    assert ratio == pytest.approx(0.5)
    for _ in range(90):  # then healthy: 10 %
        clock.advance(1)
        steps, seconds, wait = steps + 1, seconds + 1.0, wait + 0.1
        accept(collector, totals(steps, seconds, wait))
    ratio = scrape(collector).value("trainmon_training_data_wait_ratio", job="resnet50", rank="0")
    assert ratio == pytest.approx(0.1, abs=0.02)  # the window forgot the starved minutes


def test_ratio_is_omitted_before_any_step_time(make_collector: Make) -> None:
    collector = make_collector()
    accept(collector, totals(0, 0.0, 0.0, step_buckets=[0] * STEP_BUCKET_COUNT))
    result = scrape(collector)
    assert result.value("trainmon_training_data_wait_ratio", job="resnet50", rank="0") is None
    assert result.value("trainmon_training_steps_total", job="resnet50", rank="0") == 0
    assert result.value(
        "trainmon_training_last_step_timestamp_seconds", job="resnet50", rank="0"
    ) is None


def test_last_step_time_from_the_future_is_clamped(make_collector: Make) -> None:
    collector = make_collector()
    accept(collector, line(last_step_time=4_000_000_000.0))
    assert scrape(collector).value(
        "trainmon_training_last_step_timestamp_seconds", job="resnet50", rank="0"
    ) == 1_700_000_100.0  # the collector's injected wall clock


def test_mixed_body_answers_400_and_keeps_the_valid_lines(make_collector: Make) -> None:
    collector = make_collector()
    body = line(rank=0) + b"{broken\n" + json.dumps(report(rank=1, job="a b")).encode()
    response = collector.handle_push(push(body))
    assert response.status == 400
    assert response.payload["accepted"] == 1
    assert response.payload["rejected"] == 2
    errors = cast(list[dict[str, str]], response.payload["errors"])
    assert [error["reason"] for error in errors] == ["malformed", "invalid_label"]
    result = scrape(collector)
    assert result.value("trainmon_training_rejected_reports_total", reason="malformed") == 1
    assert result.value("trainmon_training_rejected_reports_total", reason="invalid_label") == 1
    assert result.value("trainmon_training_steps_total", job="resnet50", rank="0") == 10


def test_empty_body_is_malformed(make_collector: Make) -> None:
    collector = make_collector()
    response = collector.handle_push(push(b"\n\n"))
    assert (response.status, response.payload["error"]) == (400, "malformed")


def test_health_reports_counts(make_collector: Make) -> None:
    collector = make_collector()
    accept(collector, line(rank=0) + line(rank=1))
    health = collector.health()
    assert (health["jobs"], health["ranks"], health["socket"]) == (1, 2, None)
