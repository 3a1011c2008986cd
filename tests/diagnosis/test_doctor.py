"""``doctor``'s measurement paths, report and exit codes, without waiting in real time.

A loopback HTTP server plays the daemon: it renders contract samples that
advance on every request (Prometheus text, parsed back by prometheus_client's
parser); measurements there last well under a second. The local mode runs
collectors handed to it, with ``sleep`` injected so no time passes.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Iterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric

from tests.diagnosis.diagnosis_support import ContractSource
from tests.support.loopback import LoopbackHTTPServer, Reply, Request
from trainmon.config import DiagnosisConfig
from trainmon.core.collector import Collector, CollectorUnavailable
from trainmon.diagnosis.doctor import DoctorOptions, metrics_url, run_doctor


class StarvedNode:
    """A node with one job whose rank 1 waits 40 % of each 0.5 s step, GPU sawtooth."""

    def __init__(self) -> None:
        self.source = ContractSource()
        self.requests = 0

    def advance(self) -> None:
        s = self.source
        for rank, wait in (("0", 0.02), ("1", 0.2)):
            key = {"job": "vit", "rank": rank}
            s.set("trainmon_training_rank_info", 1, **key, gpu=rank, pid=str(100 + int(rank)))
            s.add("trainmon_training_step_seconds_count", 2, **key)
            s.add("trainmon_training_step_seconds_sum", 1.0, **key)
            s.add("trainmon_training_data_wait_seconds_total", 2 * wait, **key)
            s.set("trainmon_training_last_step_timestamp_seconds", 1.9e9, **key)
        for gpu in ("0", "1"):
            s.set("trainmon_gpu_utilization_ratio", 0.5, gpu=gpu)
            s.set("trainmon_gpu_sawtooth_ratio", 0.7, gpu=gpu)
            s.set("trainmon_gpu_memory_used_bytes", 2**33, gpu=gpu)
        s.set("trainmon_gpu_process_info", 1, gpu="0", pid="100", pod="vit-0", namespace="ml",
              container="main", slurm_job="", pod_uid="u", container_id="c")
        s.set("trainmon_nccl_problem_info", 1, pid="100", problem="debug_logging",
              variable="NCCL_DEBUG", value="INFO")
        s.add("trainmon_disk_io_time_seconds_total", 0.5, device="nvme0n1")
        s.add("trainmon_disk_read_bytes_total", 2e9, device="nvme0n1")
        s.add("trainmon_disk_written_bytes_total", 0, device="nvme0n1")
        s.add("trainmon_network_receive_bytes_total", 1e8, device="eth0")
        s.add("trainmon_network_transmit_bytes_total", 1e7, device="eth0")
        s.set("trainmon_network_speed_bytes", 3.125e9, device="eth0")

    def text(self) -> bytes:
        self.requests += 1
        self.advance()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self.source)
        return generate_latest(registry)


@pytest.fixture
def daemon() -> Iterator[tuple[str, StarvedNode]]:
    node = StarvedNode()

    def answer(request: Request) -> Reply:
        if request.path != "/metrics":
            return Reply(404)
        return Reply(200, node.text(), "text/plain; version=0.0.4")

    with LoopbackHTTPServer(answer) as server:
        yield server.address, node


def doctor_json(options: DoctorOptions, collectors: list[Collector] | None = None,
                ) -> tuple[int, dict[str, object]]:
    out = io.StringIO()
    code = run_doctor(options, DiagnosisConfig(), lambda: collectors or [], out,
                      sleep=lambda s: None)
    return code, json.loads(out.getvalue())


def test_doctor_reads_a_daemon_and_names_storage(daemon: tuple[str, StarvedNode]) -> None:
    url, node = daemon
    out = io.StringIO()
    code = run_doctor(DoctorOptions(url=url, seconds=0.6, interval_seconds=0.2, json=True),
                      DiagnosisConfig(), list, out)
    report = json.loads(out.getvalue())
    assert code == 1 and report["exit_code"] == 1 and report["status"] == "bottleneck"
    assert node.requests == report["source"]["snapshots"] >= 3  # about every 0.2 s
    [job] = report["jobs"]
    assert (job["job"], job["kind"]) == ("vit", "storage")
    assert [f["code"] for f in job["findings"]] == ["data_wait"]
    assert job["evidence"]["worst_data_wait_rank"] == "1"
    assert job["evidence"]["data_wait_ratio"] == pytest.approx(0.4)
    assert job["nccl"][0]["problem"] == "debug_logging"
    assert report["gpus"][0]["processes"][0]["job"] == "vit"
    assert report["gpus"][0]["processes"][0]["pod"] == "vit-0"
    assert report["storage"]["disks"][0]["read_bytes_per_second"] > 0
    assert report["network"]["links"][0]["device"] == "eth0"


def test_text_report_goes_gpu_storage_network_verdict(daemon: tuple[str, StarvedNode]) -> None:
    url, _ = daemon
    for lang, headings, verdict in (
        ("en", ["1. GPU", "2. Storage", "3. Network", "4. Verdict"], "vit: STORAGE — rank 1"),
        ("zh", ["1. GPU", "2. 存储", "3. 网络", "4. 结论"], "vit: 存（数据加载与存储） — rank 1"),
    ):
        out = io.StringIO()
        code = run_doctor(DoctorOptions(url=url, seconds=0.4, interval_seconds=0.2, lang=lang),
                          DiagnosisConfig(), list, out)
        text = out.getvalue()
        assert code == 1
        positions = [text.index(heading) for heading in headings]
        assert positions == sorted(positions), text
        assert verdict in text
        assert "gpu 0: 50%" in text and "pod ml/vit-0" in text
        assert "NCCL" in text and "NCCL_DEBUG=INFO" in text


class Recorder(ContractSource):
    """A local collector that records start/stop and may refuse to start."""

    def __init__(self, name: str, available: bool = True) -> None:
        super().__init__(name=name)
        self.available = available
        self.calls: list[str] = []

    def start(self) -> None:
        self.calls.append("start")
        if not self.available:
            raise CollectorUnavailable("no such device")

    def stop(self) -> None:
        self.calls.append("stop")

    def collect(self) -> Iterable[Metric]:
        self.calls.append("collect")
        return super().collect()


def test_local_mode_runs_the_node_collectors_and_stops_them() -> None:
    node = StarvedNode()
    training = Recorder("training")
    training.samples = node.source.samples
    absent = Recorder("infiniband", available=False)
    cloud = Recorder("tencent")
    verdict = Recorder("diagnosis")
    collected = 0

    def advancing_sleep(seconds: float) -> None:
        nonlocal collected
        node.advance()
        collected += 1

    out = io.StringIO()
    code = run_doctor(DoctorOptions(seconds=0.05, interval_seconds=0.01, json=True),
                      DiagnosisConfig(), lambda: [training, absent, cloud, verdict], out,
                      sleep=advancing_sleep)
    report = json.loads(out.getvalue())
    assert report["source"]["kind"] == "local"
    assert code == 1 and [j["kind"] for j in report["jobs"]] == ["storage"]
    assert training.calls[0] == "start" and training.calls[-1] == "stop"
    # one collection per snapshot, plus the registry's start-up collection
    assert report["source"]["snapshots"] == collected + 1
    assert training.calls.count("collect") == report["source"]["snapshots"] + 1
    assert absent.calls[0] == "start" and absent.calls[-1] == "stop"
    assert cloud.calls == [] and verdict.calls == []  # never run by doctor


def test_exit_codes_for_healthy_and_unmeasurable_nodes() -> None:
    healthy = ContractSource(name="gpu")
    healthy.set("trainmon_gpu_utilization_ratio", 0.0, gpu="0")
    code, report = doctor_json(DoctorOptions(seconds=0, json=True), [healthy])
    assert (code, report["status"]) == (0, "healthy")  # an idle node: nothing to do
    code, report = doctor_json(DoctorOptions(seconds=0, json=True), [])
    assert (code, report["status"]) == (2, "unmeasured")


def test_a_url_that_is_not_prometheus_text(daemon: tuple[str, StarvedNode]) -> None:
    url, _ = daemon
    code, report = doctor_json(DoctorOptions(url=f"http://{url}/missing", seconds=0, json=True))
    assert code == 2 and "404" in str(report["reason"])


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("127.0.0.1:19400", "http://127.0.0.1:19400/metrics"),
        ("http://node-7:19400/", "http://node-7:19400/metrics"),
        ("https://node-7:19400/federate/metrics", "https://node-7:19400/federate/metrics"),
    ],
)
def test_metrics_url(given: str, expected: str) -> None:
    assert metrics_url(given) == expected


class CommunicatingNode:
    """One 2-rank job on busy GPUs whose ranks wait 40 % of each 0.5 s step for
    communication: measured inside the job (exposed 0.2 s of 0.3 s of collectives,
    1.2 GB a step) or only as a ``comm`` phase."""

    def __init__(self, measured: bool) -> None:
        self.source = ContractSource(name="training")
        self.measured = measured

    def advance(self) -> None:
        s = self.source
        for rank in ("0", "1"):
            key = {"job": "llm", "rank": rank}
            s.set("trainmon_training_rank_info", 1, **key, gpu=rank, pid=str(200 + int(rank)))
            s.add("trainmon_training_step_seconds_count", 2, **key)
            s.add("trainmon_training_step_seconds_sum", 1.0, **key)
            s.add("trainmon_training_data_wait_seconds_total", 0.02, **key)
            s.set("trainmon_training_last_step_timestamp_seconds", 1.9e9, **key)
            if self.measured:
                s.add("trainmon_training_comm_seconds_total", 0.6, **key)
                s.add("trainmon_training_comm_exposed_seconds_total", 0.4, **key)
                s.add("trainmon_training_comm_bytes_total", 2.4e9, **key)
            else:
                s.add("trainmon_training_phase_seconds_total", 0.4, **key, phase="comm")
            s.set("trainmon_gpu_utilization_ratio", 0.97, gpu=rank)


def communicating_report(measured: bool, lang: str, json_out: bool) -> tuple[int, str]:
    node = CommunicatingNode(measured)
    out = io.StringIO()
    code = run_doctor(DoctorOptions(seconds=0.05, interval_seconds=0.01, json=json_out,
                                    lang=lang),
                      DiagnosisConfig(), lambda: [node.source], out,
                      sleep=lambda seconds: node.advance())
    return code, out.getvalue()


def test_measured_exposed_comm_names_communication_with_its_evidence() -> None:
    code, text = communicating_report(measured=True, lang="en", json_out=True)
    report = json.loads(text)
    [job] = report["jobs"]
    assert code == 1 and job["kind"] == "communication"
    assert [f["code"] for f in job["findings"]] == ["comm_exposed"]
    evidence = job["evidence"]
    assert evidence["comm_source"] == "measured"
    assert evidence["comm_ratio"] == pytest.approx(0.4)
    assert evidence["comm_overlapped_ratio"] == pytest.approx(0.2)
    assert evidence["comm_bytes_per_second"] == pytest.approx(4e9)
    assert evidence["gpu_utilization_ratio"] == pytest.approx(0.97)
    assert report["network"]["jobs"] == [{
        "job": "llm", "comm_ratio": pytest.approx(0.4), "comm_source": "measured",
        "comm_overlapped_ratio": pytest.approx(0.2), "comm_bytes_per_second": pytest.approx(4e9),
    }]


@pytest.mark.parametrize(
    ("measured", "lang", "evidence", "next_step"),
    [
        (True, "en", "communication 40% (measured exposed communication; overlapped with "
         "compute 20%; 4.0 GB/s while communicating)", "NCCL_SOCKET_IFNAME"),
        (True, "zh", "通信 40% (实测暴露通信; 与计算重叠 20%; 4.0 GB/s 通信时带宽)",
         "NCCL_SOCKET_IFNAME"),
        (False, "en", "communication 40% (comm phase, not measured inside the job)",
         "reporter.instrument(model)"),
        (False, "zh", "通信 40% (comm 阶段，任务内未实测)", "reporter.instrument(model)"),
    ],
)
def test_doctor_text_says_which_comm_evidence_it_used(
    measured: bool, lang: str, evidence: str, next_step: str
) -> None:
    code, text = communicating_report(measured, lang, json_out=False)
    assert code == 1
    assert evidence in text, text
    verdict = next(line for line in text.splitlines() if line.startswith("   llm:"))
    assert ("通（通信）" if lang == "zh" else "COMMUNICATION") in verdict
    basis = {(True, "en"): "measured exposed communication", (True, "zh"): "实测的暴露通信",
             (False, "en"): "the comm phase", (False, "zh"): "依据 comm 阶段"}
    assert basis[measured, lang] in verdict
    advice = next(line for line in text.splitlines()
                  if line.strip().startswith("next:" if lang == "en" else "下一步:"))
    assert next_step in advice and "NCCL_IB" in advice and "bucket_cap_mb" in advice
