"""Each verdict rule through the diagnosis collector, fed by a contract-metric source.

The source stands in for the GPU, training, network and attribution
collectors: it emits the docs/metrics.md samples with values set here, and an
injected clock moves time, so each rule is shown to fire and not to fire.
"""

from __future__ import annotations

import pytest

from testkit.exposition import Scrape, scrape
from tests.diagnosis.diagnosis_support import (
    ContractSource,
    Node,
    diagnosing,
    evaluated,
    findings,
    healthy_job,
    job_verdicts,
)
from trainmon.collectors.diagnosis import DiagnosisCollector
from trainmon.config import parse_config
from trainmon.diagnosis.thresholds import DiagnosisConfig
from trainmon.section import ConfigError


def test_compute_when_gpus_are_busy_and_nothing_waits() -> None:
    node = Node()
    healthy_job(node)
    result = node.run()
    assert job_verdicts(result) == {"llm": "compute"}
    assert findings(result, "llm") == {"gpu_bound"}
    assert result.value("trainmon_bottleneck", job="llm", kind="storage") == 0
    assert result.value("trainmon_diagnosis_data_wait_ratio", job="llm") == pytest.approx(
        0.01 / 0.23, rel=1e-6)
    assert result.value("trainmon_diagnosis_comm_ratio", job="llm") == pytest.approx(
        0.02 / 0.23, rel=1e-6)
    assert result.value("trainmon_diagnosis_gpu_utilization_ratio", job="llm") == pytest.approx(
        0.95)
    assert result.value("trainmon_diagnosis_step_seconds", job="llm") == pytest.approx(0.23)
    assert result.value("trainmon_diagnosis_window_seconds") == 30


def test_storage_when_one_rank_waits_for_data() -> None:
    node = Node()
    healthy_job(node)
    node.ranks[("llm", "2")].wait = 0.08  # 0.08 / 0.30 = 27 % on one rank
    result = node.run()
    assert job_verdicts(result) == {"llm": "storage"}
    assert result.value("trainmon_diagnosis_data_wait_ratio", job="llm") == pytest.approx(
        0.08 / 0.30, rel=1e-6)
    assert [row["rank"] for row in result.labelsets("trainmon_diagnosis_finding_info")
            if row["finding"] == "data_wait"] == ["2"]


def test_data_wait_just_below_the_threshold_is_not_storage() -> None:
    node = Node()
    healthy_job(node)
    node.ranks[("llm", "2")].wait = 0.05  # 0.05 / 0.27 = 18.5 %
    assert job_verdicts(node.run()) == {"llm": "compute"}


def test_storage_from_a_sawtooth_gpu_with_a_rising_data_wait() -> None:
    node = Node()
    healthy_job(node, ranks=1)
    node.sawtooth["0"] = 0.8
    node.ranks[("llm", "0")].wait = 0.02
    collector = diagnosing(DiagnosisConfig(), node.source, clock=node.clock,
                                   wall_clock=node.wall)
    for wait in (0.02, 0.02, 0.02, 0.05, 0.06, 0.07):  # 8 % → 24 % of a growing step
        node.ranks[("llm", "0")].wait = wait
        node.tick()
        result = evaluated(collector)
    assert job_verdicts(result) == {"llm": "storage"}
    assert "sawtooth_data_wait" in findings(result, "llm")
    # the same waits, falling: no storage verdict
    falling = Node()
    healthy_job(falling, ranks=1)
    falling.sawtooth["0"] = 0.8
    collector = diagnosing(DiagnosisConfig(), falling.source, clock=falling.clock,
                                   wall_clock=falling.wall)
    for wait in (0.07, 0.06, 0.05, 0.03, 0.03, 0.03):
        falling.ranks[("llm", "0")].wait = wait
        falling.tick()
        result = evaluated(collector)
    assert job_verdicts(result) == {"llm": "compute"}


def test_communication_when_the_comm_phase_takes_40_percent() -> None:
    node = Node()
    healthy_job(node)
    for rank in node.ranks.values():
        rank.work, rank.comm = 0.12, 0.087  # 0.087 / 0.217 = 40 %
    result = node.run()
    assert job_verdicts(result) == {"llm": "communication"}
    assert result.value("trainmon_diagnosis_comm_ratio", job="llm") == pytest.approx(0.4, abs=0.01)


def test_synchronised_straggler_is_scheduling_not_communication() -> None:
    # In synchronous data parallelism every rank's step lasts as long as the
    # slowest rank's: the fast ranks wait inside the allreduce (their comm
    # phase, 0.12 s of 0.33 s: 36 %), 0.1 s of it for rank 3, whose own phase
    # (0.02 s, 6 %) is the transfer alone. The comm ratio is that of the rank
    # that waits least, as in job:trainmon_training_comm:ratio_rate10m: the
    # straggler is named, and no communication finding stands beside it.
    node = Node()
    healthy_job(node)
    for name, rank in node.ranks.items():
        slow = name[1] == "3"
        rank.work = 0.3 if slow else 0.2
        rank.comm = 0.02 if slow else 0.12  # 0.1 s of waiting for rank 3
    result = node.run()
    assert job_verdicts(result) == {"llm": "scheduling"}
    assert findings(result, "llm") == {"straggler"}
    assert result.value("trainmon_diagnosis_straggler_ratio", job="llm") == pytest.approx(1.5)
    assert result.value("trainmon_diagnosis_comm_ratio", job="llm") == pytest.approx(
        0.02 / 0.33, rel=1e-6)


def test_comm_phase_of_every_rank_is_communication_at_the_least_waiting_rank() -> None:
    # Every rank waits in its comm phase; rank 1 least (0.07 s of 0.2 s: 35 %).
    # The job is communication-bound at rank 1's share, not the median's.
    node = Node()
    healthy_job(node)
    for name, rank in node.ranks.items():
        rank.work, rank.comm = (0.12, 0.07) if name[1] == "1" else (0.12, 0.087)
    result = node.run()
    assert job_verdicts(result) == {"llm": "communication"}
    assert findings(result, "llm") == {"comm_phase"}
    assert result.value("trainmon_diagnosis_comm_ratio", job="llm") == pytest.approx(
        0.07 / 0.2, rel=1e-6)


def test_ranks_that_do_not_report_comm_are_left_out_of_the_comm_ratio() -> None:
    # Ranks 0-2 wait 40 % in their comm phase; rank 3 neither measures nor
    # reports one. Counting it as 0 would hide the communication-bound job (the
    # recording rule has no series for it either). Its hidden wait counts as its
    # work, which makes it 1.8x the median: the straggler rule's business, set
    # aside here with a factor of 2.
    node = Node()
    healthy_job(node)
    for rank in node.ranks.values():
        rank.work, rank.comm = 0.12, 0.087
    node.ranks[("llm", "3")].comm_phase = False
    result = node.run(DiagnosisConfig(straggler_factor=2.0))
    assert job_verdicts(result) == {"llm": "communication"}
    assert result.value("trainmon_diagnosis_comm_ratio", job="llm") == pytest.approx(
        0.087 / 0.217, rel=1e-6)
    # No rank reports communication: there is no comm ratio to export (not 0).
    silent = Node()
    healthy_job(silent)
    for rank in silent.ranks.values():
        rank.comm_phase = False
    result = silent.run()
    assert job_verdicts(result) == {"llm": "compute"}
    assert result.value("trainmon_diagnosis_comm_ratio", job="llm") is None


def measured_job(node: Node, exposed: float, overlapped: float, phase: bool = False) -> None:
    """The healthy job, measuring its communication (and reporting a comm phase or not)."""
    healthy_job(node)
    for rank in node.ranks.values():
        rank.measured, rank.comm_phase = True, phase
        rank.comm, rank.overlapped, rank.comm_bytes = exposed, overlapped, 2e9


def test_measured_exposed_comm_is_communication_although_the_gpus_look_busy() -> None:
    # NVML counts NCCL kernels as busy: the GPUs read 95 %, but the ranks wait
    # 0.087 s of each 0.217 s step for communication after their compute (40 %).
    node = Node()
    measured_job(node, exposed=0.087, overlapped=0.05)
    for rank in node.ranks.values():
        rank.work = 0.12
    result = node.run()
    assert job_verdicts(result) == {"llm": "communication"}
    assert findings(result, "llm") == {"comm_exposed"}
    assert result.value("trainmon_diagnosis_gpu_utilization_ratio", job="llm") == pytest.approx(
        0.95)
    assert result.value("trainmon_diagnosis_comm_ratio", job="llm") == pytest.approx(
        0.087 / 0.217, rel=1e-6)


def test_overlapped_comm_is_not_communication() -> None:
    # 0.3 s of collectives per 0.23 s step, all but 0.02 s hidden under the backward
    # pass: the comm phase (the whole collective time) would say 130 %.
    node = Node()
    measured_job(node, exposed=0.02, overlapped=0.28)
    result = node.run()
    assert job_verdicts(result) == {"llm": "compute"}
    assert findings(result, "llm") == {"gpu_bound"}
    assert result.value("trainmon_diagnosis_comm_ratio", job="llm") == pytest.approx(
        0.02 / 0.23, rel=1e-6)


def test_measured_exposed_comm_wins_over_the_comm_phase_and_is_never_added() -> None:
    # The comm phase wraps backward and its allreduce: 0.1 s of each 0.22 s step
    # (45 %). Measured inside the job, 0.01 s of it is exposed (4.5 %); the
    # measurement wins, and adding both (50 %) would be wrong.
    node = Node()
    measured_job(node, exposed=0.01, overlapped=0.08, phase=True)
    for rank in node.ranks.values():
        rank.phase_covers_work = 0.09
    result = node.run()
    assert job_verdicts(result) == {"llm": "compute"}
    assert result.value("trainmon_diagnosis_comm_ratio", job="llm") == pytest.approx(
        0.01 / 0.22, rel=1e-6)


def test_slow_rank_with_little_exposed_comm_is_scheduling_not_communication() -> None:
    # Measured inside the job: the fast ranks wait 0.12 s a step exposed in the
    # allreduce, 0.1 s of it for rank 3, whose own exposed comm (the transfer
    # itself) is 0.02 s. The fast ranks' exposed share (36 %) is a straggler's
    # doing, not the network's: scheduling, rank 3 named, no communication finding.
    node = Node()
    measured_job(node, exposed=0.12, overlapped=0.03)
    for name, rank in node.ranks.items():
        slow = name[1] == "3"
        rank.work = 0.3 if slow else 0.2
        rank.comm = 0.02 if slow else 0.12
    result = node.run()
    assert job_verdicts(result) == {"llm": "scheduling"}
    assert findings(result, "llm") == {"straggler"}
    assert result.value("trainmon_diagnosis_straggler_ratio", job="llm") == pytest.approx(1.5)
    assert result.value("trainmon_diagnosis_comm_ratio", job="llm") == pytest.approx(
        0.02 / 0.33, rel=1e-6)
    [straggler] = [row for row in result.labelsets("trainmon_diagnosis_finding_info")
                   if row["job"] == "llm"]
    assert (straggler["kind"], straggler["rank"]) == ("scheduling", "3")


def test_straggler_work_subtracts_exposed_comm_not_the_comm_phase() -> None:
    # Rank 3 computes 0.3 s against 0.2 s; the others wait 0.1 s for it, exposed.
    # Every comm phase also covers 0.15 s of backward: subtracting it would leave
    # the fast ranks 0.05 s of work and call rank 3 3x; the exposed comm gives 1.5x.
    node = Node()
    healthy_job(node)
    for name, rank in node.ranks.items():
        slow = name[1] == "3"
        rank.measured, rank.phase_covers_work = True, 0.15
        rank.work = 0.3 if slow else 0.2
        rank.comm = 0.02 if slow else 0.12
    result = node.run()
    assert job_verdicts(result) == {"llm": "scheduling"}
    assert result.value("trainmon_diagnosis_straggler_ratio", job="llm") == pytest.approx(1.5)


def test_ranks_without_measured_comm_fall_back_to_their_comm_phase() -> None:
    # Ranks 0-2 measure; rank 3 only reports its comm phase. Each rank's wait
    # comes from its own evidence, and the finding says communication was
    # measured (comm_exposed).
    node = Node()
    measured_job(node, exposed=0.087, overlapped=0.0)
    for rank in node.ranks.values():
        rank.work = 0.12
    node.ranks[("llm", "3")].measured = False
    node.ranks[("llm", "3")].comm_phase = True
    result = node.run()
    assert job_verdicts(result) == {"llm": "communication"}
    assert findings(result, "llm") == {"comm_exposed"}
    assert result.value("trainmon_diagnosis_straggler_ratio", job="llm") == pytest.approx(1.0)


def test_a_rank_with_too_few_steps_of_its_own_is_not_compared() -> None:
    # Rank 0 has only its first, slow steps in the window (2.4 < min_steps 3: a
    # DDP rank that just started); the others run normally. Counting the job's
    # steps together would call rank 0 a straggler at 60x the median.
    node = Node()
    healthy_job(node)
    node.ranks[("llm", "0")].work = 12.0
    result = node.run()
    assert "straggler" not in findings(result, "llm")
    assert job_verdicts(result) == {"llm": "compute"}
    # With enough of its own steps (a longer window), the same rank is named.
    longer = node.run(DiagnosisConfig(window_seconds=120), ticks=24)
    assert "straggler" in findings(longer, "llm")


def test_two_rank_job_with_a_straggler() -> None:
    # The median of two ranks is their mean, the straggler included (as PromQL's
    # quantile(0.5, ...) of the recording rule): 0.4 / 0.3.
    node = Node()
    healthy_job(node, ranks=2)
    node.ranks[("llm", "1")].work = 0.4
    result = node.run()
    assert job_verdicts(result) == {"llm": "scheduling"}
    assert result.value("trainmon_diagnosis_straggler_ratio", job="llm") == pytest.approx(
        0.4 / 0.3)


def test_a_rank_slower_than_the_factor_of_the_other_rank_alone_is_fine_in_two() -> None:
    # 0.3 s against 0.2 s is 1.5x the other rank but 1.2x the job's median.
    node = Node()
    healthy_job(node, ranks=2)
    node.ranks[("llm", "1")].work = 0.3
    result = node.run()
    assert job_verdicts(result) == {"llm": "compute"}
    assert result.value("trainmon_diagnosis_straggler_ratio", job="llm") == pytest.approx(1.2)


def test_ranks_within_the_straggler_factor_are_fine() -> None:
    node = Node()
    healthy_job(node)
    node.ranks[("llm", "3")].work = 0.24  # 1.2x, below the contract's 1.25
    assert job_verdicts(node.run()) == {"llm": "compute"}


def test_link_near_its_rate_is_communication_when_no_comm_phase_is_reported() -> None:
    node = Node()
    healthy_job(node)
    for rank in node.ranks.values():
        rank.comm_phase = False
    node.source.set("trainmon_infiniband_rate_bytes", 25e9, device="mlx5_0", port="1")
    collector = diagnosing(DiagnosisConfig(), node.source, clock=node.clock,
                                   wall_clock=node.wall)
    for _ in range(4):
        node.source.add("trainmon_infiniband_transmit_bytes_total", 5 * 22e9,
                        device="mlx5_0", port="1")
        node.source.add("trainmon_infiniband_receive_bytes_total", 5 * 1e9,
                        device="mlx5_0", port="1")
        node.tick()
        result = evaluated(collector)
    assert job_verdicts(result) == {"llm": "communication"}
    assert "link_saturated" in findings(result, "llm")


def test_idle_gpu_of_a_stepping_job_is_scheduling() -> None:
    node = Node()
    healthy_job(node, ranks=2)
    node.gpus["1"] = 0.0
    result = node.run()
    assert job_verdicts(result) == {"llm": "scheduling"}
    assert result.value("trainmon_diagnosis_idle_gpus", job="llm") == 1


def test_host_bound_job_is_compute_with_its_own_finding() -> None:
    node = Node()
    healthy_job(node, ranks=2)
    node.gpus.update({"0": 0.3, "1": 0.35})
    result = node.run()
    assert job_verdicts(result) == {"llm": "compute"}
    assert findings(result, "llm") == {"host_bound"}


def stalled_job() -> tuple[Node, DiagnosisCollector]:
    """Two healthy ranks, seen once, that then stop stepping (stall_seconds 60)."""
    node = Node()
    healthy_job(node, ranks=2)
    collector = diagnosing(DiagnosisConfig(stall_seconds=60), node.source,
                                   clock=node.clock, wall_clock=node.wall)
    node.tick()
    for rank in node.ranks.values():
        rank.stepping = False
    return node, collector


def test_stalled_job_is_scheduling() -> None:
    node, collector = stalled_job()
    for _ in range(14):  # 70 s without a step
        node.tick()
        result = evaluated(collector)
    assert job_verdicts(result) == {"llm": "scheduling"}
    assert findings(result, "llm") == {"stalled", "insufficient_data"}
    assert result.value("trainmon_diagnosis_stalled_ranks", job="llm") == 2


def test_a_new_job_has_no_verdict_yet() -> None:
    node = Node()
    healthy_job(node, ranks=1)
    node.ranks[("llm", "0")].work = 10.0  # one step per 10 s
    result = node.run(ticks=1)
    assert job_verdicts(result) == {"llm": "none"}
    assert findings(result, "llm") == {"insufficient_data"}


def test_gpu_held_by_a_process_that_does_no_work() -> None:
    node = Node()
    healthy_job(node, ranks=2)
    node.gpus.update({"6": 0.0, "7": 0.9})
    node.source.set("trainmon_gpu_process_info", 1, gpu="6", pid="777", pod="notebook-x",
                    namespace="research", container="jupyter", slurm_job="", pod_uid="u1",
                    container_id="")
    node.source.set("trainmon_gpu_process_info", 1, gpu="7", pid="888", pod="", namespace="",
                    container="", slurm_job="4242", pod_uid="", container_id="")
    node.source.set("trainmon_gpu_process_info", 1, gpu="0", pid="5000", pod="", namespace="",
                    container="", slurm_job="", pod_uid="", container_id="")
    result = node.run()
    assert job_verdicts(result) == {
        "llm": "compute",  # pid 5000 is its rank 0
        "pod:research/notebook-x": "scheduling",
        "slurm:4242": "none",  # busy, but without step telemetry nothing can be said
    }
    assert findings(result, "pod:research/notebook-x") == {"idle_held"}


def test_process_claimed_by_its_gpu_when_pids_differ_across_namespaces() -> None:
    node = Node()
    healthy_job(node, ranks=2)
    node.source.set("trainmon_gpu_process_info", 1, gpu="1", pid="424242", pod="", namespace="",
                    container="", slurm_job="", pod_uid="", container_id="")
    assert job_verdicts(node.run()) == {"llm": "compute"}


def test_verdicts_follow_the_config_thresholds() -> None:
    node = Node()
    healthy_job(node)
    for rank in node.ranks.values():
        rank.work, rank.comm = 0.12, 0.087
    config = parse_config({"collectors": {"diagnosis": {"comm_ratio": 0.5}}})
    assert job_verdicts(node.run(config.collectors.diagnosis)) == {"llm": "compute"}


def test_a_failing_source_does_not_stop_the_verdict(caplog: pytest.LogCaptureFixture) -> None:
    class Broken(ContractSource):
        def collect(self):  # type: ignore[no-untyped-def]
            raise OSError("device vanished")

    node = Node()
    healthy_job(node)
    collector = diagnosing(DiagnosisConfig(), Broken(name="broken"), node.source,
                                   clock=node.clock, wall_clock=node.wall)
    for _ in range(3):
        node.tick()
        result = evaluated(collector)
    assert job_verdicts(result) == {"llm": "compute"}
    assert result.value("trainmon_collector_success", collector="broken") == 0
    assert result.value("trainmon_collector_success", collector="diagnosis") == 1
    assert caplog.text.count("collector broken failed: OSError: device vanished") == 1


def test_old_snapshots_leave_the_window() -> None:
    node = Node()
    healthy_job(node, ranks=1)
    node.ranks[("llm", "0")].wait = 0.2  # starved at first ...
    collector = diagnosing(DiagnosisConfig(window_seconds=20), node.source,
                                   clock=node.clock, wall_clock=node.wall)
    for _ in range(4):
        node.tick()
        evaluated(collector)
    node.ranks[("llm", "0")].wait = 0.01  # ... then fixed: the verdict follows within a window
    for _ in range(5):
        node.tick()
        result = evaluated(collector)
    assert job_verdicts(result) == {"llm": "compute"}
    assert result.value("trainmon_diagnosis_window_seconds") == 20


@pytest.mark.parametrize(
    ("settings", "key"),
    [
        ({"data_wait_ratio": 1.5}, "data_wait_ratio"),
        ({"straggler_factor": 0.9}, "straggler_factor"),
        ({"idle_utilization_ratio": 0.7}, "idle_utilization_ratio"),
        ({"comm_phases": []}, "comm_phases"),
        ({"stall_seconds": "soon"}, "stall_seconds"),
        ({"sm_active_low_ratio": 1.5}, "sm_active_low_ratio"),
        ({"tensor_idle_ratio": -0.1}, "tensor_idle_ratio"),
        ({"dram_active_ceiling_ratio": 2}, "dram_active_ceiling_ratio"),
        ({"memory_headroom_ratio": "some"}, "memory_headroom_ratio"),
    ],
)
def test_diagnosis_config_is_validated(settings: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError, match=rf"collectors\.diagnosis\.{key}"):
        parse_config({"collectors": {"diagnosis": settings}})


def test_scrapes_closer_than_a_twentieth_of_the_window_reuse_the_verdict() -> None:
    node = Node()
    healthy_job(node)
    registry = diagnosing(DiagnosisConfig(window_seconds=60), node.source,
                          clock=node.clock, wall_clock=node.wall)

    def snapshots() -> object:
        return registry.health()["collectors"]["diagnosis"]["snapshots"]  # type: ignore[index]

    for _ in range(3):
        node.tick()
        evaluated(registry)
    assert snapshots() == 3
    node.now += 2.9  # under 60 / 20 s: no new evaluation
    again = evaluated(registry)
    assert snapshots() == 3
    assert job_verdicts(again) == {"llm": "compute"}
    node.now += 0.2
    scrape(registry)  # a scrape never evaluates ...
    assert snapshots() == 3
    evaluated(registry)  # ... the registry's evaluation does
    assert snapshots() == 4


def test_an_evaluation_collects_each_source_once_and_a_scrape_reads_its_verdict() -> None:
    class Counting(ContractSource):
        collections = 0

        def collect(self):  # type: ignore[no-untyped-def]
            Counting.collections += 1
            return super().collect()

    node = Node(source=Counting())
    healthy_job(node)
    registry = diagnosing(DiagnosisConfig(), node.source, clock=node.clock, wall_clock=node.wall)
    assert job_verdicts(scrape(registry)) == {}  # nothing evaluated yet
    for _ in range(4):
        node.tick()
        registry.evaluate()
    assert Counting.collections == 5  # the scrape, then once per evaluation
    result = scrape(registry)
    assert Counting.collections == 6  # a scrape collects the sources for its own output
    assert job_verdicts(result) == {"llm": "compute"}


@pytest.mark.parametrize(("reporting", "verdict"), [(True, "scheduling"), (False, "none")])
def test_a_stall_needs_a_live_reporter_when_heartbeats_are_exported(
    reporting: bool, verdict: str
) -> None:
    # trainmon_training_last_report_timestamp_seconds tells a hung job (its
    # reporter still sends) from one that finished (silent until its TTL).
    node, collector = stalled_job()
    for _ in range(14):
        node.tick()
        for job, rank_name in node.ranks:
            if reporting or node.now < 1020:  # finished: silent after the first 20 s
                node.source.set("trainmon_training_last_report_timestamp_seconds", node.wall(),
                                job=job, rank=rank_name)
        result = evaluated(collector)
    assert job_verdicts(result) == {"llm": verdict}


# -- compute with GPM activity (Hopper and newer) -------------------------------------


def gpm_job(node: Node, sm_active: float, tensor: float, dram: float,
            utilization: float = 1.0, ranks: int = 2) -> None:
    """The healthy job on GPUs with GPM, at ``utilization`` by NVML."""
    healthy_job(node, ranks=ranks)
    for gpu in list(node.gpus):
        node.gpus[gpu] = utilization
        node.gpm[gpu] = (sm_active, 0.15, tensor, dram)


def finding_order(result: Scrape, job: str) -> list[str]:
    return [row["finding"] for row in result.labelsets("trainmon_diagnosis_finding_info")
            if row["job"] == job]


def test_busy_gpu_with_idle_sms_is_compute_inefficient_launch_bound() -> None:
    # Acceptance: 100 % utilization by NVML, but only 20 % of SM cycles have a
    # warp resident: small kernels launched one by one. The tensor pipes are
    # idle as well; launch-bound decides (it comes first).
    node = Node()
    gpm_job(node, sm_active=0.2, tensor=0.0, dram=0.1)
    result = node.run()
    assert job_verdicts(result) == {"llm": "compute"}
    assert finding_order(result, "llm") == ["launch_bound", "tensor_idle"]
    assert result.value("trainmon_diagnosis_gpu_utilization_ratio", job="llm") == 1.0
    assert result.value("trainmon_diagnosis_sm_active_ratio", job="llm") == pytest.approx(0.2)
    assert result.value("trainmon_diagnosis_sm_occupancy_ratio", job="llm") == pytest.approx(
        0.15)
    assert result.value("trainmon_diagnosis_tensor_active_ratio", job="llm") == 0.0
    assert result.value("trainmon_diagnosis_dram_active_ratio", job="llm") == pytest.approx(0.1)


def test_high_tensor_activity_is_compute_efficient() -> None:
    node = Node()
    gpm_job(node, sm_active=0.85, tensor=0.7, dram=0.4)
    result = node.run()
    assert job_verdicts(result) == {"llm": "compute"}
    assert finding_order(result, "llm") == ["gpu_efficient"]
    assert result.value("trainmon_diagnosis_tensor_active_ratio", job="llm") == pytest.approx(
        0.7)


@pytest.mark.parametrize(("sm_active", "expected"), [
    (0.45, ["launch_bound"]), (0.5, ["gpu_efficient"]), (0.55, ["gpu_efficient"])])
def test_launch_bound_below_the_sm_active_low_level(sm_active: float,
                                                     expected: list[str]) -> None:
    node = Node()
    gpm_job(node, sm_active=sm_active, tensor=0.3, dram=0.3)
    assert finding_order(node.run(), "llm") == expected


def test_idle_tensor_pipes_on_a_busy_gpu_mean_no_mixed_precision() -> None:
    node = Node()
    gpm_job(node, sm_active=0.9, tensor=0.01, dram=0.3)
    result = node.run()
    assert job_verdicts(result) == {"llm": "compute"}
    assert finding_order(result, "llm") == ["tensor_idle"]
    # just above the idle level the tensor cores count as used
    used = Node()
    gpm_job(used, sm_active=0.9, tensor=0.06, dram=0.3)
    assert finding_order(used.run(), "llm") == ["gpu_efficient"]


def test_dram_near_its_ceiling_is_memory_bound() -> None:
    node = Node()
    gpm_job(node, sm_active=0.9, tensor=0.3, dram=0.85)
    result = node.run()
    assert job_verdicts(result) == {"llm": "compute"}
    assert finding_order(result, "llm") == ["memory_bound"]
    below = Node()
    gpm_job(below, sm_active=0.9, tensor=0.3, dram=0.65)
    assert finding_order(below.run(), "llm") == ["gpu_efficient"]


def test_gpm_thresholds_follow_the_config() -> None:
    node = Node()
    gpm_job(node, sm_active=0.6, tensor=0.1, dram=0.5)
    config = parse_config({"collectors": {"diagnosis": {
        "sm_active_low_ratio": 0.7, "tensor_idle_ratio": 0.2,
        "dram_active_ceiling_ratio": 0.5}}}).collectors.diagnosis
    assert finding_order(node.run(config), "llm") == ["launch_bound", "memory_bound",
                                                      "tensor_idle"]


def test_gpm_activity_is_the_mean_of_the_job_gpus_that_have_it() -> None:
    # GPU 1 has no GPM (an older GPU beside a Hopper, or GPM unsupported): the
    # activity is GPU 0's, and GPU 1 does not count as 0.
    node = Node()
    gpm_job(node, sm_active=0.3, tensor=0.2, dram=0.2)
    del node.gpm["1"]
    result = node.run()
    assert result.value("trainmon_diagnosis_sm_active_ratio", job="llm") == pytest.approx(0.3)
    assert finding_order(result, "llm") == ["launch_bound"]


def test_tensor_activity_from_the_tensor_pipes_when_the_total_is_missing() -> None:
    node = Node()
    healthy_job(node, ranks=1)
    node.source.set("trainmon_gpu_sm_active_ratio", 0.9, gpu="0")
    node.pipes["0"] = {"tensor_hmma": 0.6, "tensor_imma": 0.0, "fp32": 0.2}
    result = node.run()
    assert result.value("trainmon_diagnosis_tensor_active_ratio", job="llm") == pytest.approx(
        0.6)
    assert finding_order(result, "llm") == ["gpu_efficient"]


def test_without_gpm_the_busy_case_stays_gpu_bound_on_utilization_alone() -> None:
    node = Node()
    healthy_job(node)
    result = node.run()
    assert finding_order(result, "llm") == ["gpu_bound"]
    for name in ("sm_active", "sm_occupancy", "tensor_active", "dram_active"):
        assert result.value(f"trainmon_diagnosis_{name}_ratio", job="llm") is None


def test_low_utilization_is_host_bound_whatever_the_sms_say() -> None:
    node = Node()
    gpm_job(node, sm_active=0.2, tensor=0.0, dram=0.1, utilization=0.3)
    assert finding_order(node.run(), "llm") == ["host_bound"]


def test_busy_gpus_with_idle_sms_and_exposed_comm_are_communication() -> None:
    # NVML reads 97 % busy, the SMs are active 20 %: NCCL kernels keep the GPU
    # "busy" while the ranks wait 40 % of each step for exposed communication.
    # The communication rule decides; no launch-bound finding stands beside it.
    node = Node()
    measured_job(node, exposed=0.087, overlapped=0.0)
    for gpu in node.gpus:
        node.gpus[gpu] = 0.97
        node.gpm[gpu] = (0.2, 0.1, 0.0, 0.05)
    for rank in node.ranks.values():
        rank.work = 0.12
    result = node.run()
    assert job_verdicts(result) == {"llm": "communication"}
    assert finding_order(result, "llm") == ["comm_exposed"]
    assert result.value("trainmon_diagnosis_sm_active_ratio", job="llm") == pytest.approx(0.2)


def test_memory_within_the_headroom_is_an_oom_risk_beside_the_verdict() -> None:
    node = Node()
    gpm_job(node, sm_active=0.85, tensor=0.7, dram=0.4)
    node.memory = {"0": (78 * 2**30, 80 * 2**30), "1": (60 * 2**30, 80 * 2**30)}
    result = node.run()
    assert job_verdicts(result) == {"llm": "compute"}
    assert finding_order(result, "llm") == ["gpu_efficient", "oom_risk"]
    assert result.value("trainmon_diagnosis_memory_used_ratio", job="llm") == pytest.approx(
        78 / 80)
    # beside a storage verdict too: the risk is the job's, whatever holds it back
    starved = Node()
    gpm_job(starved, sm_active=0.85, tensor=0.7, dram=0.4)
    starved.ranks[("llm", "1")].wait = 0.1
    starved.memory = {"1": (79 * 2**30, 80 * 2**30)}
    result = starved.run()
    assert job_verdicts(result) == {"llm": "storage"}
    assert finding_order(result, "llm") == ["data_wait", "oom_risk"]
    # 93 % used leaves more than the 5 % headroom
    roomy = Node()
    gpm_job(roomy, sm_active=0.85, tensor=0.7, dram=0.4)
    roomy.memory = {"0": (74.4 * 2**30, 80 * 2**30)}
    result = roomy.run()
    assert finding_order(result, "llm") == ["gpu_efficient"]
    assert result.value("trainmon_diagnosis_memory_used_ratio", job="llm") == pytest.approx(
        0.93)
