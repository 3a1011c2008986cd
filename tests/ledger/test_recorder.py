"""The recorder (``LedgerCollector``) over a real training collector: runs measured,
compared, ended, resumed; an unusable ledger reported, not fatal; no secret stored."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from pathlib import Path

import pytest
from prometheus_client.core import GaugeMetricFamily

from testkit.exposition import scrape
from tests.ledger.ledger_support import (
    Clocks,
    description,
    make_recorder,
    only,
    only_record,
    recording,
    send,
    step,
)
from trainmon.ledger import Ledger
from trainmon.training.protocol import parse


def run_job(clocks: Clocks, training, ledger, *, run: str, rate_steps: int,  # type: ignore[no-untyped-def]
            intervals: int = 5, end: bool = True, **described: object) -> None:
    """A run that does ``rate_steps`` steps (32 samples each) per 10 s interval."""
    started = clocks.wall
    send(training, description(run=run, started=started, **described),
         step(0, run=run))
    ledger.tick()
    for index in range(1, intervals + 1):
        clocks.advance(10)
        send(training, step(index * rate_steps, run=run))
        ledger.tick()
    if end:
        send(training, description(run=run, started=started, ended="finished", **described))
        ledger.tick()


def test_two_runs_are_measured_compared_and_finished(clocks: Clocks, tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    training, ledger = make_recorder(clocks, path, flush_seconds=3600.0,
                                     price_per_gpu_hour=2.0, currency="CNY")()
    ledger.start()
    try:
        run_job(clocks, training, ledger, run="run-a", rate_steps=100)
        clocks.advance(60)
        run_job(clocks, training, ledger, run="run-b", rate_steps=50, end=False,
                environment={"NCCL_IB_DISABLE": "1"})
        exposition = scrape(ledger)
        assert exposition.series("trainmon_training_run_changes_info", "job", "owner", "run",
                                 "changed") == {
            ("resnet50", "local", "run-b", "NCCL_IB_DISABLE"): 1.0}
        assert exposition.value("trainmon_ledger_price_per_gpu_hour", currency="CNY") == 2.0
        assert exposition.value("trainmon_ledger_up") == 1.0
        assert scrape(training).series("trainmon_training_run_info", "job", "owner", "run",
                                       "config_hash") == {
            ("resnet50", "local", "run-b", description()["config_hash"]): 1.0}
    finally:
        ledger.stop()
        training.stop()
    with Ledger.open(path) as reader:
        b, a = reader.runs(job="resnet50")
    assert (a.run, a.end_reason, b.run, b.end_reason) == ("run-a", "finished", "run-b", None)
    # 100 steps × 32 samples per 10 s; the first interval is left out as warm-up
    assert a.summary["samples_per_second_median"] == pytest.approx(320.0)
    assert b.summary["samples_per_second_median"] == pytest.approx(160.0)
    assert a.summary["samples"] == 500 * 32 and a.summary["steps"] == 500
    assert a.summary["data_wait_ratio"] == pytest.approx(0.25)
    assert a.summary["comm_exposed_ratio"] == pytest.approx(0.1)
    assert a.summary["phase_ratios"] == {"comm": pytest.approx(0.1)}
    # these reports carry no step sketch (an older client): no percentile, the exact mean
    assert (a.summary["step_seconds_p50"], a.summary["step_seconds_p95"]) == (None, None)
    assert a.summary["step_seconds_mean"] == pytest.approx(0.1)
    assert a.summary["duration_seconds"] == pytest.approx(50.0)
    cost = a.summary["cost"]
    assert isinstance(cost, dict)
    assert cost["total"] == pytest.approx(2.0 * 50 / 3600)
    assert cost["per_million_samples"] == pytest.approx(cost["total"] / 16000 * 1e6)
    assert a.description["environment"] == {"NCCL_IB_DISABLE": "0"}
    assert b.description["environment"] == {"NCCL_IB_DISABLE": "1"}
    assert a.started == 1_700_000_000.0 and a.ranks == 1 and a.node == "node-1"


def test_a_secret_from_a_foreign_client_reaches_neither_ledger_nor_metrics(
        clocks: Clocks, tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    training, ledger = make_recorder(clocks, path, flush_seconds=3600.0)()
    planted = "hunter2-planted-secret"
    parsed = parse(json.dumps(description()).encode())
    assert not isinstance(parsed, Exception)
    # as an old or foreign client would send it: not redacted
    leaky = dataclasses.replace(
        parsed, config={**parsed.config, "db.password": planted},  # type: ignore[union-attr]
        environment={"NCCL_IB_DISABLE": "0", "CUDA_AUTH_TOKEN": planted},
        framework={"wandb_api_key": planted})
    training.store.describe(leaky, "unix")  # type: ignore[arg-type]
    send(training, step(10))
    ledger.start()
    ledger.tick()
    exposition = scrape(training).text + scrape(ledger).text
    ledger.stop()
    assert planted not in exposition
    assert planted.encode() not in path.read_bytes()
    with Ledger.open(path) as reader:
        record = only(reader.runs())
    assert record.description["config"]["db.password"] == "<redacted>"  # type: ignore[index]
    assert record.description["environment"]["CUDA_AUTH_TOKEN"] == "<redacted>"  # type: ignore[index]


def test_a_run_without_steps_stalls_and_recovers(clocks: Clocks, tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    training, ledger = make_recorder(clocks, path, flush_seconds=3600.0, stall_seconds=30.0)()
    ledger.start()
    run_job(clocks, training, ledger, run="run-a", rate_steps=10, intervals=2, end=False)
    stopped_at = clocks.wall
    for _ in range(4):  # heartbeats go on, the step count does not
        clocks.advance(10)
        send(training, step(20))
        ledger.tick()
    with Ledger.open(path) as reader:
        record = only(reader.runs())
    assert (record.end_reason, record.ended) == ("stalled", stopped_at)
    clocks.advance(10)
    send(training, step(30))
    ledger.tick()
    with Ledger.open(path) as reader:
        record = only(reader.runs())
    assert (record.end_reason, record.ended) == (None, None)
    ledger.stop()


def test_a_run_whose_ranks_expire_is_lost(clocks: Clocks, tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    training, ledger = make_recorder(clocks, path, flush_seconds=3600.0)()
    ledger.start()
    run_job(clocks, training, ledger, run="run-a", rate_steps=10, intervals=2, end=False)
    last_report = clocks.wall
    clocks.advance(61)  # training ttl_seconds is 60
    ledger.tick()
    ledger.stop()
    with Ledger.open(path) as reader:
        record = only(reader.runs())
    assert (record.end_reason, record.ended) == ("lost", last_report)


def verdict(kind: str, job: str = "resnet50") -> GaugeMetricFamily:
    """``trainmon_bottleneck`` as the diagnosis exports it: 1 for ``kind``, 0 for the rest."""
    family = GaugeMetricFamily("trainmon_bottleneck", "", labels=["job", "kind"])
    for other in ("compute", "storage", "none"):
        family.add_metric([job, other], 1.0 if other == kind else 0.0)
    return family


def test_the_time_under_each_verdict_is_recorded_from_evaluations_alone(
        clocks: Clocks, tmp_path: Path) -> None:
    """The evaluations (observe) count verdict time, capped per gap; scrapes (collect)
    count none; an evaluation without any verdict family tells nothing."""
    path = tmp_path / "ledger.sqlite3"
    training, ledger = make_recorder(clocks, path, flush_seconds=3600.0)()
    ledger.start()
    run_job(clocks, training, ledger, run="run-a", rate_steps=10, intervals=1, end=False)
    for kind in ("storage", "storage", "storage", "compute", "compute"):
        ledger.observe([verdict(kind), verdict("compute", job="other-job")])
        for _ in range(3):
            list(ledger.collect())
        clocks.advance(5)
    ledger.observe([])  # a failed diagnosis: the verdict goes on
    clocks.advance(5)
    ledger.observe([verdict("compute")])  # 10 s since the last evaluation that said it
    clocks.advance(100)
    ledger.observe([verdict("compute")])  # a long pause counts MAX_VERDICT_GAP_SECONDS
    clocks.advance(5)
    ledger.observe([verdict("storage")])  # the latest verdict, no time yet
    ledger.tick()
    ledger.stop()
    with Ledger.open(path) as reader:
        record = only(reader.runs())
    assert record.summary["verdicts"] == {"compute": 75.0, "storage": 10.0}
    assert record.summary["final_verdict"] == "storage"


def test_an_ended_run_keeps_its_final_verdict(clocks: Clocks, tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    training, ledger = make_recorder(clocks, path, flush_seconds=3600.0)()
    ledger.start()
    run_job(clocks, training, ledger, run="run-a", rate_steps=10, intervals=1, end=False)
    ledger.observe([verdict("storage")])
    clocks.advance(5)
    ledger.observe([verdict("storage")])
    send(training, description(run="run-a", ended="finished"))
    ledger.tick()
    ledger.observe([verdict("compute")])  # after the end: not the run's any more
    clocks.advance(5)
    ledger.observe([verdict("compute")])
    ledger.tick()
    ledger.stop()
    with Ledger.open(path) as reader:
        record = only(reader.runs())
    assert record.end_reason == "finished"
    assert (record.summary["verdicts"], record.summary["final_verdict"]) == (
        {"storage": 5.0}, "storage")


def test_a_restarted_daemon_resumes_the_run(clocks: Clocks, tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    make = make_recorder(clocks, path, flush_seconds=3600.0)
    training, ledger = make()
    ledger.start()
    run_job(clocks, training, ledger, run="run-a", rate_steps=100, intervals=3, end=False)
    # stopped (one daemon per ledger: its lock goes with it; a real kill -9 is
    # tests/ledger/test_restart.py); a new daemon starts with an empty store
    ledger.stop()
    training, ledger = make()
    ledger.start()
    for index in range(4, 7):
        clocks.advance(10)
        send(training, description(), step(index * 100))
        ledger.tick()
    ledger.stop()
    with Ledger.open(path) as reader:
        record = only(reader.runs())
    assert record.summary["steps"] == 600
    assert record.summary["samples_per_second_median"] == pytest.approx(320.0)


def test_a_missing_directory_is_reported_then_used_once_it_exists(
        clocks: Clocks, tmp_path: Path) -> None:
    path = tmp_path / "state" / "ledger.sqlite3"
    training, ledger = make_recorder(clocks, path, flush_seconds=3600.0)()
    ledger.start()
    run_job(clocks, training, ledger, run="run-a", rate_steps=10, intervals=1, end=False)
    health = ledger.health()
    assert health["open"] is False and "does not exist" in str(health["ledger_error"])
    assert scrape(ledger).value("trainmon_ledger_up") == 0.0
    path.parent.mkdir()
    clocks.advance(31)
    send(training, step(20))
    ledger.tick()
    assert ledger.health()["open"] is True and "ledger_error" not in ledger.health()
    ledger.stop()
    with Ledger.open(path) as reader:
        assert only(reader.runs()).run == "run-a"


def test_a_foreign_file_is_reported_and_never_modified(clocks: Clocks, tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    connection = sqlite3.connect(path)
    connection.execute("CREATE TABLE t (x)")
    connection.commit()
    connection.close()
    content = path.read_bytes()
    training, ledger = make_recorder(clocks, path, flush_seconds=3600.0)()
    ledger.start()
    run_job(clocks, training, ledger, run="run-a", rate_steps=10, intervals=2)
    clocks.advance(31)
    ledger.tick()
    assert "another program" in str(ledger.health()["ledger_error"])
    ledger.stop()
    assert path.read_bytes() == content


def test_changed_keys_names_config_environment_data_versions_and_world_size() -> None:
    from trainmon.ledger.recorder import changed_keys

    def described(storage: str, **changes: object) -> dict[str, object]:
        base: dict[str, object] = {
            "config": {"lr": 0.1, "batch_size": 32},
            "environment": {"NCCL_IB_DISABLE": "0", "OMP_NUM_THREADS": "8"},
            "data_paths": [{"path": "/data", "mountpoint": "/", "fstype": "ext4",
                            "storage": storage}],
            "versions": {"torch": "2.3.0", "python": "3.11.9"}, "world_size": 8}
        base.update(changes)
        return base

    before = described("local_disk")
    assert changed_keys(before, described("local_disk")) == ""
    assert changed_keys(before, described("unknown")) == ""  # unknown matches any kind
    after = described("network_fs", config={"lr": 0.2, "batch_size": 32, "warmup": 10},
                      environment={"NCCL_IB_DISABLE": "1", "OMP_NUM_THREADS": "8"},
                      versions={"torch": "2.4.0", "python": "3.11.9"}, world_size=16)
    assert changed_keys(before, after) == \
        "NCCL_IB_DISABLE,data,lr,versions.torch,warmup,world_size"


def test_a_long_change_list_is_truncated_in_the_label(clocks: Clocks, tmp_path: Path) -> None:
    training, ledger = make_recorder(clocks, tmp_path / "l.sqlite3", flush_seconds=3600.0)()
    ledger.start()
    run_job(clocks, training, ledger, run="run-a", rate_steps=10, intervals=1)
    clocks.advance(30)
    config = {f"model.encoder.layer_{index:02d}.dropout": 0.2 for index in range(12)}
    run_job(clocks, training, ledger, run="run-b", rate_steps=10, intervals=1, end=False,
            config=config)
    [labels] = scrape(ledger).labelsets("trainmon_training_run_changes_info")
    ledger.stop()
    assert len(labels["changed"]) == 200 and labels["changed"].endswith("…")
    assert labels["changed"].startswith("batch_size,lr,model.encoder.layer_00.dropout,")


def test_a_run_whose_end_is_replaced_by_the_next_run_before_a_tick_has_finished(
    clocks: Clocks, tmp_path: Path
) -> None:
    """The rank's next run starts within one flush of the clean end: the ended
    description is gone from the store before the recorder reads it, yet the run
    finished (it used to be recorded as vanished)."""
    path = tmp_path / "ledger.sqlite3"
    training, ledger = make_recorder(clocks, path, flush_seconds=3600.0)()
    ledger.start()
    try:
        run_job(clocks, training, ledger, run="run-a", rate_steps=100, end=False)
        started = clocks.wall
        clocks.advance(1)
        send(training, description(run="run-a", started=started - 50, ended="finished"))
        send(training, description(run="run-b", started=clocks.wall), step(0, run="run-b",
                                                                            reporter_id="b0"))
        clocks.advance(1)
        send(training, step(10, run="run-b", reporter_id="b0"))
        ledger.tick()
    finally:
        ledger.stop()
        training.stop()
    with Ledger.open(path) as reader:
        ends = {record.run: record.end_reason for record in reader.runs(job="resnet50")}
    assert ends == {"run-a": "finished", "run-b": None}


def test_each_runs_gpu_seconds_add_up_and_a_stall_is_booked_stalled(
    clocks: Clocks, tmp_path: Path,
) -> None:
    """A rank doing 100 steps of 0.1 s per 10 s (a quarter data wait, a tenth in the
    comm phase), then no step for 30 s while it still reports, then steps again: its
    50 s of steps are split by their totals, the 30 s are stalled, and the job's
    buckets add up to the time its rank held its GPU."""
    path = tmp_path / "ledger.sqlite3"
    training, ledger = make_recorder(clocks, path, flush_seconds=3600.0)()
    ledger.start()
    try:
        started = clocks.wall
        send(training, description(started=started), step(0))
        ledger.tick()
        for steps in (100, 200, 300, 300, 300, 300, 400, 500):
            clocks.advance(10)
            send(training, step(steps))
            ledger.tick()
        exposition = scrape(ledger)
        seconds = {(job, bucket): value for (job, _, bucket), value in exposition.series(
            "trainmon_job_gpu_seconds_total", "job", "owner", "bucket").items()}
        goodput = exposition.value("trainmon_job_goodput_ratio", job="resnet50", owner="local")
        send(training, description(started=started, ended="finished"))
        ledger.tick()
    finally:
        ledger.stop()
        training.stop()
    held = 80.0
    assert sum(seconds.values()) == pytest.approx(held)
    assert seconds[("resnet50", "stalled")] == pytest.approx(30.0)
    assert seconds[("resnet50", "data_wait")] == pytest.approx(12.5)
    assert seconds[("resnet50", "comm_exposed")] == pytest.approx(5.0)
    assert seconds[("resnet50", "productive")] == pytest.approx(32.5)
    assert len(seconds) == 10
    assert goodput == pytest.approx(32.5 / held)
    with Ledger.open(path) as reader:
        record = only(reader.runs(job="resnet50"))
    assert sum(record.summary["gpu_seconds"].values()) == pytest.approx(held)  # type: ignore[attr-defined]
    assert record.summary["goodput_ratio"] == pytest.approx(32.5 / held)


def test_the_steps_a_crash_lost_since_its_checkpoint_are_booked_on_the_restart(
    clocks: Clocks, tmp_path: Path,
) -> None:
    """run-a completes a 0.5 s save 5 s after its report of step 100, a 10-s stretch to
    step 200: 4.5 s of its 9.5 s of stepping, so at step 147 (steps are spread over the
    stretch's time outside the save); it crashes at step 300; run-b of the same job
    starts again from that checkpoint: the productive time of its first 153 steps is
    lost progress, and no later run's is."""
    path = tmp_path / "ledger.sqlite3"
    training, ledger = make_recorder(clocks, path, flush_seconds=3600.0)()
    ledger.start()
    try:
        send(training, description(run="run-a", started=clocks.wall), step(0, run="run-a"))
        ledger.tick()
        saved = {"checkpoints": 1, "checkpoint_seconds": 0.5}
        for steps, extra in ((100, {}), (200, {**saved, "last_checkpoint_time": clocks.wall
                                                + 15.0}), (300, saved)):
            clocks.advance(10)
            send(training, step(steps, run="run-a", **extra))
            ledger.tick()
        send(training, description(run="run-a", started=clocks.wall - 30, ended="crashed"))
        ledger.tick()
        lost_before = scrape(ledger).value("trainmon_job_gpu_seconds_total", job="resnet50",
                                           bucket="lost_progress")
        clocks.advance(5)
        send(training, description(run="run-b", started=clocks.wall, reporter_id="b" * 16),
             step(0, run="run-b", reporter_id="b" * 16))
        ledger.tick()
        for steps in (100, 200, 300):
            clocks.advance(10)
            send(training, step(steps, run="run-b", reporter_id="b" * 16))
            ledger.tick()
        lost = scrape(ledger).value("trainmon_job_gpu_seconds_total", job="resnet50",
                                    bucket="lost_progress")
    finally:
        ledger.stop()
        training.stop()
    assert lost_before == 0.0
    # 150 steps of 0.1 s, of which a quarter data wait and a tenth comm: 65 % productive
    assert lost == pytest.approx(153 * 0.1 * 0.65)
    with Ledger.open(path) as reader:
        runs = {record.run: record for record in reader.runs(job="resnet50")}
    assert runs["run-b"].summary["gpu_seconds"]["lost_progress"] == pytest.approx(lost)  # type: ignore[index]
    assert runs["run-a"].summary["gpu_seconds"]["lost_progress"] == 0.0  # type: ignore[index]


def test_goodput_series_are_kept_for_the_jobs_booked_last_and_the_rest_counted(
    clocks: Clocks, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from trainmon.ledger import recorder

    monkeypatch.setattr(recorder, "MAX_GOODPUT_JOBS", 2)
    training, ledger = make_recorder(clocks, tmp_path / "ledger.sqlite3",
                                     flush_seconds=3600.0)()
    ledger.start()
    try:
        for job in ("a", "b", "c"):
            send(training, description(job=job, started=clocks.wall), step(0, job=job))
            ledger.tick()
            clocks.advance(10)
            send(training, step(100, job=job))
            send(training, description(job=job, started=clocks.wall - 10, ended="finished"))
            ledger.tick()
        exposition = scrape(ledger)
    finally:
        ledger.stop()
        training.stop()
    jobs = {job for job, _, _ in exposition.series("trainmon_job_gpu_seconds_total", "job",
                                                   "owner", "bucket")}
    assert jobs == {"b", "c"}
    assert exposition.value("trainmon_ledger_goodput_evicted_jobs_total") == 1.0


def test_a_runs_exposed_communication_is_kept_per_parallelism_dimension(
        clocks: Clocks, tmp_path: Path) -> None:
    """A 2-D job's rank waits 20 % of its steps in tensor-parallel collectives and 5 % in
    data-parallel ones: the run's summary says so, dimension by dimension."""
    path = tmp_path / "ledger.sqlite3"
    with recording(clocks, path, flush_seconds=3600.0) as (training, ledger):
        started = clocks.wall
        send(training, description(run="run-2d", started=started), step(0, run="run-2d"))
        ledger.tick()
        for index in range(1, 6):
            clocks.advance(10)
            seconds = index * 100 * 0.1  # 100 steps of 0.1 s per interval
            send(training, step(index * 100, run="run-2d", comm_seconds=0.3 * seconds,
                                comm_exposed_seconds=0.25 * seconds, comm_groups={
                                    "tp": {"collectives": index * 400, "bytes": index * 10,
                                           "seconds": 0.2 * seconds,
                                           "exposed_seconds": 0.2 * seconds},
                                    "dp": {"collectives": index * 100, "bytes": index * 10,
                                           "seconds": 0.1 * seconds,
                                           "exposed_seconds": 0.05 * seconds}}))
            ledger.tick()
        send(training, description(run="run-2d", started=started, ended="finished"))
        ledger.tick()
    record = only_record(path, job="resnet50")
    assert record.summary["comm_exposed_ratio_by_group"] == {
        "dp": pytest.approx(0.05), "tp": pytest.approx(0.2)}
    assert record.summary["comm_exposed_ratio"] == pytest.approx(0.25)
