"""Node detail: everything one training node shows about its GPUs, links, disks and ranks.

Rows: the node at a glance, its platform (cloud instance, spot status and a
scheduled reclaim, placement labels), its GPUs as the trainmon daemon sees them
through NVML, the variant's own device view (dcgm-exporter or Tencent Cloud
Monitor), NIC and InfiniBand against their link rates, block devices and
NFS/CFS mounts, and the training ranks running here with the NUMA locality of
the GPU processes.
"""

from __future__ import annotations

from dashboards import promql
from dashboards.activity import add_activity_panels
from dashboards.builder import RATE, Board, query_variable
from dashboards.panels import (
    GPU,
    RED_FROM_ONE,
    TEMPERATURE_STEPS,
    UP_DOWN,
    Query,
    Step,
    stat_panel,
    state_timeline,
    table_panel,
    timeseries,
    value_mappings,
)
from dashboards.promql import NODE_GPUS
from dashboards.variant import NODE, TRAINING, Variant

N = 'node="$node"'


def build(variant: Variant) -> Board:
    """The Node detail dashboard of ``variant``."""
    board = variant.board(
        NODE,
        "One training node: GPUs, NIC/InfiniBand against link rate, disks and the "
        "ranks running here.",
    )
    board.variable(query_variable(
        "node", "Node", promql.NODE_VARIABLE,
        "The node label Prometheus relabelling puts on every series of a node.",
    ))
    board.variable(query_variable(
        "gpu", "GPU", 'label_values(trainmon_gpu_up{node="$node"}, gpu)',
        "NVML index of the GPU (the same `gpu` label as dcgm-exporter's).",
        multi=True, numeric=True,
    ))
    for variable in variant.node_variables():
        board.variable(variable)
    _summary_row(board)
    _platform_row(board)
    _gpu_row(board)
    board.row("GPU activity: how much of each GPU the kernels use (算)")
    add_activity_panels(board, variant, NODE_GPUS, GPU)
    variant.node_rows(board, variant)
    _network_row(board)
    _disk_row(board)
    _ranks_row(board, variant)
    return board


def _summary_row(board: Board) -> None:
    board.row("Node")
    board.add(stat_panel(
        "GPUs up", "short",
        "GPUs the daemon can read through NVML, of those it found. Good: equal; a lost GPU "
        "(fell off the bus, XID 79) shows as down while the others go on.",
        [Query(f"sum(trainmon_gpu_up{{{NODE_GPUS}}})", "up"),
         Query(f"count(trainmon_gpu_up{{{NODE_GPUS}}})", "found")],
        show_name=True,
    ), width=5, height=4)
    board.add(stat_panel(
        "Collectors failing", "short",
        "trainmon collectors whose last collection failed although their source exists "
        "(an absent source, e.g. no InfiniBand, does not count; /healthz says why). Good: 0.",
        [Query(f"count((trainmon_collector_success{{{N}}} == 0)"
               f" and (trainmon_collector_available{{{N}}} == 1)) or vector(0)")],
        steps=RED_FROM_ONE,
    ), width=4, height=4)
    board.add(stat_panel(
        "Sawtooth GPUs", "short",
        f"GPUs with a sawtooth ratio of {promql.SAWTOOTH_FLAG} or more (at least one full "
        "busy→idle→busy cycle). Good: 0.",
        [Query(f"count(trainmon_gpu_sawtooth_ratio{{{NODE_GPUS}}} >= {promql.SAWTOOTH_FLAG})"
               " or vector(0)")],
        steps=RED_FROM_ONE,
    ), width=4, height=4)
    board.add(stat_panel(
        "XID events in range", "short",
        "NVIDIA driver XID errors on these GPUs in the selected time range. Good: 0; any XID "
        "needs a look (13/31/43: application fault; 48/63/64/94/95: memory; 79: GPU lost).",
        [Query(f"sum(increase(trainmon_gpu_xid_errors_total{{{NODE_GPUS}}}[$__range]))"
               " or vector(0)")],
        steps=RED_FROM_ONE,
    ), width=4, height=4)
    board.add(stat_panel(
        "trainmon", "none",
        "Version of the daemon and its mode; `demo` means simulated data "
        "(trainmon serve --demo), never mixed with real data.",
        [Query(f"trainmon_build_info{{{N}}}", "{{version}} ({{mode}})", instant=True)],
        name_only=True,
    ), width=7, height=4)


#: trainmon_node_spot_instance as text: a spot instance can be reclaimed at short notice.
SPOT_STATES = value_mappings({"1": ("spot", "orange"), "0": ("not spot", "green")})
#: trainmon_gpu_numa_node -1: the platform does not say (virtualised hosts).
NUMA_NODE_TEXT = value_mappings({"-1": ("unknown", "blue")})


def _platform_row(board: Board) -> None:
    board.row("Platform: instance, spot reclaim, placement")
    board.add(table_panel(
        "Node identity", "none",
        "What the platform collector knows about this node: provider (tencent from the CVM "
        "metadata service, or self-hosted), instance id and type, region, zone, and the "
        "placement labels configured in collectors.platform.labels (leaf switch, rack). "
        "Jobs should keep within one zone and, where configured, one leaf.",
        [Query(f"trainmon_node_info{{{N}}}")],
        hidden=("Value", "instance", "job", "node"),
    ), width=12, height=5)
    board.add(stat_panel(
        "Spot instance", "none",
        "Whether the cloud can reclaim this instance at short notice (spot / 竞价). "
        "On a spot instance, checkpoint often and to storage that survives the instance.",
        [Query(f"trainmon_node_spot_instance{{{N}}}")],
        mappings=SPOT_STATES, steps=(Step(None, "green"), Step(1, "orange")),
    ), width=4, height=5)
    board.add(stat_panel(
        "Reclaim in", "s",
        "Time left until the scheduled reclaim of this spot instance (the metadata "
        "service's termination time minus now). Good: empty, nothing scheduled; "
        "TrainmonSpotReclaimScheduled pages while it shows.",
        [Query(f"clamp_min(trainmon_node_spot_termination_timestamp_seconds{{{N}}}"
               " - time(), 0)")],
        steps=(Step(None, "red"),),
    ), width=4, height=5)
    board.add(stat_panel(
        "Metadata service", "none",
        "Whether the last poll of the instance metadata service gave a valid answer. "
        "Good: up on cloud instances (spot notices come from there); self-hosted nodes "
        "have no metadata service.",
        [Query(f"trainmon_platform_metadata_up{{{N}}}")],
        mappings=UP_DOWN, steps=(Step(None, "red"), Step(1, "green")),
    ), width=4, height=5)


def _gpu_row(board: Board) -> None:
    board.row("GPUs (trainmon, NVML)")
    board.add(timeseries(
        "GPU utilization", "percentunit",
        "Share of time a kernel was running (NVML duty cycle, latest sample). Good: steady "
        "near 100 % during training. It says nothing about how much of the GPU a kernel "
        "uses; SM active (GPU activity row) does.",
        [Query(f"trainmon_gpu_utilization_ratio{{{NODE_GPUS}}}", GPU)],
        minimum=0, maximum=1,
    ), width=8)
    board.add(timeseries(
        "Sawtooth ratio", "percentunit",
        "Busy/idle oscillation seen by the daemon's high-rate sampler: 0 steady, 0.5 one "
        "full cycle, 1 two or more. Good: 0; at or above 0.5 (dashed) the GPU is flagged.",
        [Query(f"trainmon_gpu_sawtooth_ratio{{{NODE_GPUS}}}", GPU)],
        minimum=0, maximum=1, steps=(Step(None, "green"), Step(promql.SAWTOOTH_FLAG, "red")),
    ), width=8)
    board.add(timeseries(
        "GPU idle fraction (high-rate sampler)", "percentunit",
        "Share of the driver's ~6 samples/s that were below the idle threshold. Good: near 0 "
        "on GPUs that hold a job.",
        [Query(promql.idle_fraction(NODE_GPUS), GPU)],
        minimum=0, maximum=1,
    ), width=8)
    board.add(timeseries(
        "SM clock", "hertz",
        "Streaming-multiprocessor clock. Good: at the boost clock under load; a clock that "
        "drops while utilization stays high is throttling (see Throttle time).",
        [Query(f"trainmon_gpu_sm_clock_hertz{{{NODE_GPUS}}}", GPU)],
        minimum=0,
    ), width=8)
    board.add(timeseries(
        "Power vs limit", "watt",
        "Board power draw; the dashed lines are the enforced power limits. Good: below the "
        "limit; pinned at it means power capping (throttle reason sw_power_cap).",
        [Query(f"trainmon_gpu_power_watts{{{NODE_GPUS}}}", GPU),
         Query(f"trainmon_gpu_power_limit_watts{{{NODE_GPUS}}}", "GPU {{gpu}} limit")],
        minimum=0, dashed=(".* limit",),
    ), width=8)
    board.add(timeseries(
        "Temperature", "celsius",
        "GPU core temperature. Good: below ~80 °C; data-center GPUs slow down from ~85–90 °C.",
        [Query(f"trainmon_gpu_temperature_celsius{{{NODE_GPUS}}}", GPU)],
        steps=TEMPERATURE_STEPS,
    ), width=8)
    board.add(timeseries(
        "Memory used vs total", "bytes",
        "Framebuffer memory in use; dashed: the GPU's total. Good: below total with some "
        "headroom; near total risks out-of-memory on a longer batch.",
        [Query(f"trainmon_gpu_memory_used_bytes{{{NODE_GPUS}}}", GPU),
         Query(f"trainmon_gpu_memory_total_bytes{{{NODE_GPUS}}}", "GPU {{gpu}} total")],
        minimum=0, dashed=(".* total",),
    ), width=8)
    board.add(timeseries(
        "Throttle time by reason", "percentunit",
        "Share of time the clocks were held down, per reason (NVML violation counters). "
        "Good: 0 for thermal and power reasons; idle clocks on an idle GPU are harmless.",
        [Query(f"sum by (gpu, reason) (rate(trainmon_gpu_throttle_seconds_total{{{NODE_GPUS}}}"
               f"[{RATE}]))", "GPU {{gpu}} {{reason}}")],
        minimum=0,
    ), width=8)
    board.add(timeseries(
        "ECC errors", "short",
        "ECC errors per GPU and severity in the selected range. Good: 0 uncorrected; a "
        "growing corrected count is an early sign of failing memory.",
        [Query(f"sum by (gpu, severity) (increase(trainmon_gpu_ecc_errors_total{{{NODE_GPUS}}}"
               "[$__range]))", "GPU {{gpu}} {{severity}}")],
        minimum=0,
    ), width=8)
    board.add(timeseries(
        "PCIe throughput", "Bps",
        "Host↔GPU traffic (NVML PCIe counters): transmit and receive. Good: bursts at batch "
        "upload; sustained high receive with low utilization means the input pipeline is "
        "copying, not computing.",
        [Query(f"rate(trainmon_gpu_pcie_transmit_bytes_total{{{NODE_GPUS}}}[{RATE}])",
               "GPU {{gpu}} transmit"),
         Query(f"rate(trainmon_gpu_pcie_receive_bytes_total{{{NODE_GPUS}}}[{RATE}])",
               "GPU {{gpu}} receive")],
        minimum=0,
    ), width=8)
    board.add(timeseries(
        "NVLink throughput", "Bps",
        "GPU↔GPU NVLink traffic. Good: regular bursts at gradient sync; flat zero during "
        "multi-GPU training means NCCL is not using NVLink (check NCCL_P2P_DISABLE).",
        [Query(f"rate(trainmon_gpu_nvlink_transmit_bytes_total{{{NODE_GPUS}}}[{RATE}])",
               "GPU {{gpu}} transmit"),
         Query(f"rate(trainmon_gpu_nvlink_receive_bytes_total{{{NODE_GPUS}}}[{RATE}])",
               "GPU {{gpu}} receive")],
        minimum=0,
    ), width=8)
    board.add(table_panel(
        "XID errors by code", "short",
        "XID errors per GPU and code in the selected range (a row appears once a GPU has "
        "had that XID since the daemon started). Good: no row with a count above 0.",
        [Query(f"sum by (gpu, xid) (increase(trainmon_gpu_xid_errors_total{{{NODE_GPUS}}}"
               "[$__range]))")],
        steps=RED_FROM_ONE,
    ), width=8)


def _network_row(board: Board) -> None:
    board.row("Network: NIC and InfiniBand against link rate (通)")
    board.add(timeseries(
        "NIC throughput vs link speed", "Bps",
        "Bytes per second per interface; dashed: the link speed. Good: well below the "
        "link speed; flat at it during steps means the NIC limits the job.",
        [Query(f"rate(trainmon_network_receive_bytes_total{{{N}}}[{RATE}])", "{{device}} receive"),
         Query(f"rate(trainmon_network_transmit_bytes_total{{{N}}}[{RATE}])",
               "{{device}} transmit"),
         Query(f"trainmon_network_speed_bytes{{{N}}}", "{{device}} link speed")],
        minimum=0, dashed=(".* link speed",),
    ))
    board.add(timeseries(
        "NIC link utilization", "percentunit",
        "Receive and transmit as a share of the link speed. Good: below 70 %; at "
        f"{promql.LINK_SATURATION:.0%} (dashed) and above the link is saturated.",
        [Query(f"rate(trainmon_network_receive_bytes_total{{{N}}}[{RATE}])"
               f" / trainmon_network_speed_bytes{{{N}}}", "{{device}} receive"),
         Query(f"rate(trainmon_network_transmit_bytes_total{{{N}}}[{RATE}])"
               f" / trainmon_network_speed_bytes{{{N}}}", "{{device}} transmit")],
        minimum=0, steps=(Step(None, "green"), Step(promql.LINK_SATURATION, "red")),
    ))
    board.add(timeseries(
        "InfiniBand / RoCE throughput vs port rate", "Bps",
        "Bytes per second per HCA port; dashed: the port's data rate. Good: bursts at "
        "gradient sync well below the rate.",
        [Query(f"rate(trainmon_infiniband_receive_bytes_total{{{N}}}[{RATE}])",
               "{{device}}/{{port}} receive"),
         Query(f"rate(trainmon_infiniband_transmit_bytes_total{{{N}}}[{RATE}])",
               "{{device}}/{{port}} transmit"),
         Query(f"trainmon_infiniband_rate_bytes{{{N}}}", "{{device}}/{{port}} port rate")],
        minimum=0, dashed=(".* port rate",),
    ))
    board.add(timeseries(
        "InfiniBand / RoCE link utilization", "percentunit",
        "Receive and transmit as a share of the port rate. Good: below 70 %; sustained "
        f"above {promql.LINK_SATURATION:.0%} (dashed) while the comm ratio is high means the "
        "fabric is the limit.",
        [Query(f"rate(trainmon_infiniband_receive_bytes_total{{{N}}}[{RATE}])"
               f" / trainmon_infiniband_rate_bytes{{{N}}}", "{{device}}/{{port}} receive"),
         Query(f"rate(trainmon_infiniband_transmit_bytes_total{{{N}}}[{RATE}])"
               f" / trainmon_infiniband_rate_bytes{{{N}}}", "{{device}}/{{port}} transmit")],
        minimum=0, steps=(Step(None, "green"), Step(promql.LINK_SATURATION, "red")),
    ))
    board.add(timeseries(
        "NIC errors and drops", "pps",
        "Receive/transmit errors and drops per second per interface. Good: 0; drops under "
        "load point at ring buffers or a congested switch port.",
        [Query(f"sum by (device) (rate(trainmon_network_receive_errors_total{{{N}}}[{RATE}])"
               f" + rate(trainmon_network_transmit_errors_total{{{N}}}[{RATE}])"
               f" + rate(trainmon_network_receive_drops_total{{{N}}}[{RATE}])"
               f" + rate(trainmon_network_transmit_drops_total{{{N}}}[{RATE}]))", "{{device}}")],
        minimum=0,
    ), width=8)
    board.add(state_timeline(
        "InfiniBand ports", "none",
        "Port state per HCA port: up (ACTIVE) or down. Good: all up; a port going down "
        "during training breaks NCCL rings.",
        [Query(f"trainmon_infiniband_port_up{{{N}}}", "{{device}}/{{port}}")],
        mappings=UP_DOWN, steps=(Step(None, "red"), Step(1, "green")),
    ), width=8)
    board.add(timeseries(
        "InfiniBand port errors", "cps",
        "Port error counters per second (symbol, link_downed, rcv_errors, …). Good: 0; "
        "symbol errors and link recoveries point at a cable or transceiver.",
        [Query(f"sum by (device, port, counter) (rate(trainmon_infiniband_errors_total{{{N}}}"
               f"[{RATE}]))", "{{device}}/{{port}} {{counter}}")],
        minimum=0,
    ), width=8)


def _disk_row(board: Board) -> None:
    board.row("Disks and NFS/CFS mounts (存)")
    board.add(timeseries(
        "Disk IOPS", "iops",
        "Reads and writes completed per second per block device. Good: steady while the "
        "job reads its dataset; compare with the device's rated IOPS.",
        [Query(f"rate(trainmon_disk_reads_completed_total{{{N}}}[{RATE}])", "{{device}} read"),
         Query(f"rate(trainmon_disk_writes_completed_total{{{N}}}[{RATE}])", "{{device}} write")],
        minimum=0,
    ), width=6)
    board.add(timeseries(
        "Disk throughput", "Bps",
        "Bytes read and written per second per block device. Good: below the device's "
        "rated throughput; checkpoints show as periodic write bursts.",
        [Query(f"rate(trainmon_disk_read_bytes_total{{{N}}}[{RATE}])", "{{device}} read"),
         Query(f"rate(trainmon_disk_written_bytes_total{{{N}}}[{RATE}])", "{{device}} write")],
        minimum=0,
    ), width=6)
    board.add(timeseries(
        "Disk busy", "percentunit",
        "Share of time the device had I/O in flight. Good: below 80 % (dashed); near 100 % "
        "on the dataset's disk while data wait is high means storage is the limit.",
        [Query(f"rate(trainmon_disk_io_time_seconds_total{{{N}}}[{RATE}])", "{{device}}")],
        minimum=0, maximum=1, steps=(Step(None, "green"), Step(0.8, "red")),
    ), width=6)
    board.add(timeseries(
        "Disk await", "s",
        "Mean time per completed I/O, queueing included. Good: well under a millisecond on "
        "NVMe, a few milliseconds on network disks.",
        # "> 0": a disk without I/O in the window has no await (0 / 0 is NaN in Prometheus,
        # dropped by VictoriaMetrics; docs/dashboards.md, "Engines").
        [Query(f"(rate(trainmon_disk_read_time_seconds_total{{{N}}}[{RATE}])"
               f" + rate(trainmon_disk_write_time_seconds_total{{{N}}}[{RATE}]))"
               f" / ((rate(trainmon_disk_reads_completed_total{{{N}}}[{RATE}])"
               f" + rate(trainmon_disk_writes_completed_total{{{N}}}[{RATE}])) > 0)",
               "{{device}}")],
        minimum=0,
    ), width=6)

    board.add(table_panel(
        "NFS / CFS mounts", "none",
        "Network file systems mounted on the node (/proc/1/mountstats): server, export, "
        "protocol version. CFS is NFS on Tencent Cloud.",
        [Query(f"trainmon_nfs_mount_info{{{N}}}")],
        hidden=("Value", "instance", "job", "node"),
    ), width=6)
    board.add(timeseries(
        "NFS throughput", "Bps",
        "Bytes read from and written to the server per second per NFS mount (the READ and "
        "WRITE RPC payload that crossed the wire; page-cache hits do not count). Good: "
        "below the share's bandwidth; flat at it while data wait is high means the share "
        "limits the job.",
        [Query(f"rate(trainmon_nfs_read_bytes_total{{{N}}}[{RATE}])", "{{mountpoint}} read"),
         Query(f"rate(trainmon_nfs_write_bytes_total{{{N}}}[{RATE}])", "{{mountpoint}} write")],
        minimum=0,
    ), width=6)
    board.add(timeseries(
        "NFS operations", "ops",
        "NFS operations per second per mount and operation. Good: READ/WRITE dominate; "
        "many GETATTR/LOOKUP/ACCESS per READ mean small files and metadata load.",
        [Query(f"sum by (mountpoint, operation) (rate(trainmon_nfs_operations_total{{{N}}}"
               f"[{RATE}]))", "{{mountpoint}} {{operation}}")],
        minimum=0,
    ), width=6)
    board.add(timeseries(
        "NFS mean RTT per operation", "s",
        "Mean round trip per operation (time on the wire and at the server) per mount. "
        "Good: around a millisecond on CFS in the same zone; tens of milliseconds mean a "
        "saturated share or server.",
        [Query(f"sum by (mountpoint, operation) (rate(trainmon_nfs_operation_rtt_seconds_total"
               f"{{{N}}}[{RATE}])) / (sum by (mountpoint, operation) "
               f"(rate(trainmon_nfs_operations_total{{{N}}}[{RATE}])) > 0)",
               "{{mountpoint}} {{operation}}")],
        minimum=0,
    ), width=6)


def _ranks_row(board: Board, variant: Variant) -> None:
    board.row("Training ranks on this node")
    board.add(timeseries(
        "Data-wait ratio per rank", "percentunit",
        "Each rank's data wait over its step time in the daemon's window. Good: below 10 %; "
        "above 20 % (dashed) the rank is starved by its data loader.",
        [Query(f"trainmon_training_data_wait_ratio{{{N}}}", "{{job}} rank {{rank}}")],
        minimum=0, steps=(Step(None, "green"), Step(promql.DATA_WAIT_LIMIT, "red")),
    ).data_links([variant.series_link(TRAINING, "job", "owner")]))
    board.add(timeseries(
        "Mean step time per rank", "s",
        "Each rank's mean step duration. Good: equal for all ranks of a job.",
        [Query(f"sum by (job, owner, rank) (rate(trainmon_training_step_seconds_sum{{{N}}}"
               f"[{RATE}])) / sum by (job, owner, rank) ("
               f"rate(trainmon_training_step_seconds_count{{{N}}}[{RATE}]))",
               "{{job}} rank {{rank}}")],
        minimum=0,
    ))
    board.add(table_panel(
        "Ranks and their GPUs", "none",
        "Which job, rank and process runs on which GPU, as the training processes report "
        "it. Good: one rank per GPU; an empty gpu means the client could not tell.",
        [Query(f"trainmon_training_rank_info{{{N}}}")],
        hidden=("Value", "instance"),
        links=[variant.row_link(TRAINING, "job", "owner")],
    ))
    board.add(table_panel(
        "Processes on the GPUs", "none",
        "Processes holding each GPU with their Kubernetes pod or Slurm job (empty where "
        "unknown). Good: every busy GPU has an owner; a process without a pod is a leftover.",
        [Query(f"trainmon_gpu_process_info{{{NODE_GPUS}}}")],
        hidden=("Value", "instance"),
    ))
    board.add(timeseries(
        "NUMA locality of GPU processes", "percentunit",
        "Share of the CPUs each GPU process may run on that are on its GPU's NUMA node. "
        "Good: 1 (bound to the right socket) or about 0.5 (unbound on two sockets); below "
        f"{promql.NUMA_LOCAL_MIN:.0%} (red) the process runs on the far socket. Absent where "
        "the platform does not report the topology (virtualised hosts: NUMA node -1).",
        [Query(f"trainmon_gpu_process_numa_local_ratio{{{NODE_GPUS}}}", "GPU {{gpu}} pid {{pid}}")],
        minimum=0, maximum=1,
        steps=(Step(None, "red"), Step(promql.NUMA_LOCAL_MIN, "green")),
    ))
    board.add(table_panel(
        "NUMA node of each GPU", "none",
        "The NUMA node of each GPU's PCI device (bind its processes there with numactl "
        "--cpunodebind/--membind). unknown: the platform reports -1, as virtualised hosts "
        "do; binding then is guesswork.",
        [Query(f"trainmon_gpu_numa_node{{{NODE_GPUS}}}")],
        hidden=("instance", "job", "node"),
        mappings=NUMA_NODE_TEXT, steps=(Step(None, "green"),),
        renames={"Value": "NUMA node"},
    ))
