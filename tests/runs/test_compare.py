"""``trainmon.runs.compare``: what changed between two runs, over hand-built records."""

from __future__ import annotations

import pytest

from tests.runs.runs_support import STARTED, description, record, summary
from trainmon.runs.compare import compare, count_text, coverage_text, quantity, signed_percent
from trainmon.runs.render import render_comparison
from trainmon.runs.view import RunView


def view(run: str, **kwargs: object) -> RunView:
    return RunView.from_records([record(run, **kwargs)])  # type: ignore[arg-type]


def test_the_contract_example_in_words_first() -> None:
    a = view("run-a")
    b = view("run-b", started=STARTED + 7200, description_=description(
        environment={"NCCL_IB_DISABLE": "1", "OMP_NUM_THREADS": "8"},
        data_paths=[{"path": "/data/imagenet", "mountpoint": "/data", "fstype": "nfs4",
                     "storage": "network_fs"}]),
        summary_=summary(samples_per_second_median=992.0))
    comparison = compare(a, b)
    assert comparison.summary.startswith(
        "samples/s −18 % (1 210 → 992); NCCL_IB_DISABLE 0 → 1; "
        "data moved from local NVMe/disk to CFS/NFS")
    assert [change.to_json() for change in comparison.changes] == [
        {"key": "NCCL_IB_DISABLE", "kind": "environment", "a": "0", "b": "1"},
        {"key": "data", "kind": "data", "a": "/data/imagenet (local NVMe/disk)",
         "b": "/data/imagenet (CFS/NFS)"},
    ]
    assert comparison.throughput.to_json() == {"a": 1210.0, "b": 992.0, "change_ratio": -0.1802}


def test_identical_runs_have_no_changes_and_say_so() -> None:
    comparison = compare(view("a"), view("b", started=STARTED + 10))
    assert comparison.changes == ()
    assert comparison.unavailable == ()
    assert "no recorded change" in comparison.summary
    assert comparison.throughput.change_ratio == 0


def test_every_kind_of_change_is_named() -> None:
    b = view("b", world_size=16, node="gpu-node-2", description_=description(
        config={"lr": 0.2, "batch_size": 256, "warmup": 100},
        framework={"precision": "bf16-mixed"},
        versions={"python": "3.11.9", "torch": "2.5.1", "trainmon": "0.16.0"},
        git={"commit": "b" * 40, "dirty": True},
        environment={"NCCL_IB_DISABLE": "0", "OMP_NUM_THREADS": "8", "TRAINMON_RUN_ID": "b"}))
    a = view("a", description_=description(environment={
        "NCCL_IB_DISABLE": "0", "OMP_NUM_THREADS": "8", "TRAINMON_RUN_ID": "a"}))
    changes = {change.key: (change.kind, change.a, change.b) for change in compare(a, b).changes}
    assert changes == {
        "lr": ("config", 0.1, 0.2),
        "model.layers": ("config", 24, None),
        "warmup": ("config", None, 100),
        "precision": ("framework", None, "bf16-mixed"),
        "versions.torch": ("versions", "2.4.0", "2.5.1"),
        "git.commit": ("git", "a" * 40, "b" * 40),
        "world_size": ("world_size", 8, 16),
        "nodes": ("nodes", "gpu-node-1", "gpu-node-2"),
    }  # the run-id variable is identity, not a change


@pytest.mark.parametrize(("a_env", "b_env", "expected"), [
    ({"NCCL_AUTH_TOKEN": "<redacted>"}, {"NCCL_AUTH_TOKEN": "<redacted>"}, None),
    ({"NCCL_AUTH_TOKEN": "<redacted>"}, {}, ("<redacted>", None)),
    # an old client that sent secrets in clear: redacted on reading, so both are equal
    ({"CUDA_API_KEY": "hunter2"}, {"CUDA_API_KEY": "swordfish"}, None),
    ({"CUDA_API_KEY": "hunter2"}, {}, ("<redacted>", None)),
    # a value redacted under a name that does not look secret (a foreign client)
    ({"OMP_X": "<redacted>"}, {"OMP_X": "4"}, ("<redacted>", "<redacted>")),
])
def test_secrets_compare_without_showing_a_value(
    a_env: dict[str, str], b_env: dict[str, str], expected: tuple[str | None, str | None] | None,
) -> None:
    comparison = compare(view("a", description_=description(environment=a_env)),
                         view("b", description_=description(environment=b_env)))
    text = str(comparison.to_json())
    assert "hunter2" not in text and "swordfish" not in text
    if expected is None:
        assert comparison.changes == ()
    else:
        (change,) = comparison.changes
        assert (change.a, change.b, change.redacted) == (*expected, True)
        assert f"{change.key} changed (redacted)" in comparison.summary


def test_an_unknown_description_is_unavailable_not_unchanged() -> None:
    a = view("a")
    b = RunView(job="llama", run="b", config_hash=a.config_hash, started=STARTED, ended=None,
                end_reason=None, world_size=8, nodes=a.nodes, description=None,
                summary=summary(samples_per_second_median=600.0), source="prometheus",
                unavailable=("description: the daemon 10.0.0.1:19400 did not answer",))
    comparison = compare(a, b)
    assert comparison.changes == ()
    assert "unknown" in comparison.summary and "no recorded change" not in comparison.summary
    assert any("10.0.0.1:19400" in reason for reason in comparison.unavailable)
    assert comparison.throughput.change_ratio == pytest.approx(600 / 1210 - 1)


def test_phase_shares_and_cost_move() -> None:
    cost = {"currency": "CNY", "price_per_gpu_hour": 20.0, "total": 160.0,
            "per_million_samples": 36.76}
    a = view("a", summary_=summary(cost=cost))
    b = view("b", summary_=summary(data_wait_ratio=0.35, samples_per_second_median=800.0,
                                   cost={**cost, "per_million_samples": 55.6},
                                   phase_ratios={"comm": 0.1}))
    comparison = compare(a, b)
    phases = comparison.to_json()["phases"]
    assert phases["data_wait"] == {"a": 0.05, "b": 0.35, "change_ratio": 6.0}  # type: ignore[index]
    assert phases["phase.checkpoint"]["b"] is None  # type: ignore[index]
    assert "data wait 5 % → 35 %" in comparison.summary
    assert "cost per million samples 36.76 → 55.60 CNY" in comparison.summary
    assert comparison.to_json()["cost_per_million_samples"] == {
        "a": 36.76, "b": 55.6, "change_ratio": 0.5125, "currency": "CNY"}


def test_a_multi_node_run_adds_up_its_nodes() -> None:
    merged = RunView.from_records([
        record("r", node="n1", ranks=8, summary_=summary(samples_per_second_median=600.0,
                                                         steps=100, data_wait_ratio=0.1)),
        record("r", node="n2", ranks=8, summary_=summary(samples_per_second_median=610.0,
                                                         steps=300, data_wait_ratio=0.3)),
    ])
    assert merged.nodes == ("n1", "n2")
    assert merged.summary["samples_per_second_median"] == 1210.0
    assert merged.summary["data_wait_ratio"] == pytest.approx(0.25)
    assert (merged.ranks, merged.world_size, merged.partial) == (16, 8, False)


def test_a_multi_node_run_keeps_its_exact_mean_step_and_no_averaged_percentile() -> None:
    """The nodes' p50s averaged would be no percentile of the run's steps: left out; the
    mean step weighted by the steps is the run's exact mean."""
    merged = RunView.from_records([
        record("r", node="n1", summary_=summary(steps=100, step_seconds_mean=0.2,
                                                samples_per_second=500.0)),
        record("r", node="n2", summary_=summary(steps=300, step_seconds_mean=0.4,
                                                samples_per_second=250.0)),
    ])
    assert merged.summary["step_seconds_mean"] == pytest.approx(0.35)
    assert merged.summary["step_seconds_p50"] is None
    assert merged.summary["samples_per_second"] == 750.0


def test_a_merged_run_ends_as_its_worst_node_and_keeps_its_latest_checkpoint() -> None:
    def last(time: float, path: str) -> dict[str, object]:
        return {"time": time, "duration_seconds": 1.0, "path": path, "mountpoint": "/",
                "fstype": "ext4", "storage": "local_disk"}

    merged = RunView.from_records([
        record("r", node="n1", ranks=4, world_size=16, end_reason="finished",
               summary_=summary(checkpoints=3, final_verdict="compute",
                                last_checkpoint=last(STARTED + 100, "/a"))),
        record("r", node="n2", ranks=4, world_size=16, end_reason="lost",
               summary_=summary(checkpoints=2, final_verdict="storage",
                                last_checkpoint=last(STARTED + 200, "/b"))),
        record("r", node="n3", ranks=4, world_size=16, end_reason="crashed",
               summary_=summary(checkpoints=None, final_verdict="storage")),
    ])
    assert merged.end_reason == "crashed"
    assert (merged.ranks, merged.partial, coverage_text(merged)) == (12, True, "12 of 16")
    assert merged.summary["checkpoints"] == 5
    assert merged.summary["last_checkpoint"]["path"] == "/b"
    assert merged.summary["final_verdict"] == "storage"
    still_running = RunView.from_records([record("r", node="n1", end_reason="crashed"),
                                          record("r", node="n2", ended=None, end_reason=None)])
    assert (still_running.ended, still_running.end_reason) == (None, None)


def test_an_end_reason_of_an_older_ledger_reads_as_today() -> None:
    assert view("r", end_reason="vanished").end_reason == "lost"


@pytest.mark.parametrize(("count", "text"), [(1, "1 checkpoint"), (0, "0 checkpoints"),
                                             (3, "3 checkpoints")])
def test_counts_agree_with_their_noun(count: int, text: str) -> None:
    assert count_text(count, "checkpoint") == text


@pytest.mark.parametrize(("value", "text"), [
    (1210.4, "1 210"), (992.0, "992"), (99.46, "99.5"), (0.1234, "0.123"), (None, "?")])
def test_quantities(value: float | None, text: str) -> None:
    assert quantity(value) == text


@pytest.mark.parametrize(("ratio", "text"), [(-0.183, "−18 %"), (0.05, "+5 %"), (0.001, "±0 %")])
def test_signed_percent(ratio: float, text: str) -> None:
    assert signed_percent(ratio) == text


def test_goodput_and_the_buckets_that_moved_are_in_words() -> None:
    def booked(productive: float, data_wait: float) -> dict[str, float]:
        return {"productive": productive, "data_wait": data_wait, "checkpoint": 5.0,
                "stalled": 0.0}

    a = view("a", summary_=summary(gpu_seconds=booked(62.0, 33.0), goodput_ratio=0.62))
    b = view("b", summary_=summary(gpu_seconds=booked(81.0, 14.0), goodput_ratio=0.81))
    comparison = compare(a, b)
    assert comparison.summary.endswith("no recorded change in configuration, environment, "
                                       "data, versions, world size or nodes; goodput 62 % → 81 %")
    # the data wait is a step share: said once, as such, never as a GPU-time bucket too
    assert "data_wait" not in comparison.summary and "checkpoint" not in comparison.summary
    assert comparison.to_json()["badput"] == {
        "data_wait": {"a": 0.33, "b": 0.14, "change_ratio": -0.5758},
        "checkpoint": {"a": 0.05, "b": 0.05, "change_ratio": 0.0}}


def test_a_multi_node_run_adds_up_its_gpu_seconds() -> None:
    merged = RunView.from_records([
        record("r", node="n1", summary_=summary(gpu_seconds={"productive": 30.0,
                                                             "data_wait": 10.0})),
        record("r", node="n2", summary_=summary(gpu_seconds={"productive": 50.0,
                                                             "stalled": 10.0})),
    ])
    assert merged.summary["gpu_seconds"] == {"productive": 80.0, "data_wait": 10.0,
                                             "stalled": 10.0}
    assert merged.summary["goodput_ratio"] == pytest.approx(0.8)


def test_exposed_communication_is_compared_per_parallelism_dimension() -> None:
    a = view("run-a", summary_=summary(comm_exposed_ratio=0.25,
                                       comm_exposed_ratio_by_group={"tp": 0.2, "dp": 0.05}))
    b = view("run-b", started=STARTED + 7200, summary_=summary(
        comm_exposed_ratio=0.1, comm_exposed_ratio_by_group={"tp": 0.05, "dp": 0.05}))
    comparison = compare(a, b)
    assert (comparison.phases["comm_exposed.tp"].a,
            comparison.phases["comm_exposed.tp"].b) == (0.2, 0.05)
    assert (comparison.phases["comm_exposed.dp"].a,
            comparison.phases["comm_exposed.dp"].b) == (0.05, 0.05)
    assert list(comparison.phases)[:3] == ["data_wait", "comm_exposed", "comm_exposed.dp"]


def test_a_goodput_rise_beside_a_throughput_fall_is_explained_and_data_wait_said_once() -> None:
    """The issue's case: more OpenMP threads made the steps slower while the share lost
    waiting for data fell; the sentence says what changed first and one data wait."""
    def booked(productive: float, data_wait: float) -> dict[str, float]:
        return {"productive": productive, "data_wait": data_wait, "startup": 100.0 - (
            productive + data_wait)}

    a = view("a", description_=description(environment={"OMP_NUM_THREADS": "1"}),
             summary_=summary(samples_per_second_median=838.0, data_wait_ratio=0.92,
                              goodput_ratio=0.03, gpu_seconds=booked(3.0, 92.0)))
    b = view("b", started=STARTED + 7200,
             description_=description(environment={"OMP_NUM_THREADS": "2"}),
             summary_=summary(samples_per_second_median=390.0, data_wait_ratio=0.82,
                              goodput_ratio=0.12, gpu_seconds=booked(12.0, 82.0)))
    comparison = compare(a, b)
    assert comparison.summary == (
        "samples/s −53 % (838 → 390); OMP_NUM_THREADS 1 → 2; data wait 92 % → 82 %; "
        "goodput 3 % → 12 % while samples/s fell 53 %: less time is lost waiting, but each "
        "step got slower")
    assert comparison.to_json()["goodput"] == {"a": 0.03, "b": 0.12, "change_ratio": 3.0}


def test_a_goodput_fall_beside_a_throughput_rise_is_explained_too() -> None:
    a = view("a", summary_=summary(samples_per_second_median=500.0, goodput_ratio=0.9))
    b = view("b", started=STARTED + 10,
             summary_=summary(samples_per_second_median=600.0, goodput_ratio=0.7))
    assert ("goodput 90 % → 70 % while samples/s rose 20 %: each step got faster, but more "
            "time is lost waiting") in compare(a, b).summary


def test_losses_outside_the_step_are_said_as_shares_of_the_gpu_time() -> None:
    a = view("a", summary_=summary(goodput_ratio=0.9, gpu_seconds={
        "productive": 90.0, "data_wait": 5.0, "stalled": 5.0}))
    b = view("b", started=STARTED + 10, summary_=summary(goodput_ratio=0.7, gpu_seconds={
        "productive": 70.0, "data_wait": 5.0, "stalled": 25.0}))
    assert compare(a, b).summary.endswith("; goodput 90 % → 70 %; stalled +20 points of the "
                                          "GPU time")


def test_the_comm_phase_is_not_said_beside_the_exposed_communication_it_stands_for() -> None:
    a = view("a", summary_=summary(comm_exposed_ratio=0.03, phase_ratios={"comm": 0.03}))
    b = view("b", started=STARTED + 10, summary_=summary(comm_exposed_ratio=0.16,
                                                         phase_ratios={"comm": 0.16}))
    text = compare(a, b).summary
    assert "exposed comm 3 % → 16 %" in text and "comm phase" not in text


def test_the_exact_rate_and_the_step_mean_when_both_records_carry_them() -> None:
    exact = {"samples_per_second": 1000.0, "step_seconds_mean": 0.25,
             "step_seconds_p50": None, "step_seconds_p95": None}
    a = view("a", summary_=summary(samples_per_second_median=700.0, **exact))
    b = view("b", started=STARTED + 10, summary_=summary(
        samples_per_second_median=710.0, **{**exact, "samples_per_second": 800.0,
                                            "step_seconds_mean": 0.3125}))
    comparison = compare(a, b)
    assert comparison.throughput_key == "samples_per_second"
    assert comparison.summary.startswith("samples/s −20 % (1 000 → 800)")
    document = comparison.to_json()
    assert document["step_seconds_mean"] == {"a": 0.25, "b": 0.3125, "change_ratio": 0.25}
    assert document["step_seconds_p50"] is None
    text = render_comparison(comparison)
    assert "  step time (mean)       250 ms → 312 ms (+25 %)" in text
    assert "samples/s (median)" not in text and "step time p50" not in text
    # one record without the exact rate: both compared on the median, never one of each
    older = view("c", summary_=summary(samples_per_second_median=700.0))
    assert compare(older, b).throughput.to_json() == {"a": 700.0, "b": 710.0,
                                                      "change_ratio": 0.0143}
