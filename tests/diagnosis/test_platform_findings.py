"""The platform risk findings (spot reclaim, checkpoints, NUMA, NCCL transport, NFS source).

A contract-metric source plays the platform, training, NUMA, NFS, network and
InfiniBand collectors: it emits the docs/metrics.md samples with values set
here and advances its counters on every tick of a simulated clock. Its
families are rendered to Prometheus text and parsed back (as ``doctor --url``
reads a daemon) into the window the report is built from, or handed to the
daemon's diagnosis collector; each finding is shown to fire and not to fire.
"""

from __future__ import annotations

import json

import pytest

from tests.diagnosis.diagnosis_support import (
    WALL,
    ContractSource,
    PlatformNode,
    codes,
    evaluated,
    finding,
    job,
)
from trainmon.collectors.diagnosis import DiagnosisCollector
from trainmon.config import parse_config
from trainmon.core.registry import CollectorRegistry
from trainmon.diagnosis.samples import ScrapedSamples, Window
from trainmon.diagnosis.thresholds import DiagnosisConfig
from trainmon.report.document import report_json
from trainmon.report.model import build_report, unmeasured_report
from trainmon.report.render import render_text
from trainmon.section import ConfigError

# -- spot reclaim -------------------------------------------------------------------


def test_a_scheduled_reclaim_is_critical_names_the_seconds_left_and_the_jobs() -> None:
    report = PlatformNode(spot=1, reclaim_in=90).report()
    platform = report["platform"]
    assert (platform["provider"], platform["instance_id"], platform["zone"]) == (
        "tencent", "ins-7f3a", "ap-shanghai-5")
    assert platform["labels"] == {"leaf": "leaf-07", "rack": "r12"}
    assert platform["spot"] is True and platform["metadata_up"] is True
    assert platform["termination_seconds"] == pytest.approx(90)
    [reclaim] = platform["findings"]
    assert (reclaim["code"], reclaim["severity"], reclaim["kind"]) == (
        "spot_reclaim", "critical", "scheduling")
    assert reclaim["values"]["jobs"] == "llm"
    assert "(in 90 s) — checkpoint now" in reclaim["message"]
    # beside the verdict, never deciding it; doctor exits 1 for the risk
    assert job(report)["kind"] == "compute"
    assert codes(report)[-1] == "spot_reclaim"
    assert (report["status"], report["exit_code"]) == ("risk", 1)
    assert str(job(report)["advice"]).startswith("Save a checkpoint now")


@pytest.mark.parametrize(("lang", "expected"), [
    ("en", ["0. Platform", "tencent, instance ins-7f3a (GN10Xp.20XLARGE320), region "
            "ap-shanghai, zone ap-shanghai-5, leaf leaf-07, rack r12",
            "spot instance: yes; metadata service: up; reclaim scheduled at",
            "! [CRITICAL] spot instance will be reclaimed at", "(in 90 s)",
            "+ [CRITICAL] spot instance will be reclaimed",
            "No bottleneck, but a risk that needs action"]),
    ("zh", ["0. 平台", "竞价实例: 是", "竞价实例即将被回收", "还剩 90 秒", "立即保存 checkpoint",
            "保存 checkpoint → 关闭旧实例 → 开启新实例 → 恢复训练"]),
])
def test_the_platform_section_comes_first_with_the_reclaim(lang: str, expected: list[str]
                                                           ) -> None:
    text = render_text(PlatformNode(spot=1, reclaim_in=90).diagnosed(lang))
    for part in expected:
        assert part in text, (part, text)
    platform, gpu = text.index(expected[0]), text.index("1. GPU")
    assert platform < gpu


def test_no_reclaim_scheduled_no_finding_and_a_healthy_exit() -> None:
    diagnosed = PlatformNode(spot=1).diagnosed()
    report = report_json(diagnosed)
    assert report["platform"]["findings"] == []
    assert "spot_reclaim" not in codes(report)
    assert (report["status"], report["exit_code"]) == ("healthy", 0)
    assert "no reclaim scheduled" in render_text(diagnosed)


def test_a_node_without_platform_metrics_says_so() -> None:
    diagnosed = PlatformNode(provider=None, metadata_up=None).diagnosed()
    report = report_json(diagnosed)
    assert report["platform"]["provider"] == "" and report["platform"]["spot"] is None
    assert "no platform metrics" in render_text(diagnosed)


# -- checkpoints ----------------------------------------------------------------------


def test_an_old_checkpoint_on_a_spot_instance_is_a_warning() -> None:
    diagnosed = PlatformNode(spot=1, checkpoint_age=3600,
                             checkpoint_storage=("/mnt/cfs", "nfs4", "network_fs")).diagnosed()
    report = report_json(diagnosed)
    overdue = finding(report, "checkpoint_overdue")
    assert overdue["severity"] == "warning" and overdue["kind"] == "storage"
    assert overdue["values"]["age"] == pytest.approx(3600)
    assert "last checkpoint 3600 s ago" in str(overdue["message"])
    assert job(report)["kind"] == "compute"  # beside the verdict
    assert (report["status"], report["exit_code"]) == ("risk", 1)
    [entry] = report["storage"]["checkpoints"]
    assert entry["age_seconds"] == pytest.approx(3600)
    assert (entry["last_duration_seconds"], entry["checkpoints"]) == (12.5, 4)  # per rank
    assert (entry["mountpoint"], entry["storage"]) == ("/mnt/cfs", "network_fs")
    # no ledger here: the count is the job's over its runs, and says so
    assert ("job llm: last checkpoint 3600 s ago (took 12.5 s, 4 checkpoints over all its "
            "runs), /mnt/cfs (nfs4, network_fs)") in render_text(diagnosed)


def test_an_old_checkpoint_is_critical_while_a_reclaim_is_scheduled() -> None:
    report = PlatformNode(spot=1, checkpoint_age=3600, reclaim_in=60).report()
    overdue = finding(report, "checkpoint_overdue")
    assert overdue["severity"] == "critical"
    assert "the instance is reclaimed in 60 s" in str(overdue["message"])
    zh = PlatformNode(spot=1, checkpoint_age=3600, reclaim_in=60).report("zh")
    assert "实例将在 60 秒后被回收" in str(finding(zh, "checkpoint_overdue")["message"])


@pytest.mark.parametrize("node", [
    PlatformNode(spot=1, checkpoint_age=600),  # recent enough
    PlatformNode(spot=0, checkpoint_age=3600),  # a regular instance is not reclaimed
    PlatformNode(spot=None, checkpoint_age=3600),  # spot state unknown: never guessed
])
def test_no_overdue_checkpoint_finding(node: PlatformNode) -> None:
    assert not {"checkpoint_overdue", "checkpoint_missing"} & set(codes(node.report()))


def test_a_long_running_job_without_checkpoints_on_a_spot_instance() -> None:
    report = PlatformNode(spot=1, trained_seconds=4000).report()
    missing = finding(report, "checkpoint_missing")
    assert missing["severity"] == "warning"
    assert missing["values"]["run"] == pytest.approx(4030)
    assert "no checkpoint reported in 4030 s of training" in str(missing["message"])
    assert "reporter.checkpoint(path)" in str(job(report)["advice"])
    # a job that has not yet trained for the interval has had no reason to checkpoint
    assert "checkpoint_missing" not in codes(PlatformNode(spot=1, trained_seconds=100).report())


@pytest.mark.parametrize("storage", ["local_disk", "ephemeral"])
def test_checkpoints_on_instance_bound_storage_of_a_cloud_instance(storage: str) -> None:
    report = PlatformNode(checkpoint_age=60,
                          checkpoint_storage=("/data", "xfs", storage)).report()
    local = finding(report, "checkpoint_local_disk")
    assert local["severity"] == "warning"
    assert "written to /data (xfs, " in str(local["message"])
    assert "cloud disk (CBS), CFS or COS" in str(job(report)["advice"])
    zh = PlatformNode(checkpoint_age=60, checkpoint_storage=("/data", "xfs", storage)).report("zh")
    assert "checkpoint 一定不要只写在本地临时盘" in str(finding(zh, "checkpoint_local_disk")["message"])


@pytest.mark.parametrize(("provider", "storage"), [
    ("self-hosted", "local_disk"),  # a self-hosted node's NVMe outlives no instance
    (None, "local_disk"),  # no platform collector: the provider is unknown
    ("tencent", "cloud_disk"),
    ("tencent", "network_fs"),
])
def test_no_local_disk_finding(provider: str | None, storage: str) -> None:
    node = PlatformNode(provider=provider, checkpoint_age=60,
                        checkpoint_storage=("/data", "xfs", storage))
    assert "checkpoint_local_disk" not in codes(node.report())


# -- NUMA -----------------------------------------------------------------------------------


def test_a_process_on_the_far_socket_gets_numactl_advice() -> None:
    node = PlatformNode(numa_nodes={"0": 0, "1": 1},
                        numa_ratios={("0", "100"): 1.0, ("1", "101"): 0.0})
    diagnosed = node.diagnosed()
    report = report_json(diagnosed)
    far = finding(report, "numa_far")
    assert (far["severity"], far["values"]["pids"], far["values"]["node"]) == (
        "warning", "101", 1)
    assert "101 (GPU 1, NUMA 1, 0%)" in str(far["message"])
    assert "numactl --cpunodebind=1 --membind=1" in str(job(report)["advice"])
    processes = {(p["pid"], p["status"], p["job"]) for p in report["numa"]["processes"]}
    assert processes == {("100", "local", "llm"), ("101", "far", "llm")}
    text = render_text(diagnosed)
    assert "NUMA gpu 1 (NUMA node 1): pid 101 (job llm) 0% of its CPUs on the GPU's node [far]" \
        in text


def test_a_mostly_local_process_is_no_finding() -> None:
    node = PlatformNode(numa_nodes={"0": 0, "1": 0},
                        numa_ratios={("0", "100"): 0.75, ("1", "101"): 0.5})
    assert "numa_far" not in codes(node.report())


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_an_unknown_topology_is_never_a_mismatch(lang: str) -> None:
    # a virtualised host: numa_node -1, so the collector exports no ratio
    diagnosed = PlatformNode(numa_nodes={"0": -1, "1": -1}).diagnosed(lang)
    report = report_json(diagnosed)
    assert "numa_far" not in codes(report)
    assert report["numa"]["gpus"] == [{"gpu": "0", "numa_node": -1},
                                      {"gpu": "1", "numa_node": -1}]
    expected = ("NUMA topology unknown (virtualised host: numa_node = -1); binding is unlikely "
                "to pay off here" if lang == "en" else "NUMA 拓扑未知")
    assert expected in render_text(diagnosed)
    # even a ratio next to an unknown node gives no finding
    odd = PlatformNode(numa_nodes={"0": -1, "1": -1}, numa_ratios={("1", "101"): 0.0})
    assert "numa_far" not in codes(odd.report())


# -- NCCL over sockets -------------------------------------------------------------------


def sockets_node(**changes: object) -> PlatformNode:
    """A 4-rank job with 2 ranks here, waiting 20 % of each step for communication,
    an ACTIVE but silent IB port and a busy eth0."""
    settings: dict[str, object] = {"world_size": 4, "comm_exposed": 0.1, "ib_up": 1.0,
                                   "ib_rate": 2e3, "nic_rate": 600e6, "provider": "self-hosted"}
    settings.update(changes)
    return PlatformNode(**settings)  # type: ignore[arg-type]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_nccl_over_sockets_names_the_rdma_ports_the_nic_and_the_variables(lang: str) -> None:
    report = sockets_node().report(lang)
    sockets = finding(report, "nccl_over_sockets")
    assert (sockets["kind"], sockets["severity"]) == ("communication", "warning")
    assert (sockets["values"]["rdma"], sockets["values"]["nic"]) == ("mlx5_0:1", "eth0")
    assert sockets["values"]["nic_bytes_per_second"] == pytest.approx(600e6)
    advice = str(job(report)["advice"])
    for variable in ("NCCL_IB_DISABLE=0", "NCCL_IB_HCA=mlx5_0", "NCCL_SOCKET_IFNAME=eth0",
                     "NCCL_NET_GDR_LEVEL", "NCCL_DEBUG=INFO", "NET/IB", "NET/Socket"):
        assert variable in advice
    message = str(sockets["message"])
    if lang == "en":
        assert "the ACTIVE RDMA ports mlx5_0:1 move only 2.0 kB/s while eth0 carries " \
            "600.0 MB/s" in message
    else:
        assert "NCCL 却像是在走 TCP Socket" in message
    ports = [link for link in report["network"]["links"] if link["kind"] == "infiniband"]
    assert [port["port_up"] for port in ports] == [True]


@pytest.mark.parametrize("changes", [
    {"ib_rate": 4e9},  # NCCL uses the fabric
    {"world_size": 2},  # every rank on this node: NVLink/PCIe, nothing leaves the node
    {"world_size": None},  # unknown: may be single-node
    {"comm_exposed": 0.02},  # 4 % of the step: too little traffic to tell
    {"ib_up": 0.0},  # no ACTIVE port: the existing NCCL checks cover that case
    {"nic_rate": 20e6},  # the NIC carries little either
])
def test_no_socket_finding(changes: dict[str, object]) -> None:
    assert "nccl_over_sockets" not in codes(sockets_node(**changes).report())


def test_socket_thresholds_follow_the_config() -> None:
    config = parse_config({"collectors": {"diagnosis": {
        "socket_busy_bytes_per_second": 1e9}}}).collectors.diagnosis
    assert "nccl_over_sockets" not in codes(sockets_node().report(config=config))
    config = parse_config({"collectors": {"diagnosis": {
        "nccl_socket_min_comm_ratio": 0.5}}}).collectors.diagnosis
    assert "nccl_over_sockets" not in codes(sockets_node().report(config=config))


# -- NFS/CFS as the data source ---------------------------------------------------------


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_storage_evidence_names_the_busiest_nfs_mount(lang: str) -> None:
    diagnosed = PlatformNode(data_wait=0.2, nfs_read=180e6).diagnosed(lang)
    report = report_json(diagnosed)
    assert job(report)["kind"] == "storage"
    wait = finding(report, "data_wait")
    assert wait["values"]["mount"] == "/mnt/cfs"
    assert wait["values"]["read_rtt_milliseconds"] == pytest.approx(12)
    evidence = job(report)["evidence"]
    assert evidence["storage_source"] == "10.0.0.8:/cfs-dataset"  # type: ignore[index]
    assert evidence["storage_read_bytes_per_second"] == pytest.approx(180e6)  # type: ignore[index]
    advice = str(job(report)["advice"])
    if lang == "en":
        assert wait["message"].endswith(  # type: ignore[attr-defined]
            "; dataset read from CFS/NFS 10.0.0.8:/cfs-dataset at /mnt/cfs: 180.0 MB/s, "
            "12 ms per READ")
        assert "warm the dataset onto local NVMe" in advice
        assert advice.startswith("Feed the GPUs faster")  # the data_wait step stays first
    else:
        assert "数据集从 CFS/NFS 10.0.0.8:/cfs-dataset（挂载于 /mnt/cfs）读取" in str(wait["message"])
        assert "预热" in advice
    [mount] = report["storage"]["nfs"]
    assert (mount["server"], mount["export"], mount["version"]) == (
        "10.0.0.8", "/cfs-dataset", "4.1")
    assert "nfs4 10.0.0.8:/cfs-dataset /mnt/cfs (v4.1): " in render_text(diagnosed)


def test_no_storage_verdict_no_mount_in_the_evidence() -> None:
    report = PlatformNode(nfs_read=180e6).report()
    assert job(report)["kind"] == "compute"
    assert job(report)["evidence"]["storage_mountpoint"] == ""  # type: ignore[index]
    assert report["storage"]["nfs"][0]["read_bytes_per_second"] == pytest.approx(180e6)
    # a storage verdict without NFS keeps its text unchanged
    plain = PlatformNode(data_wait=0.2).report()
    assert finding(plain, "data_wait")["message"] == (
        "rank 0 waits for data 40% of each step (threshold 20%)")


# -- JSON, the daemon's export, the configuration ----------------------------------------


def test_the_json_document_carries_the_new_sections() -> None:
    node = PlatformNode(spot=1, reclaim_in=30, checkpoint_age=60, numa_nodes={"0": 0},
                        numa_ratios={("0", "100"): 1.0}, nfs_read=1e6, ib_up=1.0)
    report = json.loads(json.dumps(node.report()))
    assert set(report["platform"]) == {
        "provider", "instance_id", "instance_type", "region", "zone", "labels", "spot",
        "metadata_up", "termination_timestamp", "termination_seconds", "findings"}
    assert set(report["numa"]) == {"gpus", "processes"}
    assert set(report["numa"]["processes"][0]) == {
        "gpu", "pid", "job", "numa_node", "local_ratio", "status"}
    assert set(report["storage"]) == {"jobs", "disks", "checkpoints", "nfs"}
    assert set(report["storage"]["nfs"][0]) == {
        "mountpoint", "server", "export", "fstype", "version", "read_bytes_per_second",
        "write_bytes_per_second", "read_operations_per_second", "read_rtt_seconds"}
    assert all(set(f) == {"kind", "code", "severity", "values", "message"}
               for j in report["jobs"] for f in j["findings"])
    assert {f["severity"] for f in report["jobs"][0]["findings"]} == {"", "critical"}
    empty = report_json(unmeasured_report({"kind": "url", "url": "http://x/metrics"}, "refused"))
    assert set(empty) == set(report) - {"reason"} | {"reason"}
    assert empty["storage"]["checkpoints"] == [] and empty["platform"]["findings"] == []


def test_the_daemon_exports_the_risk_findings() -> None:
    node = PlatformNode(spot=1, reclaim_in=120, numa_nodes={"0": 0, "1": 1},
                        numa_ratios={("0", "100"): 1.0, ("1", "101"): 0.1})
    registry = CollectorRegistry([node.source, DiagnosisCollector(
        DiagnosisConfig(), clock=node.clock, wall_clock=node.wall)])
    for _ in range(6):
        node.tick()
        result = evaluated(registry)
    rows = {(row["job"], row["kind"], row["finding"])
            for row in result.labelsets("trainmon_diagnosis_finding_info")}
    assert {("llm", "scheduling", "spot_reclaim"), ("llm", "scheduling", "numa_far"),
            ("llm", "compute", "gpu_bound")} <= rows
    assert result.value("trainmon_bottleneck", job="llm", kind="compute") == 1


@pytest.mark.parametrize(("settings", "key"), [
    ({"checkpoint_max_age_seconds": 10}, "checkpoint_max_age_seconds"),
    ({"numa_local_ratio_min": 1.5}, "numa_local_ratio_min"),
    ({"nccl_socket_min_comm_ratio": "high"}, "nccl_socket_min_comm_ratio"),
    ({"rdma_idle_bytes_per_second": 2e8}, "rdma_idle_bytes_per_second"),
    ({"socket_busy_bytes_per_second": -1}, "socket_busy_bytes_per_second"),
])
def test_risk_thresholds_are_validated(settings: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError, match=rf"collectors\.diagnosis\.{key}"):
        parse_config({"collectors": {"diagnosis": settings}})


def test_checkpoint_age_follows_the_config() -> None:
    config = parse_config({"collectors": {"diagnosis": {
        "checkpoint_max_age_seconds": 300}}}).collectors.diagnosis
    node = PlatformNode(spot=1, checkpoint_age=600)
    assert "checkpoint_overdue" in codes(node.report(config=config))


def test_the_reclaim_leads_the_risks_and_its_step_replaces_the_checkpoint_age_step() -> None:
    report = PlatformNode(spot=1, checkpoint_age=3600, reclaim_in=60,
                          numa_nodes={"0": 0, "1": 1},
                          numa_ratios={("0", "100"): 1.0, ("1", "101"): 0.0}).report()
    assert codes(report) == ["gpu_bound", "spot_reclaim", "checkpoint_overdue", "numa_far"]
    advice = str(job(report)["advice"])
    assert advice.startswith("Save a checkpoint now")
    assert "Checkpoint more often" not in advice and "numactl" in advice


def test_a_reclaim_on_a_node_with_nothing_else_measured_still_needs_action() -> None:
    source = ContractSource(name="platform")
    snapshots = []
    for at in (0.0, 5.0):
        source.set("trainmon_node_spot_instance", 1)
        source.set("trainmon_node_spot_termination_timestamp_seconds", WALL + 100)
        snapshots.append(ScrapedSamples.from_families(source.collect(), at, WALL + at))
    diagnosed = build_report(Window(snapshots), DiagnosisConfig(), {"kind": "local"})
    report = report_json(diagnosed)
    assert (report["status"], report["exit_code"], report["jobs"]) == ("risk", 1, [])
    [reclaim] = report["platform"]["findings"]
    assert reclaim["values"]["jobs"] == "-" and reclaim["values"]["seconds"] == 95
    assert "(in 95 s)" in render_text(diagnosed)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_every_risk_text_renders_in_both_languages(lang: str) -> None:
    node = sockets_node(provider="tencent", spot=1, reclaim_in=60, trained_seconds=4000,
                        checkpoint_storage=("/data", "xfs", "local_disk"), data_wait=0.2,
                        nfs_read=50e6, numa_nodes={"0": 0, "1": 1},
                        numa_ratios={("0", "100"): 1.0, ("1", "101"): 0.0})
    report = node.report(lang)
    assert set(codes(report)) >= {"spot_reclaim", "checkpoint_missing",
                                  "checkpoint_local_disk", "numa_far", "nccl_over_sockets"}
    texts = [f["message"] for j in report["jobs"] for f in j["findings"]]
    texts += [str(j["advice"]) for j in report["jobs"]]
    assert all("{" not in text and "}" not in text for text in texts), texts
    assert all(f["code"] not in f["message"] for j in report["jobs"] for f in j["findings"])


# -- mixed GPU generations, and a daemon's fail-slow read back -------------------------


@pytest.mark.parametrize(("names", "clocks", "fires"), [
    (("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"), (1.98e9, 1.41e9), True),
    (("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe"), (1.98e9, 1.755e9), True),
    (("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"), (1.98e9, 1.98e9), False),
])
def test_a_job_on_mixed_gpu_generations_or_clock_classes_is_a_risk(
        names: tuple[str, str], clocks: tuple[float, float], fires: bool) -> None:
    node = PlatformNode()
    for gpu, (name, clock) in enumerate(zip(names, clocks, strict=True)):
        node.source.set("trainmon_gpu_info", 1, gpu=str(gpu), name=name, uuid=f"GPU-{gpu}")
        node.source.set("trainmon_gpu_sm_clock_max_hertz", clock, gpu=str(gpu))
    report = node.report()
    assert ("mixed_gpus" in codes(report)) is fires
    if fires:
        mixed = finding(report, "mixed_gpus")
        assert (mixed["kind"], mixed["severity"]) == ("scheduling", "warning")
        assert "slowest sets the pace" in str(mixed["message"])
        assert job(report)["kind"] == "compute"  # a risk, never the verdict
        zh = finding(node.report("zh"), "mixed_gpus")
        assert "混用了不同型号或频率档位" in str(zh["message"])


def test_doctor_reads_a_daemons_fail_slow_back_with_its_words() -> None:
    node = PlatformNode()
    node.source.set("trainmon_diagnosis_finding_info", 1, job="llm", owner="uid:1000",
                    kind="scheduling", finding="fail_slow", rank="1")
    node.source.set("trainmon_diagnosis_fail_slow_ratio", 0.35, job="llm", owner="uid:1000",
                    rank="1", part="compute", cause="gpu_thermal")
    node.source.set("trainmon_diagnosis_fail_slow_start_timestamp_seconds", WALL + 900,
                    job="llm", owner="uid:1000", rank="1")
    report = node.report()
    slow = finding(report, "fail_slow")
    assert (slow["kind"], slow["severity"]) == ("scheduling", "warning")
    assert slow["values"]["rank"] == "1" and slow["values"]["cause"] == "gpu_thermal"
    assert str(slow["message"]).startswith("rank 1 became 35% slower at ")
    assert "compute per step grew; its GPU's clocks are held down for heat" in str(
        slow["message"])
    assert "held down for heat" in str(job(report)["advice"])
    zh = finding(node.report("zh"), "fail_slow")
    assert "慢了 35%" in str(zh["message"]) and "GPU 因过热降频" in str(zh["message"])
