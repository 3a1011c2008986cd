"""CPU cost of the pressure and health collectors on the scrape and evaluation path.

In process, on this machine's real ``/proc`` and ``/sys``:

- **pressure**: one ``collect()`` (three PSI files, ``/proc/stat``, and
  ``/proc/<pid>/cgroup`` + ``cpu.stat`` per rank) with 0, 8 and 64 ranks in a
  real training store, every rank's kernel-named sender being this process;
- **health**: one evaluation (``observe`` + ``collect``) of an 8-GPU node with
  every contract-A family (18 NVLink links a GPU), 4 NICs, 8 InfiniBand ports,
  PSI and steal, once the window holds its 20 snapshots (the steady state;
  counters move every evaluation).

Prints the median and p95 of the CPU time per call (``time.thread_time``).

    .venv/bin/python -m bench.health_collector
    .venv/bin/python -m bench.health_collector --calls 2000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from bench import benchlib
from trainmon.collectors.health import HealthCollector
from trainmon.collectors.pressure import PressureCollector
from trainmon.contract import STEP_BUCKET_COUNT
from trainmon.diagnosis.health import HealthConfig
from trainmon.training.protocol import parse_report
from trainmon.training.store import TrainingStore

GPUS, NICS, PORTS = 8, 4, 8


def node_families(tick: int) -> list[Metric]:
    """The families an 8-GPU node's sources export at evaluation ``tick``."""
    g, c = GaugeMetricFamily, CounterMetricFamily
    gpus = [str(index) for index in range(GPUS)]
    families: list[Metric] = []

    def add(family: Metric, rows: list[tuple[list[str], float]]) -> None:
        for labels, value in rows:
            family.add_metric(labels, value)
        families.append(family)

    per_gpu = ["gpu"]
    add(g("trainmon_gpu_up", "x", labels=per_gpu), [([gpu], 1) for gpu in gpus])
    add(g("trainmon_gpu_utilization_ratio", "x", labels=per_gpu), [([gpu], 0.9) for gpu in gpus])
    add(g("trainmon_gpu_recovery_action", "x", labels=["gpu", "action", "source"]),
        [([gpu, "none", "driver"], 1) for gpu in gpus])
    add(g("trainmon_gpu_xid_last_timestamp_seconds", "x", labels=["gpu", "xid"]),
        [(["3", "13"], time.time() - 86400)])
    add(c("trainmon_gpu_throttle_seconds_total", "x", labels=["gpu", "reason"]),
        [([gpu, reason], tick * 0.1) for gpu in gpus
         for reason in ("power", "thermal", "sync_boost", "board_limit", "low_utilization",
                        "reliability", "app_clocks", "base_clocks")])
    add(c("trainmon_gpu_ecc_errors_total", "x", labels=["gpu", "severity"]),
        [([gpu, severity], 1) for gpu in gpus for severity in ("corrected", "uncorrected")])
    add(g("trainmon_gpu_remapped_rows", "x", labels=["gpu", "cause"]),
        [([gpu, cause], 0) for gpu in gpus for cause in ("correctable", "uncorrectable")])
    add(g("trainmon_gpu_retired_pages", "x", labels=["gpu", "cause"]),
        [([gpu, cause], 0) for gpu in gpus for cause in ("single_bit", "double_bit")])
    for name, value in (
        ("trainmon_gpu_row_remap_pending", 0), ("trainmon_gpu_row_remap_failed", 0),
        ("trainmon_gpu_retired_pages_pending", 0), ("trainmon_gpu_pcie_link_width", 16),
        ("trainmon_gpu_pcie_link_max_width", 16), ("trainmon_gpu_pcie_link_generation", 5),
        ("trainmon_gpu_pcie_link_max_generation", 5), ("trainmon_gpu_fabric_up", 1),
    ):
        add(g(name, "x", labels=per_gpu), [([gpu], value) for gpu in gpus])
    add(c("trainmon_gpu_pcie_replays_total", "x", labels=per_gpu), [([gpu], tick) for gpu in gpus])
    add(g("trainmon_gpu_nvlink_links_down", "x", labels=per_gpu), [([gpu], 0) for gpu in gpus])
    for name in ("trainmon_network_receive_errors_total", "trainmon_network_transmit_errors_total"):
        add(c(name, "x", labels=["device"]), [([f"eth{index}"], tick) for index in range(NICS)])
    ports = [[f"mlx5_{index}", "1"] for index in range(PORTS)]
    add(g("trainmon_infiniband_port_up", "x", labels=["device", "port"]), [(p, 1) for p in ports])
    add(c("trainmon_infiniband_errors_total", "x", labels=["device", "port", "counter"]),
        [([*p, counter], tick) for p in ports
         for counter in ("symbol", "link_downed", "rcv_errors")])
    add(c("trainmon_node_pressure_seconds_total", "x", labels=["resource", "scope"]),
        [([resource, scope], tick * 0.01) for resource in ("cpu", "io", "memory")
         for scope in ("some", "full")])
    add(c("trainmon_node_cpu_steal_seconds_total", "x"), [([], tick * 0.01)])
    add(g("trainmon_node_info", "x", labels=["provider", "instance_id"]),
        [(["tencent", "ins-bench"], 1)])
    return families


def cpu_per_call(call: Callable[[], object], calls: int) -> list[float]:
    """CPU seconds of each of ``calls`` calls."""
    spent = []
    for _ in range(calls):
        started = time.thread_time()
        call()
        spent.append(time.thread_time() - started)
    return spent


def summary(spent: list[float]) -> dict[str, float]:
    return {"median_us": round(statistics.median(spent) * 1e6, 1),
            "p95_us": round(benchlib.percentile(spent, 0.95) * 1e6, 1)}


def pressure_cost(ranks: int, calls: int) -> dict[str, float]:
    store = TrainingStore(max_ranks_per_job=max(ranks, 1))
    for rank in range(ranks):
        report = {"v": 1, "job": "bench", "rank": rank, "local_rank": rank % 8,
                  "world_size": 64, "gpu": str(rank % 8), "pid": 1, "reporter_id": "bench",
                  "steps": 10, "samples": 320, "step_seconds": 2.0, "data_wait_seconds": 0.5,
                  "phase_seconds": {}, "step_buckets": [10] + [0] * (STEP_BUCKET_COUNT - 1),
                  "dropped_reports": 0, "last_step_time": 1_700_000_000.0}
        store.ingest(parse_report(json.dumps(report).encode()), "unix", os.getpid())
    collector = PressureCollector(Path("/proc"), Path("/sys"), store)
    measured = len(list(collector.collect()))
    assert ranks == 0 or measured == 3, "no throttling figure: no cpu controller here?"
    return summary(cpu_per_call(lambda: list(collector.collect()), calls))


def health_cost(calls: int) -> dict[str, float]:
    clock = [0.0]
    collector = HealthCollector(HealthConfig(), cpu_count=64, clock=lambda: clock[0])
    ticks = iter(range(1 << 30))
    prepared = [node_families(tick) for tick in range(64)]

    def evaluate() -> None:
        tick = next(ticks)
        clock[0] += 3.0
        collector.observe(prepared[tick % len(prepared)])
        list(collector.collect())

    for _ in range(25):  # fill the window's 20 snapshots
        evaluate()
    return summary(cpu_per_call(evaluate, calls))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    args = parser.parse_args()
    results: dict[str, object] = {
        f"pressure collect, {ranks} ranks": pressure_cost(ranks, args.calls)
        for ranks in (0, 8, 64)
    }
    results["health evaluation, 8 GPUs x 18 links, 4 NICs, 8 IB ports"] = health_cost(args.calls)
    print(json.dumps(results, indent=2))
    print("\n| path | median CPU | p95 CPU |\n| --- | --- | --- |")
    for name, figures in results.items():
        assert isinstance(figures, dict)
        print(f"| {name} | {figures['median_us']} µs | {figures['p95_us']} µs |")


if __name__ == "__main__":
    main()
