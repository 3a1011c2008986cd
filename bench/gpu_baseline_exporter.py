"""The usual Python GPU exporter, as a yardstick for ``bench/gpu_collection.py``.

What most hand-rolled and several published pynvml exporters do: global
``prometheus_client`` gauges refreshed by a timer loop (every second here),
one NVML query per metric per GPU, utilization from
``nvmlDeviceGetUtilizationRates`` (one value per refresh), PCIe throughput
from ``nvmlDeviceGetPcieThroughput`` when ``--pcie-throughput`` is given,
served by ``prometheus_client.start_http_server``. Not part of trainmon.

    python -m bench.gpu_baseline_exporter PORT [--interval 1] [--pcie-throughput]
"""

from __future__ import annotations

import argparse
import time

import pynvml
from prometheus_client import Gauge, start_http_server

UTILIZATION = Gauge("gpu_utilization_percent", "GPU utilization", ["gpu"])
MEMORY_USED = Gauge("gpu_memory_used_bytes", "Memory used", ["gpu"])
POWER = Gauge("gpu_power_watts", "Power draw", ["gpu"])
TEMPERATURE = Gauge("gpu_temperature_celsius", "Temperature", ["gpu"])
SM_CLOCK = Gauge("gpu_sm_clock_mhz", "SM clock", ["gpu"])
ENERGY = Gauge("gpu_energy_joules", "Energy", ["gpu"])
ECC = Gauge("gpu_ecc_errors", "ECC errors", ["gpu", "severity"])
PCIE = Gauge("gpu_pcie_throughput_kib_per_second", "PCIe throughput", ["gpu", "direction"])


def refresh(handles: list[object], pcie_throughput: bool) -> None:
    for index, handle in enumerate(handles):
        gpu = str(index)
        UTILIZATION.labels(gpu).set(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        MEMORY_USED.labels(gpu).set(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
        POWER.labels(gpu).set(pynvml.nvmlDeviceGetPowerUsage(handle) / 1000)
        TEMPERATURE.labels(gpu).set(pynvml.nvmlDeviceGetTemperature(handle, 0))
        SM_CLOCK.labels(gpu).set(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))
        ENERGY.labels(gpu).set(pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000)
        for severity, kind in (("corrected", 0), ("uncorrected", 1)):
            ECC.labels(gpu, severity).set(pynvml.nvmlDeviceGetTotalEccErrors(handle, kind, 0))
        if pcie_throughput:
            for direction, counter in (("tx", 0), ("rx", 1)):
                value = pynvml.nvmlDeviceGetPcieThroughput(handle, counter)
                PCIE.labels(gpu, direction).set(value)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--pcie-throughput", action="store_true")
    args = parser.parse_args()
    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    start_http_server(args.port, addr="127.0.0.1")
    while True:
        started = time.monotonic()
        refresh(handles, args.pcie_throughput)
        time.sleep(max(0.0, args.interval - (time.monotonic() - started)))


if __name__ == "__main__":
    main()
