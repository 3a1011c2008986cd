"""The risk findings through the real platform, NFS and NUMA collectors.

Below our code only fakes of what the node provides: the loopback CVM
metadata service (``testkit.fake_tencent_metadata``), a ``mountstats``
file rewritten between snapshots, the checked-in NUMA ``/proc`` and ``/sys``
trees with the demo's pynvml-shaped library. The training side is a
contract-metric source (``diagnosis_support.PlatformNode``).
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from testkit.fake_tencent_metadata import FakeMetadata
from testkit.node_nvml import NodeNVML
from tests.diagnosis.diagnosis_support import PlatformNode, codes, finding, job
from trainmon.cli import build_collectors
from trainmon.collectors.gpu import GPUCollector, GPUConfig
from trainmon.collectors.nfs import NFSCollector, NFSConfig
from trainmon.collectors.numa import NumaCollector, NumaConfig
from trainmon.collectors.platform import PlatformCollector
from trainmon.config import parse_config
from trainmon.core.collector import Collector
from trainmon.core.registry import CollectorRegistry
from trainmon.diagnosis.measure import MEASURED_SAMPLES
from trainmon.diagnosis.samples import ScrapedSamples, Window
from trainmon.diagnosis.thresholds import DiagnosisConfig
from trainmon.doctor import LOCAL_EXCLUDED, DoctorOptions, run_doctor
from trainmon.gpu.nvml import NVML
from trainmon.platform.config import PlatformConfig
from trainmon.report.document import report_json
from trainmon.report.model import Report, build_report
from trainmon.report.render import render_text

NUMA_FIXTURES = Path(__file__).parent.parent / "node" / "fixtures"


def report_of(collectors: Sequence[Collector], node: PlatformNode, ticks: int = 6,
              before_tick: Any = None, lang: str = "en") -> Report:
    """Snapshots of ``collectors`` in a registry (as the daemon and doctor run them),
    one per tick of ``node``'s clock, into the report."""
    registry = CollectorRegistry(list(collectors))
    snapshots = []
    for tick in range(ticks):
        if before_tick:
            before_tick(tick)
        node.tick()
        snapshots.append(ScrapedSamples.from_families(
            registry.collect(), node.at, node.wall(), MEASURED_SAMPLES))
    return build_report(Window(snapshots), DiagnosisConfig(), {"kind": "local"}, lang)


# -- the platform collector and a scheduled reclaim --------------------------------------


@pytest.fixture
def metadata() -> Iterator[FakeMetadata]:
    with FakeMetadata() as server:
        yield server


def platform_collector(url: str) -> PlatformCollector:
    platform = PlatformCollector(PlatformConfig(metadata_url=url, timeout_seconds=2.0),
                                 Path("/nonexistent"))
    platform.poller.poll()  # the first detection, as the poller's thread makes it
    return platform


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_doctor_locally_names_a_reclaim_the_metadata_service_schedules(
    metadata: FakeMetadata, lang: str
) -> None:
    metadata.schedule_reclaim(time.time() + 120)
    platform = platform_collector(metadata.url)
    node = PlatformNode(provider=None, metadata_up=None)  # the platform collector says it
    out = io.StringIO()
    try:
        code = run_doctor(DoctorOptions(seconds=0.05, interval_seconds=0.01, json=True,
                                        lang=lang),
                          DiagnosisConfig(), lambda: [platform, node.source], out,
                          sleep=lambda seconds: node.tick())
    finally:
        platform.stop()
    report = json.loads(out.getvalue())
    assert (report["platform"]["provider"], report["platform"]["spot"]) == ("tencent", True)
    assert report["platform"]["instance_id"] == "ins-a1b2c3d4"
    [reclaim] = report["platform"]["findings"]
    assert reclaim["code"] == "spot_reclaim" and reclaim["severity"] == "critical"
    assert 100 < reclaim["values"]["seconds"] <= 121
    assert reclaim["values"]["jobs"] == "llm"
    assert "spot_reclaim" in [f["code"] for f in report["jobs"][0]["findings"]]
    assert code == 1 and report["status"] == "risk"
    expected = "checkpoint now" if lang == "en" else "立即保存 checkpoint"
    assert expected in reclaim["message"]


def test_no_reclaim_from_the_metadata_service_no_finding(metadata: FakeMetadata) -> None:
    platform = platform_collector(metadata.url)
    try:
        node = PlatformNode(provider=None, metadata_up=None)
        diagnosed = report_of([platform, node.source], node)
    finally:
        platform.stop()
    report = report_json(diagnosed)
    assert report["platform"]["spot"] is True and report["platform"]["findings"] == []
    assert "spot_reclaim" not in codes(report)
    assert "no reclaim scheduled" in render_text(diagnosed)


# -- the NFS collector: the dataset's mount in the storage evidence ------------------------


MOUNTSTATS = """\
device /dev/nvme0n1p1 mounted on /data with fstype xfs
device 10.0.0.8:/cfs-dataset mounted on /mnt/cfs with fstype nfs4 statvers=1.1
\topts:\trw,vers=4.1,rsize=1048576,wsize=1048576,hard,proto=tcp,sec=sys
\tage:\t3600
\tbytes:\t{read} 0 0 0 {read} 0 0 0
\tRPC iostats version: 1.1  p/v: 100003/4 (nfs)
\tper-op statistics
\t        READ: {ops} {ops} 0 {sent} {read} 0 {rtt} {rtt} 0
\t     GETATTR: 10 10 0 1000 2000 0 5 6 0
"""


def test_a_starved_job_reading_from_cfs_names_the_mount(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "1").mkdir(parents=True)

    def rewrite(tick: int) -> None:  # 180 MB/s, 1000 READs/s of 12 ms each, per 5 s tick
        ops = 5000 * (tick + 1)
        (proc / "1" / "mountstats").write_text(MOUNTSTATS.format(
            read=int(900e6) * (tick + 1), ops=ops, sent=ops * 200, rtt=ops * 12))

    node = PlatformNode(data_wait=0.2)
    report = report_json(report_of([NFSCollector(NFSConfig(), proc), node.source], node,
                                   before_tick=rewrite))
    assert job(report)["kind"] == "storage"
    wait = finding(report, "data_wait")
    assert str(wait["message"]).endswith(
        "; dataset read from CFS/NFS 10.0.0.8:/cfs-dataset at /mnt/cfs: 180.0 MB/s, "
        "12 ms per READ")
    assert "warm the dataset onto local NVMe" in str(job(report)["advice"])
    [mount] = report["storage"]["nfs"]
    assert (mount["mountpoint"], mount["fstype"], mount["version"]) == ("/mnt/cfs", "nfs4", "4.1")
    assert mount["read_rtt_seconds"] == pytest.approx(0.012)


# -- the NUMA collector behind the GPU collector ----------------------------------------------




def numa_report(tree: str, bus_ids: Sequence[str], processes: Mapping[int, Sequence[int]],
                lang: str = "en") -> Report:
    root = NUMA_FIXTURES / tree
    gpu = GPUCollector(NVML(NodeNVML(bus_ids, processes)), GPUConfig(gpm=False))
    numa = NumaCollector(NumaConfig(), root / "proc", root / "sys", gpu.processes)
    node = PlatformNode()  # ranks 0 and 1 on GPUs 0 and 1: NVML's processes join by GPU
    try:
        return report_of([gpu, numa, node.source], node, lang=lang)
    finally:
        gpu.stop()


def test_a_rank_on_the_far_socket_of_a_two_node_host() -> None:
    # GPU 0 on node 0 and GPU 1 on node 1; pid 103's CPUs are all on node 0
    report = report_json(numa_report("numa-two-node", ["00000000:1A:00.0", "00010000:01:00.0"],
                                     {0: [100], 1: [103]}))
    far = finding(report, "numa_far")
    assert (far["values"]["pids"], far["values"]["gpu"], far["values"]["node"]) == (
        "103", "1", 1)
    assert "numactl --cpunodebind=1 --membind=1" in str(job(report)["advice"])
    assert report["numa"]["gpus"][:2] == [{"gpu": "0", "numa_node": 0},
                                          {"gpu": "1", "numa_node": 1}]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_virtualised_host_is_unknown_not_a_mismatch(lang: str) -> None:
    diagnosed = numa_report("numa-virtualised", ["00000000:00:05.0", "00000000:00:06.0"],
                            {0: [200], 1: [201]}, lang)
    assert "numa_far" not in codes(report_json(diagnosed))
    text = render_text(diagnosed)
    expected = ("NUMA topology unknown (virtualised host: numa_node = -1)" if lang == "en"
                else "NUMA 拓扑未知（虚拟化主机：numa_node = -1）")
    assert f"NUMA gpu 0: {expected}" in text


def test_doctor_without_url_runs_the_platform_nfs_and_numa_sources() -> None:
    collectors = build_collectors(parse_config({}), demo=False)  # as `trainmon doctor` does
    local = [c.name for c in collectors if c.name not in LOCAL_EXCLUDED]
    assert {"platform", "nfs", "numa"} <= set(local)
    assert "diagnosis" not in local and "tencent" not in local
    # the NUMA source reads the GPU families of the same collection: after the GPU's
    assert local.index("numa") > local.index("gpu")
