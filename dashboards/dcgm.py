"""The ``dcgm`` (self-hosted) variant: dcgm-exporter's ``DCGM_FI_*`` series beside trainmon's.

Field names, types and units are those of dcgm-exporter's
``etc/default-counters.csv`` (a copy is checked in as
``tests/dashboards/dcgm-exporter-default-counters.csv``): clocks in MHz,
framebuffer in MiB, utilization in %, ``DCGM_FI_PROF_*`` activity as 0–1
ratios, PCIe ``DCGM_FI_PROF_PCIE_*_BYTES`` as bytes/s gauges. dcgm-exporter
labels every series with ``gpu`` (the NVML index, as trainmon does), so a
Prometheus that gives both targets the same ``node`` label joins them.

``DCGM_FI_PROF_SM_ACTIVE`` is commented out in the default counters; the panels
that use it say so and stay empty until it is enabled (``OPT_IN_FIELDS``).
"""

from __future__ import annotations

from dashboards.builder import Board
from dashboards.panels import (
    GPU,
    NODE_GPU,
    RED_FROM_ONE,
    TEMPERATURE_STEPS,
    Query,
    stat_panel,
    state_timeline,
    table_panel,
    timeseries,
)
from dashboards.promql import FLEET, NODE_GPUS, job_gpus
from dashboards.variant import NODE, Variant

#: Fields the panels use that dcgm-exporter's default counters leave commented out.
OPT_IN_FIELDS = ("DCGM_FI_PROF_SM_ACTIVE",)
MIB = 1048576
MHZ = 1000000
OPT_IN = (
    " DCGM_FI_PROF_SM_ACTIVE is not in dcgm-exporter's default counters: uncomment it in "
    "default-counters.csv (or use dcp-metrics-included.csv) to fill this panel."
)


def _training_rows(board: Board, variant: Variant) -> None:
    board.row("The job's GPUs as DCGM profiles them")
    board.add(state_timeline(
        "SM active (job's GPUs)", "percentunit",
        "Share of cycles with at least one warp on an SM (DCGM profiling, averaged over the "
        "GPU's SMs). Good: above ~80 % for large models; utilization near 100 % with low SM "
        "activity means small kernels that leave most of the GPU idle." + OPT_IN,
        [Query(job_gpus("DCGM_FI_PROF_SM_ACTIVE"), NODE_GPU)],
    ))
    board.add(state_timeline(
        "Tensor pipe active (job's GPUs)", "percentunit",
        "Share of cycles the tensor (HMMA) pipe is busy. Good: well above 0 for "
        "mixed-precision training; near 0 means the model is not using tensor cores "
        "(check AMP / bf16).",
        [Query(job_gpus("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"), NODE_GPU)],
    ))


def _node_rows(board: Board, variant: Variant) -> None:
    board.row("GPUs (DCGM, dcgm-exporter)")
    profiling = (
        ("SM active", "DCGM_FI_PROF_SM_ACTIVE",
         "Share of cycles with at least one warp assigned to an SM. Good: above ~80 % in "
         "training; the gap to utilization is GPU capacity the kernels leave unused."
         + OPT_IN),
        ("Graphics engine active", "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
         "Share of time the graphics/compute engine is active (DCGM's finer-grained "
         "utilization). Good: near 100 % while training."),
        ("Tensor pipe active", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
         "Share of cycles the tensor (HMMA) pipe is busy. Good: clearly above 0 with "
         "mixed precision; near 0 means no tensor cores are used."),
        ("DRAM active", "DCGM_FI_PROF_DRAM_ACTIVE",
         "Share of cycles device memory is sending or receiving data. Good: below ~80 %; "
         "near 100 % the model is memory-bandwidth bound."),
    )
    for title, field, description in profiling:
        board.add(timeseries(
            title, "percentunit", description,
            [Query(f"{field}{{{NODE_GPUS}}}", GPU)], minimum=0, maximum=1,
        ), width=6)
    board.add(timeseries(
        "GPU utilization (DCGM)", "percentunit",
        "DCGM_FI_DEV_GPU_UTIL: the driver's duty cycle as DCGM samples it. Good: matches "
        "trainmon's GPU utilization above; near 100 % during training.",
        [Query(f"DCGM_FI_DEV_GPU_UTIL{{{NODE_GPUS}}} / 100", GPU)], minimum=0, maximum=1,
    ), width=8)
    board.add(timeseries(
        "Framebuffer used vs free", "bytes",
        "Framebuffer memory used and free (DCGM reports MiB). Good: free memory left for "
        "the largest batch.",
        [Query(f"DCGM_FI_DEV_FB_USED{{{NODE_GPUS}}} * {MIB}", "GPU {{gpu}} used"),
         Query(f"DCGM_FI_DEV_FB_FREE{{{NODE_GPUS}}} * {MIB}", "GPU {{gpu}} free")],
        minimum=0, dashed=(".* free",),
    ), width=8)
    board.add(timeseries(
        "Power draw (DCGM)", "watt",
        "Board power draw. Good: high and steady under load; compare with trainmon's Power "
        "vs limit for the cap.",
        [Query(f"DCGM_FI_DEV_POWER_USAGE{{{NODE_GPUS}}}", GPU)], minimum=0,
    ), width=8)
    board.add(timeseries(
        "Temperature (DCGM)", "celsius",
        "GPU core and HBM temperature. Good: core below ~80 °C, memory below ~85 °C.",
        [Query(f"DCGM_FI_DEV_GPU_TEMP{{{NODE_GPUS}}}", "GPU {{gpu}} core"),
         Query(f"DCGM_FI_DEV_MEMORY_TEMP{{{NODE_GPUS}}}", "GPU {{gpu}} memory")],
        steps=TEMPERATURE_STEPS,
    ), width=8)
    board.add(timeseries(
        "Clocks (DCGM)", "hertz",
        "SM and memory clocks (DCGM reports MHz). Good: SM clock at boost under load.",
        [Query(f"DCGM_FI_DEV_SM_CLOCK{{{NODE_GPUS}}} * {MHZ}", "GPU {{gpu}} SM"),
         Query(f"DCGM_FI_DEV_MEM_CLOCK{{{NODE_GPUS}}} * {MHZ}", "GPU {{gpu}} memory")],
        minimum=0,
    ), width=8)
    board.add(timeseries(
        "PCIe throughput (DCGM)", "Bps",
        "PCIe transmit and receive rates including protocol headers (DCGM profiling "
        "gauges, bytes/s). Good: bursts at batch upload, far below the slot's bandwidth.",
        [Query(f"DCGM_FI_PROF_PCIE_TX_BYTES{{{NODE_GPUS}}}", "GPU {{gpu}} transmit"),
         Query(f"DCGM_FI_PROF_PCIE_RX_BYTES{{{NODE_GPUS}}}", "GPU {{gpu}} receive")],
        minimum=0,
    ), width=8)
    board.add(timeseries(
        "NVLink bandwidth (DCGM)", "KiBs",
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL, all links of the GPU. dcgm-exporter declares "
        "it a counter, but DCGM reports a rate (KiB/s per NVIDIA's DeepOps dashboards), so "
        "it is drawn as is. Good: bursts at every gradient sync in multi-GPU jobs.",
        [Query(f"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{{{NODE_GPUS}}}", GPU)], minimum=0,
    ), width=8)
    board.add(table_panel(
        "Last XID and row remapping (DCGM)", "short",
        "Per GPU: the last XID DCGM saw (0: none), rows remapped for correctable and "
        "uncorrectable memory errors, and whether remapping failed. Good: all 0; an "
        "uncorrectable remap or a failure needs a GPU reset or RMA.",
        [Query(f"max by (gpu) (DCGM_FI_DEV_XID_ERRORS{{{NODE_GPUS}}})"),
         Query(f"max by (gpu) (DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS{{{NODE_GPUS}}})"),
         Query(f"max by (gpu) (DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{{{NODE_GPUS}}})"),
         Query(f"max by (gpu) (DCGM_FI_DEV_ROW_REMAP_FAILURE{{{NODE_GPUS}}})")],
        steps=RED_FROM_ONE,
        renames={"Value #A": "last XID", "Value #B": "correctable remaps",
                 "Value #C": "uncorrectable remaps", "Value #D": "remap failed"},
    ), width=8)


def _fleet_rows(board: Board, variant: Variant) -> None:
    board.row("DCGM across the fleet")
    to_node = [variant.series_link(NODE, "node")]
    board.add(state_timeline(
        "Tensor pipe active, every GPU", "percentunit",
        "Every GPU's tensor-pipe activity (red none → green busy). Good: green where "
        "mixed-precision training runs; red rows under a training job mean no tensor cores.",
        [Query(f"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{FLEET}}}", NODE_GPU)],
    ).data_links(to_node), width=16, height=10)
    board.add(stat_panel(
        "GPUs with an XID (DCGM)", "short",
        "GPUs whose last DCGM XID value is not 0. Good: 0.",
        [Query(f"count(DCGM_FI_DEV_XID_ERRORS{{{FLEET}}} > 0) or vector(0)")],
        steps=RED_FROM_ONE,
    ), width=4, height=5)
    board.add(stat_panel(
        "GPUs seen by dcgm-exporter", "short",
        "GPUs dcgm-exporter reports, next to those trainmon's NVML collector reports. Good: "
        "equal on every node.",
        [Query(f"count(DCGM_FI_DEV_GPU_UTIL{{{FLEET}}})", "dcgm-exporter"),
         Query(f"count(trainmon_gpu_up{{{FLEET}}})", "trainmon")],
        show_name=True,
    ), width=4, height=5)


DCGM = Variant(
    slug="dcgm",
    name="DCGM",
    uid_prefix="trainmon-dcgm",
    summary=(
        "Self-hosted variant: GPU device metrics from dcgm-exporter (DCGM_FI_*, profiling "
        "fields included) beside the trainmon daemon's NVML, network, disk and training series."
    ),
    training_rows=_training_rows,
    node_rows=_node_rows,
    fleet_rows=_fleet_rows,
)
