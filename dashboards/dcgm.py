"""The ``dcgm`` (self-hosted) variant: dcgm-exporter's ``DCGM_FI_*`` series beside trainmon's.

Field names, types and units are those of dcgm-exporter's
``etc/default-counters.csv`` (a copy is checked in as
``testkit/dcgm-exporter-default-counters.csv``): clocks in MHz,
framebuffer in MiB, utilization in %, ``DCGM_FI_PROF_*`` activity as 0–1
ratios, PCIe ``DCGM_FI_PROF_PCIE_*_BYTES`` as bytes/s gauges. dcgm-exporter
labels every series with ``gpu`` (the NVML index, as trainmon does), so a
Prometheus that gives both targets the same ``node`` label joins them.

The SM, tensor-pipe and DRAM activity panels (``dashboards/activity.py``) read
``DCGM_FI_PROF_SM_ACTIVE``, ``…_PIPE_TENSOR_ACTIVE`` and ``…_DRAM_ACTIVE`` where
dcgm-exporter exports them and the daemon's NVML GPM series for every other GPU
(``promql.either_activity``). ``DCGM_FI_PROF_SM_ACTIVE`` is commented out in the
default counters (``OPT_IN_FIELDS``); the panels say so.
"""

from __future__ import annotations

from dashboards import promql
from dashboards.builder import Board
from dashboards.panels import (
    GPU,
    RED_FROM_ONE,
    TEMPERATURE_STEPS,
    Query,
    stat_panel,
    table_panel,
    timeseries,
)
from dashboards.promql import FLEET, NODE_GPUS, either_activity, either_memory_share
from dashboards.variant import Variant

#: Fields the panels use that dcgm-exporter's default counters leave commented out.
OPT_IN_FIELDS = ("DCGM_FI_PROF_SM_ACTIVE",)
MIB = 1048576
MHZ = 1000000


def _node_rows(board: Board, variant: Variant) -> None:
    board.row("GPUs (DCGM, dcgm-exporter)")
    board.add(timeseries(
        "Graphics engine active", "percentunit",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE: share of time the graphics/compute engine is "
        "active (DCGM's finer-grained utilization). Good: near 100 % while training. SM, "
        "tensor-pipe and DRAM activity are in the GPU activity row, from DCGM where it "
        "exports them.",
        [Query(f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{NODE_GPUS}}}", GPU)], minimum=0, maximum=1,
    ), width=8)
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
    board.add(stat_panel(
        "GPUs with an XID (DCGM)", "short",
        "GPUs whose last DCGM XID value is not 0. Good: 0.",
        [Query(f"sum({promql.FLEET_DCGM_GPUS_XID}{{{FLEET}}}) or vector(0)")],
        steps=RED_FROM_ONE,
    ), width=12, height=5)
    board.add(stat_panel(
        "GPUs seen by dcgm-exporter", "short",
        "GPUs dcgm-exporter reports, next to those trainmon's NVML collector reports. Good: "
        "equal on every node.",
        [Query(f"sum({promql.FLEET_DCGM_GPUS}{{{FLEET}}})", "dcgm-exporter"),
         Query(f"sum({promql.FLEET_GPUS}{{{FLEET}}})", "trainmon")],
        show_name=True,
    ), width=12, height=5)


DCGM = Variant(
    slug="dcgm",
    name="DCGM",
    uid_prefix="trainmon-dcgm",
    summary=(
        "Self-hosted variant: GPU device metrics from dcgm-exporter (DCGM_FI_*, profiling "
        "fields included) beside the trainmon daemon's NVML, network, disk and training series."
    ),
    gpu_activity=either_activity,
    gpu_memory_share=either_memory_share,
    activity_source=(
        "Source: DCGM profiling (dcgm-exporter's DCGM_FI_PROF_* fields) where dcgm-exporter "
        "exports the field, else the trainmon daemon's NVML GPM counters (Hopper and "
        "newer GPUs); DCGM_FI_PROF_SM_ACTIVE is not in dcgm-exporter's default counters: "
        "uncomment it in default-counters.csv (or use dcp-metrics-included.csv) to take SM "
        "activity from DCGM."
    ),
    memory_source=(
        "Source: the trainmon daemon (NVML), else DCGM_FI_DEV_FB_USED over FB_USED + FB_FREE "
        "for GPUs the daemon does not see."
    ),
    node_rows=_node_rows,
    fleet_rows=_fleet_rows,
)
