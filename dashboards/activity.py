"""How much of each GPU the kernels use: SM, tensor-pipe and DRAM activity, memory used share.

One set of panels for the Node detail and the Training overview of both
variants. The numbers come from the variant (``Variant.gpu_activity``): the
trainmon daemon's NVML GPM series (``trainmon_gpu_*_active_ratio``, Hopper and
newer), and in the ``dcgm`` variant dcgm-exporter's ``DCGM_FI_PROF_*`` fields
where it exports them — one panel, either source (``promql.either_activity``).
The lines drawn are the alert and diagnosis thresholds of ``trainmon.contract``.
"""

from __future__ import annotations

from collections.abc import Callable

from dashboards import promql
from dashboards.builder import Board
from dashboards.panels import Query, Step, timeseries
from dashboards.variant import Variant


def _identity(expr: str) -> str:
    return expr


def add_activity_panels(
    board: Board,
    variant: Variant,
    selector: str,
    legend: str,
    *,
    scope: Callable[[str], str] = _identity,
    suffix: str = "",
) -> None:
    """SM active, tensor pipe active, DRAM active and memory used share, a quarter row each.

    ``selector`` is the label-matcher list of the GPUs ("" for all), ``scope``
    restricts an expression further (``promql.job_gpus``), ``suffix`` ends each title.
    """
    source = " " + variant.activity_source
    panels = (
        ("SM active", promql.SM_ACTIVE,
         "Share of cycles an SM has at least one warp resident, averaged over the GPU's SMs. "
         "NVML utilization only says some kernel ran; this says how much of the chip it "
         f"used. Good: above ~80 % in training; below {promql.SM_ACTIVE_LOW:.0%} (red) on a "
         "busy GPU the kernels are small or launch-bound (TrainmonGPULowSMActivity).",
         (Step(None, "red"), Step(promql.SM_ACTIVE_LOW, "green"))),
        ("Tensor pipe active", promql.TENSOR_ACTIVE,
         "Share of cycles a tensor (HMMA) pipe is busy. Good: tens of percent with bf16/AMP "
         f"or TF32; below {promql.TENSOR_IDLE:.0%} (red) on a busy GPU the matmuls run in "
         "FP32 on the CUDA cores (TrainmonGPUTensorCoresIdle).",
         (Step(None, "red"), Step(promql.TENSOR_IDLE, "green"))),
        ("DRAM active", promql.DRAM_ACTIVE,
         "Share of cycles the device-memory interface is sending or receiving data. Good: "
         f"below {promql.DRAM_ACTIVE_CEILING:.0%}; at or above it (red) the kernels wait "
         "for HBM bandwidth, not for math.",
         (Step(None, "green"), Step(promql.DRAM_ACTIVE_CEILING, "red"))),
    )
    for title, activity, description, steps in panels:
        board.add(timeseries(
            title + suffix, "percentunit", description + source,
            [Query(scope(variant.gpu_activity(activity, selector)), legend)],
            minimum=0, maximum=1, steps=steps,
        ), width=6)
    board.add(timeseries(
        "Memory used share" + suffix, "percentunit",
        "Framebuffer memory in use over the GPU's total. Good: headroom left; at or above "
        f"{promql.MEMORY_FULL:.0%} (red) a longer sequence or batch runs out of memory "
        "(TrainmonGPUMemoryNearlyFull). PyTorch's caching allocator keeps freed memory, so "
        "a high share can be cache rather than tensors. " + variant.memory_source,
        [Query(scope(variant.gpu_memory_share(selector)), legend)],
        minimum=0, maximum=1,
        steps=(Step(None, "green"), Step(promql.MEMORY_FULL, "red")),
    ), width=6)
