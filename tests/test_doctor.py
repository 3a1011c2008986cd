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
from prometheus_client.core import Metric

from testkit.loopback import LoopbackHTTPServer, Reply, Request
from tests.diagnosis.diagnosis_support import ContractSource, PlatformNode, StarvedNode
from trainmon.core.collector import Collector, CollectorUnavailable
from trainmon.diagnosis.finding import SEVERITIES
from trainmon.diagnosis.thresholds import DiagnosisConfig
from trainmon.doctor import DoctorOptions, metrics_url, run_doctor
from trainmon.node.mounts import STORAGE_KINDS
from trainmon.platform.config import PROVIDERS
from trainmon.report import messages as catalogue
from trainmon.report.render import render_text


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


class GPMNode:
    """One 2-rank job that hardly waits, on GPUs at ``utilization`` by NVML, with
    GPM activity ``gpm`` = (SM active, SM occupancy, tensor active, DRAM active)
    or none (GPUs before Hopper), and ``used`` of 80 GiB memory."""

    def __init__(self, gpm: tuple[float, float, float, float] | None,
                 utilization: float = 1.0, used: float = 20 * 2**30,
                 exposed_comm: float = 0.0) -> None:
        self.source = ContractSource(name="gpu")
        self.gpm, self.utilization, self.used = gpm, utilization, used
        self.exposed_comm = exposed_comm

    def advance(self) -> None:
        s = self.source
        for rank in ("0", "1"):
            key = {"job": "llm", "rank": rank}
            s.set("trainmon_training_rank_info", 1, **key, gpu=rank, pid=str(300 + int(rank)))
            s.add("trainmon_training_step_seconds_count", 2, **key)
            s.add("trainmon_training_step_seconds_sum", 1.0, **key)
            s.add("trainmon_training_data_wait_seconds_total", 0.01, **key)
            s.add("trainmon_training_comm_seconds_total", self.exposed_comm, **key)
            s.add("trainmon_training_comm_exposed_seconds_total", self.exposed_comm, **key)
            s.set("trainmon_training_last_step_timestamp_seconds", 1.9e9, **key)
            s.set("trainmon_gpu_utilization_ratio", self.utilization, gpu=rank)
            s.set("trainmon_gpu_memory_used_bytes", self.used, gpu=rank)
            s.set("trainmon_gpu_memory_total_bytes", 80 * 2**30, gpu=rank)
            if self.gpm is not None:
                sm_active, occupancy, tensor, dram = self.gpm
                s.set("trainmon_gpu_sm_active_ratio", sm_active, gpu=rank)
                s.set("trainmon_gpu_sm_occupancy_ratio", occupancy, gpu=rank)
                s.set("trainmon_gpu_tensor_active_ratio", tensor, gpu=rank)
                s.set("trainmon_gpu_dram_active_ratio", dram, gpu=rank)
                s.set("trainmon_gpu_pipe_active_ratio", tensor, gpu=rank, pipe="tensor_hmma")
                s.set("trainmon_gpu_pipe_active_ratio", 0.05, gpu=rank, pipe="fp32")


def gpm_report(node: GPMNode, lang: str = "en", json_out: bool = True) -> tuple[int, str]:
    out = io.StringIO()
    code = run_doctor(DoctorOptions(seconds=0.05, interval_seconds=0.01, json=json_out,
                                    lang=lang),
                      DiagnosisConfig(), lambda: [node.source], out,
                      sleep=lambda seconds: node.advance())
    return code, out.getvalue()


def verdict_lines(text: str) -> tuple[str, str]:
    """The job's verdict line and its next step."""
    lines = text.splitlines()
    verdict = next(index for index, line in enumerate(lines) if line.startswith("   llm:"))
    advice = next(line for line in lines[verdict:]
                  if line.strip().startswith(("next:", "下一步:")))
    return lines[verdict], advice


def test_busy_gpus_with_idle_sms_are_launch_bound_in_json() -> None:
    # Acceptance: 100 % busy by NVML, 20 % SM active: compute, inefficient.
    code, text = gpm_report(GPMNode(gpm=(0.2, 0.15, 0.0, 0.1)))
    report = json.loads(text)
    [job] = report["jobs"]
    assert (code, job["kind"]) == (0, "compute")  # compute is not an actionable verdict
    assert [f["code"] for f in job["findings"]] == ["launch_bound", "tensor_idle"]
    values = job["findings"][0]["values"]
    assert values["sm_active"] == pytest.approx(0.2) and values["utilization"] == 1.0
    assert values["threshold"] == 0.5 and values["gpus"] == "0,1"
    evidence = job["evidence"]
    assert evidence["sm_active_ratio"] == pytest.approx(0.2)
    assert evidence["sm_occupancy_ratio"] == pytest.approx(0.15)
    assert evidence["tensor_active_ratio"] == 0.0
    assert evidence["dram_active_ratio"] == pytest.approx(0.1)
    assert evidence["pipe_active_ratio"] == {"fp32": pytest.approx(0.05), "tensor_hmma": 0.0}
    assert evidence["gpm_gpus"] == ["0", "1"]
    assert evidence["memory_used_ratio"] == pytest.approx(0.25)
    assert evidence["memory_full_gpus"] == []
    gpu = report["gpus"][0]
    assert gpu["sm_active_ratio"] == pytest.approx(0.2)
    assert gpu["memory_total_bytes"] == 80 * 2**30
    assert "CUDA graphs" in job["advice"] and "torch.compile" in job["advice"]


@pytest.mark.parametrize(("lang", "gpu_line", "verdict", "next_step"), [
    ("en", "gpu 0: 100% busy, SM active 20%, occupancy 15%, tensor 0%, DRAM 10%, "
     "20.0 of 80.0 GiB used (25%)",
     "llm: COMPUTE — GPUs 0,1 look 100% busy but their SMs are active only 20% "
     "(threshold 50%): small kernels, launch-bound or host overhead", "CUDA graphs"),
    ("zh", "gpu 0: 100% 繁忙, SM 活跃 20%, 占用率 15%, Tensor Core 0%, 显存带宽 10%, "
     "20.0 / 80.0 GiB 已用 (25%)",
     "llm: 算（计算） — GPU 0,1 利用率显示 100%，但 SM 只有 20% 在活跃（阈值 50%）", "CUDA Graphs"),
])
def test_launch_bound_text_gives_the_numbers_and_next_steps(
    lang: str, gpu_line: str, verdict: str, next_step: str
) -> None:
    code, text = gpm_report(GPMNode(gpm=(0.2, 0.15, 0.0, 0.1)), lang, json_out=False)
    assert code == 0
    assert f"   {gpu_line} — " in text, text
    line, advice = verdict_lines(text)
    assert verdict in line, text
    assert next_step in advice and "batch" in advice
    assert ("mixed precision" if lang == "en" else "混合精度") in text  # tensor_idle, below
    assert "utilization alone" not in text and "仅依据利用率" not in text


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_high_tensor_activity_is_compute_efficient_in_json_and_text(lang: str) -> None:
    code, text = gpm_report(GPMNode(gpm=(0.85, 0.6, 0.7, 0.4)), lang)
    [job] = json.loads(text)["jobs"]
    assert (code, job["kind"]) == (0, "compute")
    assert [f["code"] for f in job["findings"]] == ["gpu_efficient"]
    assert job["evidence"]["tensor_active_ratio"] == pytest.approx(0.7)
    code, text = gpm_report(GPMNode(gpm=(0.85, 0.6, 0.7, 0.4)), lang, json_out=False)
    line, advice = verdict_lines(text)
    expected = ({"en": "GPUs 0,1 compute efficiently: 100% busy, SM active 85%, "
                       "tensor pipes 70%, DRAM 40%",
                 "zh": "GPU 0,1 计算高效：繁忙 100%，SM 活跃 85%，Tensor Core 70%，显存带宽 40%"}
                [lang])
    assert expected in line, text
    assert "FlashAttention" in advice
    assert text.rstrip().endswith("No bottleneck that needs action." if lang == "en"
                                  else "没有需要处理的瓶颈。")


@pytest.mark.parametrize(("lang", "note"), [
    ("en", "rests on utilization alone"), ("zh", "仅依据利用率")])
def test_without_gpm_doctor_says_the_compute_verdict_rests_on_utilization(
    lang: str, note: str
) -> None:
    code, text = gpm_report(GPMNode(gpm=None), lang, json_out=False)
    assert code == 0
    gpu_section = text[text.index("1. GPU"):text.index("2. ")]
    assert note in gpu_section, text
    line, _ = verdict_lines(text)
    assert note in line
    code, text = gpm_report(GPMNode(gpm=None), lang)
    [job] = json.loads(text)["jobs"]
    assert [f["code"] for f in job["findings"]] == ["gpu_bound"]
    assert job["evidence"]["sm_active_ratio"] is None and job["evidence"]["gpm_gpus"] == []


def test_nearly_full_gpu_memory_is_an_oom_risk_of_the_job() -> None:
    node = GPMNode(gpm=(0.85, 0.6, 0.7, 0.4), used=79 * 2**30)
    code, text = gpm_report(node)
    [job] = json.loads(text)["jobs"]
    assert (code, job["job"], job["kind"]) == (0, "llm", "compute")  # a risk, not a bottleneck
    assert [f["code"] for f in job["findings"]] == ["gpu_efficient", "oom_risk"]
    assert job["evidence"]["memory_full_gpus"] == ["0", "1"]
    assert job["evidence"]["memory_used_ratio"] == pytest.approx(79 / 80)
    assert "FlashAttention" in job["advice"] and "activation checkpointing" in job["advice"]
    _, text = gpm_report(GPMNode(gpm=(0.85, 0.6, 0.7, 0.4), used=79 * 2**30), json_out=False)
    lines = text.splitlines()
    verdict = next(index for index, line in enumerate(lines) if line.startswith("   llm:"))
    assert ("      + GPU(s) 0,1 of the job use 99% of their memory (less than 5% free): "
            "out-of-memory risk") in lines[verdict:], text


@pytest.mark.parametrize(("lang", "note"), [
    ("en", "the GPUs look 97% busy but their SMs are active only 20%: that busy time is "
     "communication kernels, not compute"),
    ("zh", "GPU 利用率显示 97%，但 SM 只有 20% 在活跃：这些繁忙时间是通信 kernel，不是计算"),
])
def test_busy_gpus_with_idle_sms_count_for_communication(lang: str, note: str) -> None:
    node = GPMNode(gpm=(0.2, 0.1, 0.0, 0.05), utilization=0.97, exposed_comm=0.4)
    code, text = gpm_report(node, lang)
    [job] = json.loads(text)["jobs"]
    assert (code, job["kind"]) == (1, "communication")
    assert [f["code"] for f in job["findings"]] == ["comm_exposed"]
    assert job["findings"][0]["values"]["sm_active"] == pytest.approx(0.2)
    assert note in job["findings"][0]["message"]
    # the same job on GPUs without GPM: nothing to add
    plain = GPMNode(gpm=None, utilization=0.97, exposed_comm=0.4)
    [job] = json.loads(gpm_report(plain, lang)[1])["jobs"]
    assert "sm_active" not in job["findings"][0]["values"]
    assert "SM" not in job["findings"][0]["message"]


# -- label values and counts in words ----------------------------------------------------


def risky_node() -> PlatformNode:
    """A spot instance about to be reclaimed, checkpoints on its local disk, a far process."""
    return PlatformNode(spot=1, reclaim_in=90, checkpoint_age=3600,
                        checkpoint_storage=("/data", "xfs", "local_disk"),
                        numa_nodes={"0": 0, "1": 1}, numa_ratios={("0", "100"): 0.1},
                        nfs_read=2e8)


def test_zh_text_translates_severities_storage_kinds_providers_and_units() -> None:
    text = render_text(risky_node().diagnosed("zh"))
    for expected in ("   腾讯云, 实例 ins-7f3a", "   ! [严重] 竞价实例即将被回收",
                     "      + [严重] 运行在竞价实例上", "      + [警告] checkpoint 写在 /data（xfs，本地盘）",
                     "任务 llm: 最近 checkpoint 在 3600 秒前 (耗时 12.5 秒, 其所有运行共 4 次 checkpoint), "
                     "/data (xfs, 本地盘)",
                     "读 200.0 MB/s, 写 0 B/s, 每次 READ 12.0 毫秒", "[跨 NUMA 节点]"):
        assert expected in text, text
    for untranslated in ("[CRITICAL]", "[WARNING]", "local_disk", "tencent", "[far]",
                         " s 前", " ms "):
        assert untranslated not in text, (untranslated, text)


def test_en_text_keeps_the_label_values() -> None:
    text = render_text(risky_node().diagnosed("en"))
    for expected in ("   tencent, instance ins-7f3a", "   ! [CRITICAL] spot instance will be",
                     "      + [WARNING] checkpoints are written to /data (xfs, local_disk)",
                     "job llm: last checkpoint 3600 s ago (took 12.5 s, 4 checkpoints over all its runs), "
                     "/data (xfs, local_disk)", "12.0 ms per READ", "[far]"):
        assert expected in text, text


def test_every_label_value_that_reaches_the_text_has_words_in_both_languages() -> None:
    assert set(catalogue.STORAGE_NAMES) == set(STORAGE_KINDS)
    assert set(catalogue.SEVERITY_TAGS) == set(SEVERITIES)
    assert set(catalogue.PROVIDER_NAMES) == set(PROVIDERS) - {"auto"}
    for kind in STORAGE_KINDS:
        assert catalogue.storage_name(kind, "en") == kind
        assert catalogue.storage_name(kind, "zh").isascii() is False


@pytest.mark.parametrize(("count", "en", "zh"), [
    (1, "1 checkpoint over all its runs", "其所有运行共 1 次 checkpoint"),
    (4, "4 checkpoints over all its runs", "其所有运行共 4 次 checkpoint"),
    (0, "0 checkpoints over all its runs", "其所有运行共 0 次 checkpoint")])
def test_counts_are_singular_for_one(count: int, en: str, zh: str) -> None:
    assert (catalogue.history_text("checkpoints_all_runs", "en", count=count),
            catalogue.history_text("checkpoints_all_runs", "zh", count=count)) == (en, zh)
    assert catalogue.history_text("checkpoint_saves", "en", count=count, run="r") == (
        f"{count} checkpoint save{'' if count == 1 else 's'} by its ranks in run r")


def test_too_few_steps_for_a_verdict_is_singular_for_one_step() -> None:
    assert catalogue.finding_text("insufficient_data", {"steps": 1.0, "threshold": 3.0}, "en") == (
        "only 1 step in the window (needs 3)")
    assert catalogue.finding_text("insufficient_data", {"steps": 2.0, "threshold": 3.0}, "en") == (
        "only 2 steps in the window (needs 3)")
