"""The ``tencent-cloud`` variant: Tencent Cloud Monitor series beside the node daemon's.

The puller (``trainmon serve`` with the ``tencent`` collector, one per account)
exports ``trainmon_tencent_cvm_*{instance_id}`` and
``trainmon_tencent_cbs_*{disk_id, instance_id}`` in base units, one data point
per Cloud Monitor period (60 s by default, pulled with a delay). Per-GPU CVM
series carry the API's ``minorNumber`` dimension as ``minor_number``.

The puller is not on the node, so its series' ``node`` label is the puller's;
the cloud rows select a CVM by ``instance_id`` instead.
"""

from __future__ import annotations

from collections.abc import Sequence

from dashboards.builder import Board, VariableBuilder, query_variable
from dashboards.panels import (
    TEMPERATURE_STEPS,
    Query,
    Step,
    bar_gauge,
    stat_panel,
    state_timeline,
    timeseries,
)
from dashboards.variant import Variant

CVM = 'instance_id="$instance_id"'
CBS = 'instance_id="$instance_id", disk_id=~"$disk_id"'
CVM_GPU = "{{instance_id}} GPU {{minor_number}}"
DISK = "{{disk_id}}"
PERIOD_NOTE = (
    " Cloud Monitor reports one point per period (60 s by default) with a delay of a few "
    "minutes, so short spikes and sawtooth are averaged away here."
)


def _node_variables() -> Sequence[VariableBuilder]:
    return (
        query_variable(
            "instance_id", "CVM instance",
            "label_values(trainmon_tencent_cvm_cpu_usage_ratio, instance_id)",
            "The Tencent Cloud CVM to show in the Cloud Monitor rows (pick the instance "
            "that is this node).",
        ),
        query_variable(
            "disk_id", "CBS disks",
            'label_values(trainmon_tencent_cbs_read_iops{instance_id="$instance_id"}, disk_id)',
            "Cloud Block Storage disks attached to the instance.",
            multi=True,
        ),
    )


def _node_rows(board: Board, variant: Variant) -> None:
    board.row("Cloud Monitor: CVM $instance_id (Tencent Cloud)")
    board.add(timeseries(
        "GPU utilization (Cloud Monitor)", "percentunit",
        "GpuUtil per GPU of the instance. Good: near 100 % while training; it should agree "
        "with trainmon's GPU utilization averaged over a minute." + PERIOD_NOTE,
        [Query(f"trainmon_tencent_cvm_gpu_utilization_ratio{{{CVM}}}", CVM_GPU)],
        minimum=0, maximum=1,
    ), width=8)
    board.add(timeseries(
        "GPU memory used vs total (Cloud Monitor)", "bytes",
        "GpuMemUsed per GPU; dashed: GpuMemTotal. Good: headroom left below total.",
        [Query(f"trainmon_tencent_cvm_gpu_memory_used_bytes{{{CVM}}}", CVM_GPU),
         Query(f"trainmon_tencent_cvm_gpu_memory_total_bytes{{{CVM}}}", CVM_GPU + " total")],
        minimum=0, dashed=(".* total",),
    ), width=8)
    board.add(timeseries(
        "GPU power vs limit (Cloud Monitor)", "watt",
        "GpuPowDraw per GPU; dashed: GpuPowLimit. Good: below the limit.",
        [Query(f"trainmon_tencent_cvm_gpu_power_watts{{{CVM}}}", CVM_GPU),
         Query(f"trainmon_tencent_cvm_gpu_power_limit_watts{{{CVM}}}", CVM_GPU + " limit")],
        minimum=0, dashed=(".* limit",),
    ), width=8)
    board.add(timeseries(
        "GPU temperature (Cloud Monitor)", "celsius",
        "GpuTemp per GPU. Good: below ~80 °C.",
        [Query(f"trainmon_tencent_cvm_gpu_temperature_celsius{{{CVM}}}", CVM_GPU)],
        steps=TEMPERATURE_STEPS,
    ), width=8)
    board.add(timeseries(
        "CPU and memory usage (Cloud Monitor)", "percentunit",
        "CPUUsage and MemUsage of the instance. Good: CPU well below 100 % — a CPU-bound "
        "data loader shows as high CPU with high data wait.",
        [Query(f"trainmon_tencent_cvm_cpu_usage_ratio{{{CVM}}}", "{{instance_id}} CPU"),
         Query(f"trainmon_tencent_cvm_memory_usage_ratio{{{CVM}}}", "{{instance_id}} memory")],
        minimum=0, maximum=1,
    ), width=8)
    board.add(timeseries(
        "LAN traffic (Cloud Monitor)", "Bps",
        "Private-network traffic in and out (LanIntraffic/LanOuttraffic). Good: below the "
        "instance type's bandwidth; compare with the NIC panels for what the node saw.",
        [Query(f"trainmon_tencent_cvm_lan_receive_bytes_per_second{{{CVM}}}",
               "{{instance_id}} receive"),
         Query(f"trainmon_tencent_cvm_lan_transmit_bytes_per_second{{{CVM}}}",
               "{{instance_id}} transmit")],
        minimum=0,
    ), width=8)
    board.row("Cloud Block Storage (CBS) disks of $instance_id (存)")
    board.add(timeseries(
        "CBS IOPS", "iops",
        "Read and write operations per second per CBS disk. Good: below the disk's "
        "provisioned IOPS; flat at it while data wait is high means the disk limits the job."
        + PERIOD_NOTE,
        [Query(f"trainmon_tencent_cbs_read_iops{{{CBS}}}", DISK + " read"),
         Query(f"trainmon_tencent_cbs_write_iops{{{CBS}}}", DISK + " write")],
        minimum=0,
    ), width=6)
    board.add(timeseries(
        "CBS throughput", "Bps",
        "Read and write bytes per second per CBS disk. Good: below the provisioned "
        "throughput.",
        [Query(f"trainmon_tencent_cbs_read_bytes_per_second{{{CBS}}}", DISK + " read"),
         Query(f"trainmon_tencent_cbs_write_bytes_per_second{{{CBS}}}", DISK + " write")],
        minimum=0,
    ), width=6)
    board.add(timeseries(
        "CBS await", "s",
        "Average I/O wait time per CBS disk. Good: a few milliseconds; tens of milliseconds "
        "mean the disk is queueing.",
        [Query(f"trainmon_tencent_cbs_await_seconds{{{CBS}}}", DISK)],
        minimum=0,
    ), width=6)
    board.add(timeseries(
        "CBS utilization", "percentunit",
        "Share of time the CBS disk was busy. Good: below 80 % (dashed).",
        [Query(f"trainmon_tencent_cbs_utilization_ratio{{{CBS}}}", DISK)],
        minimum=0, maximum=1, steps=(Step(None, "green"), Step(0.8, "red")),
    ), width=6)


def _fleet_rows(board: Board, variant: Variant) -> None:
    board.row("Tencent Cloud Monitor across the account")
    board.add(state_timeline(
        "CVM GPU utilization (Cloud Monitor)", "percentunit",
        "Every CVM GPU the puller sees (red idle → green busy), one point per minute. Good: "
        "green where jobs run; instances idle for hours cost money for nothing.",
        [Query("trainmon_tencent_cvm_gpu_utilization_ratio", CVM_GPU)],
    ), width=16, height=10)
    board.add(bar_gauge(
        "Least busy GPU instances", "percentunit",
        "The ten instances with the lowest mean GPU utilization over the selected range. "
        "Good: only instances that are free on purpose.",
        [Query("bottomk(10, avg by (instance_id) (avg_over_time("
               "trainmon_tencent_cvm_gpu_utilization_ratio[$__range])))",
               "{{instance_id}}", instant=True)],
        maximum=1, steps=(Step(None, "red"), Step(0.3, "yellow"), Step(0.7, "green")),
    ), width=8, height=10)
    board.add(stat_panel(
        "Cloud Monitor sample age", "s",
        "Age of the newest Cloud Monitor point per metric, worst metric shown. Good: about "
        "the configured delay plus one period (~3 min); growing means the puller is stuck.",
        [Query("max(trainmon_tencent_sample_age_seconds)")],
        steps=(Step(None, "green"), Step(600, "yellow"), Step(1800, "red")),
    ), width=8, height=4)
    board.add(stat_panel(
        "Cloud API errors in range", "short",
        "Failed Cloud Monitor API calls in the selected range (rate limits, auth, timeouts). "
        "Good: 0; trainmon_tencent_api_errors_total{code} says which.",
        [Query("sum(increase(trainmon_tencent_api_errors_total[$__range])) or vector(0)")],
        steps=(Step(None, "green"), Step(1, "yellow")),
    ), width=8, height=4)
    board.add(stat_panel(
        "Estimated monthly API calls", "short",
        "GetMonitorData calls per month at the current configuration. Good: within the "
        "account's free quota.",
        [Query("sum(trainmon_tencent_estimated_monthly_calls)")],
    ), width=8, height=4)


TENCENT = Variant(
    slug="tencent-cloud",
    name="Tencent Cloud",
    uid_prefix="trainmon-tencent",
    summary=(
        "Tencent Cloud variant: Cloud Monitor CVM GPU, LAN and CBS series pulled by trainmon "
        "beside the node daemon's NVML, network, disk and training series."
    ),
    node_rows=_node_rows,
    fleet_rows=_fleet_rows,
    node_variables=_node_variables,
)
