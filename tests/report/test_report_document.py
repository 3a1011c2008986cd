"""The ``doctor --json`` document, key for key: ``report_json`` writes the engine's
dataclasses field by field, so a renamed or reordered engine field would change a
key the users' scripts read. Every section's keys are pinned here, in order."""

from __future__ import annotations

import json

from trainmon.diagnosis.finding import Finding
from trainmon.diagnosis.measure import DiskState, GPUProcessState, GPUState, LinkState, NcclState
from trainmon.diagnosis.platform_signals import (
    CheckpointState,
    CheckpointStorage,
    NfsMount,
    NodePlatform,
    NumaProcess,
)
from trainmon.diagnosis.rules import Evidence, Verdict
from trainmon.report.document import report_json
from trainmon.report.model import (
    GPU,
    Checkpoint,
    GPUProcess,
    Link,
    NumaBinding,
    Platform,
    Report,
    unmeasured_report,
)

PROCESS = GPUProcessState("0", "100", "vit-0", "ml", "trainer", "", "uid-1")
NCCL = NcclState("100", "debug_logging", "NCCL_DEBUG", "INFO")
DECIDING = Finding("storage", "data_wait", {"rank": "1", "ratio": 0.4, "threshold": 0.2})
RECLAIM = Finding("scheduling", "spot_reclaim", {"jobs": "llm", "seconds": 90.0,
                                                 "at": "2030-03-17 17:46:40 UTC"}, "critical")

REPORT = Report(
    source={"kind": "url", "url": "http://node:19400/metrics", "seconds": 10.0,
            "snapshots": 11},
    lang="en",
    platform=Platform(NodePlatform("tencent", "ins-1", "GN10X", "ap-shanghai", "ap-shanghai-5",
                                   (("leaf", "leaf-07"),), True, True, 1_900_000_090.0),
                      90.0, (RECLAIM,)),
    gpus=(GPU(GPUState("0", 0.5, 0.3, 40e9, 80e9, 0.4, 0.2, 0.1, 0.3, (("tensor", 0.1),)),
              "llm", "0", (GPUProcess(PROCESS, "llm"),)),),
    gpu_numa_nodes=(("0", 0),),
    numa=(NumaBinding(NumaProcess("0", "100", 0.25), "llm", 0, True),),
    disks=(DiskState("nvme0n1", 0.5, 1e6, 2e6),),
    checkpoints=(Checkpoint(CheckpointState("llm", 1_899_999_700.0, 12.0, 4.0,
                                            (CheckpointStorage("/mnt/cfs", "nfs4", "network_fs"),),
                                            4000.0),
                            300.0, CheckpointStorage("/mnt/cfs", "nfs4", "network_fs")),),
    nfs=(NfsMount("/mnt/cfs", "10.0.0.8", "/cfs", "nfs4", "4.1", 180e6, 0.0, 1000.0, 0.012),),
    links=(Link(LinkState("infiniband", "mlx5_0", "1", 1e9, 2e9, 25e9), True),),
    nccl=(NCCL,),
    verdicts=(Verdict("llm", "storage", (DECIDING, RECLAIM),
                      Evidence(ranks=2, steps=40.0, data_wait_ratio=0.4, comm_ratio=0.1,
                               comm_source="phase", gpus=("0", "1"),
                               pipe_active=(("tensor", 0.1),)), (NCCL,)),),
    status="bottleneck",
)

FINDING_KEYS = ["kind", "code", "severity", "values", "message"]
NCCL_KEYS = ["pid", "problem", "variable", "value", "message"]


def test_every_section_keeps_its_keys_in_order() -> None:
    document = json.loads(json.dumps(report_json(REPORT)))

    assert list(document) == ["source", "lang", "platform", "gpus", "numa", "storage",
                              "network", "jobs", "previous_runs", "recent_runs", "status",
                              "reason", "exit_code"]
    assert list(document["source"]) == ["kind", "url", "seconds", "snapshots"]
    assert list(document["platform"]) == [
        "provider", "instance_id", "instance_type", "region", "zone", "labels", "spot",
        "metadata_up", "termination_timestamp", "termination_seconds", "findings"]
    [gpu] = document["gpus"]
    assert list(gpu) == [
        "gpu", "utilization_ratio", "sawtooth_ratio", "memory_used_bytes",
        "memory_total_bytes", "sm_active_ratio", "sm_occupancy_ratio", "tensor_active_ratio",
        "dram_active_ratio", "pipe_active_ratio", "model", "max_clock_hertz", "job", "rank",
        "processes"]
    assert list(gpu["processes"][0]) == [
        "gpu", "pid", "pod", "namespace", "container", "slurm_job", "pod_uid", "job"]
    assert list(document["numa"]) == ["gpus", "processes"]
    assert list(document["numa"]["gpus"][0]) == ["gpu", "numa_node"]
    assert list(document["numa"]["processes"][0]) == [
        "gpu", "pid", "job", "numa_node", "local_ratio", "status"]
    storage = document["storage"]
    assert list(storage) == ["jobs", "disks", "checkpoints", "nfs"]
    assert list(storage["jobs"][0]) == ["job", "data_wait_ratio", "rank"]
    assert list(storage["disks"][0]) == [
        "device", "busy_ratio", "read_bytes_per_second", "write_bytes_per_second"]
    assert list(storage["checkpoints"][0]) == [
        "job", "last_timestamp", "age_seconds", "last_duration_seconds", "checkpoints",
        "mountpoint", "fstype", "storage"]
    assert list(storage["nfs"][0]) == [
        "mountpoint", "server", "export", "fstype", "version", "read_bytes_per_second",
        "write_bytes_per_second", "read_operations_per_second", "read_rtt_seconds"]
    network = document["network"]
    assert list(network) == ["jobs", "links", "nccl"]
    assert list(network["jobs"][0]) == [
        "job", "comm_ratio", "comm_source", "comm_overlapped_ratio", "comm_bytes_per_second"]
    assert list(network["links"][0]) == [
        "kind", "device", "port", "receive_bytes_per_second", "transmit_bytes_per_second",
        "rate_bytes_per_second", "utilization_ratio", "port_up"]
    assert list(network["nccl"][0]) == NCCL_KEYS
    [job] = document["jobs"]
    assert list(job) == ["job", "kind", "kind_name", "goodput", "run", "findings", "evidence",
                         "advice", "nccl"]
    assert [list(finding) for finding in [*job["findings"], *document["platform"]["findings"]]
            ] == [FINDING_KEYS] * 3
    assert list(job["nccl"][0]) == NCCL_KEYS
    assert list(job["evidence"]) == [
        "ranks", "steps", "step_seconds", "data_wait_ratio", "worst_data_wait_rank",
        "comm_ratio", "comm_source", "comm_overlapped_ratio", "comm_bytes_per_second",
        "straggler_ratio", "straggler_rank", "straggler_steady", "comm_group",
        "pipeline_bubble_ratio",
        "gpu_utilization_ratio", "gpus", "idle_gpus",
        "sawtooth_ratio", "stalled_ranks", "seconds_since_last_step", "busiest_link",
        "busiest_link_utilization", "sm_active_ratio", "sm_occupancy_ratio",
        "tensor_active_ratio", "dram_active_ratio", "pipe_active_ratio", "gpm_gpus",
        "memory_used_ratio", "memory_full_gpus", "storage_mountpoint", "storage_source",
        "storage_read_bytes_per_second", "storage_read_rtt_seconds"]


def test_the_values_are_the_engines_with_what_the_report_adds() -> None:
    document = report_json(REPORT)

    [gpu] = document["gpus"]
    assert (gpu["utilization_ratio"], gpu["pipe_active_ratio"], gpu["job"]) == (
        0.5, {"tensor": 0.1}, "llm")
    assert document["platform"]["labels"] == {"leaf": "leaf-07"}
    [job] = document["jobs"]
    assert job["evidence"]["gpus"] == ["0", "1"]  # a list, as JSON reads it back
    assert job["evidence"]["pipe_active_ratio"] == {"tensor": 0.1}
    assert job["kind_name"] == "storage" and job["advice"].startswith("Save a checkpoint now")
    assert job["findings"][1]["severity"] == "critical"
    assert job["nccl"][0]["message"].startswith("NCCL_DEBUG=INFO")
    [link] = document["network"]["links"]
    assert (link["utilization_ratio"], link["port_up"]) == (2e9 / 25e9, True)
    [numa] = document["numa"]["processes"]
    assert (numa["status"], numa["job"]) == ("far", "llm")
    assert (document["status"], document["exit_code"]) == ("bottleneck", 1)


def test_an_unreadable_source_has_every_section_empty() -> None:
    document = report_json(unmeasured_report({"kind": "url", "url": "http://x/metrics"},
                                             "refused"))

    assert document["source"] == {"kind": "url", "url": "http://x/metrics"}
    assert document["numa"] == {"gpus": [], "processes": []}
    assert document["storage"] == {"jobs": [], "disks": [], "checkpoints": [], "nfs": []}
    assert document["network"] == {"jobs": [], "links": [], "nccl": []}
    assert (document["jobs"], document["status"], document["reason"], document["exit_code"]) == (
        [], "unmeasured", "refused", 2)
    assert document["platform"]["findings"] == []
