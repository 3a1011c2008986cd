"""The GPU collector on a real NVIDIA card (skipped without one).

Runs in a subprocess so that no fake library loaded by the other GPU tests can
stand in for the real one; prints what the card reported (for
docs/benchmarks.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not Path("/dev/nvidiactl").exists(), reason="no NVIDIA GPU on this machine"),
]

PROBE = """
import json, time
from prometheus_client import CollectorRegistry, generate_latest
from trainmon.collectors.gpu import GPUCollector
from trainmon.collectors.gpu import GPUConfig
from trainmon.gpu.nvml import NVML

collector = GPUCollector(NVML(), GPUConfig(sample_interval_seconds=0.5))
collector.start()
time.sleep(3)
started = time.perf_counter()
families = list(collector.collect())
cycle = time.perf_counter() - started
registry = CollectorRegistry(auto_describe=False)
registry.register(collector)
text = generate_latest(registry).decode()
print(json.dumps({"cycle_seconds": cycle, "health": collector.health(),
                  "processes": {k: len(v) for k, v in collector.processes().items()},
                  "text": text}))
collector.stop()
"""


def test_a_real_gpu_reports_every_family() -> None:
    env = {key: value for key, value in os.environ.items() if not key.startswith("FAKENVML")}
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    print(report["text"])
    print({key: value for key, value in report.items() if key != "text"})
    text = report["text"]
    gpus = report["health"]["gpus"]
    assert gpus >= 1
    for index in range(gpus):
        assert f'trainmon_gpu_up{{gpu="{index}"}} 1.0' in text
    for name in (
        "trainmon_gpu_info",
        "trainmon_gpu_memory_used_bytes",
        "trainmon_gpu_power_watts",
        "trainmon_gpu_temperature_celsius",
        "trainmon_gpu_sm_clock_hertz",
        "trainmon_gpu_util_samples_total",
        "trainmon_gpu_sawtooth_ratio",
    ):
        assert f"\n{name}{{" in text, name
    assert "NaN" not in text
    assert report["cycle_seconds"] < 0.5
    # GPM: every GPU either samples (values 0-1) or says why not (e.g. before Hopper).
    gpm = report["health"]["gpm"]
    for index in range(gpus):
        state = gpm[str(index)]
        assert state == "sampling" or state.startswith("unsupported: "), gpm
        if state == "sampling":
            line = next(
                row
                for row in text.splitlines()
                if row.startswith(f'trainmon_gpu_sm_active_ratio{{gpu="{index}"}}')
            )
            assert 0.0 <= float(line.split()[-1]) <= 1.0, line
    # Driver health: every GPU has its PCIe link, SM clock maximum and one recovery
    # action; no health reading failed (a wrong struct version would: trainmon_gpu_up 0).
    for name in (
        "trainmon_gpu_pcie_link_width",
        "trainmon_gpu_pcie_link_max_width",
        "trainmon_gpu_pcie_link_generation",
        "trainmon_gpu_pcie_link_max_generation",
        "trainmon_gpu_sm_clock_max_hertz",
        "trainmon_gpu_recovery_action",
    ):
        lines = [row for row in text.splitlines() if row.startswith(f"{name}{{")]
        assert len(lines) == gpus, (name, lines)
        assert all(float(row.split()[-1]) > 0 for row in lines), lines
