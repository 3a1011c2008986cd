"""GPM activity of GPU 0 under a matmul load and under ``sleep``, read by the daemon's collector.

For a machine with a Hopper-class (or newer) GPU: the real facade and GPU
collector run on the driver's NVML while this process first multiplies large
bf16 matrices on ``cuda:0`` (tensor cores busy), then sleeps (GPU idle). After
each phase it prints the GPU's ``trainmon_gpu_*_active_ratio`` series and its
utilization, so the two can be compared with what the load must produce:
tensor and SM activity high under matmul, near zero under sleep, while
utilization alone says little about either. A GPU without GPM prints the
collector's reason from its health instead. ``bench/gpu_check.sh`` runs it.

    .venv/bin/python -m bench.gpm_check --seconds 10
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

ACTIVITY_FAMILIES = (
    "trainmon_gpu_utilization_ratio",
    "trainmon_gpu_sm_active_ratio",
    "trainmon_gpu_sm_occupancy_ratio",
    "trainmon_gpu_tensor_active_ratio",
    "trainmon_gpu_dram_active_ratio",
    "trainmon_gpu_pipe_active_ratio",
)


def matmul_load(stop: threading.Event) -> None:
    import torch

    left = torch.randn(8192, 8192, device="cuda:0", dtype=torch.bfloat16)
    right = torch.randn(8192, 8192, device="cuda:0", dtype=torch.bfloat16)
    while not stop.is_set():
        for _ in range(20):
            left @ right  # the product is the load
        torch.cuda.synchronize()  # the load's own thread: bounds the queue


def gpu0_activity(collector: object) -> dict[str, object]:
    readings: dict[str, object] = {}
    for family in collector.collect():  # type: ignore[attr-defined]
        if family.name in ACTIVITY_FAMILIES:
            for sample in family.samples:
                if sample.labels.get("gpu") == "0":
                    pipe = sample.labels.get("pipe")
                    readings[family.name + (f"{{pipe={pipe}}}" if pipe else "")] = round(
                        sample.value, 3)
    return readings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each phase")
    args = parser.parse_args()

    from trainmon.collectors.gpu import GPUCollector, GPUConfig
    from trainmon.gpu.nvml import NVML

    collector = GPUCollector(NVML(), GPUConfig())
    collector.start()
    try:
        stop = threading.Event()
        load = threading.Thread(target=matmul_load, args=(stop,), daemon=True)
        load.start()
        time.sleep(args.seconds)
        under_load = gpu0_activity(collector)
        stop.set()
        load.join()
        time.sleep(args.seconds)
        idle = gpu0_activity(collector)
        health = collector.health()
    finally:
        collector.stop()
    print(json.dumps({"matmul": under_load, "sleep": idle}, indent=2))
    if not any("active" in name for name in under_load):
        print(f"gpm_check: no GPM series for GPU 0; collector health: {health}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
