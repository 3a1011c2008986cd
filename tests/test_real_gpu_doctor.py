"""``trainmon doctor`` sampling a real NVIDIA node (skipped without one).

Runs the real CLI in a subprocess (no fake NVML in its environment), so the
GPU section comes from the driver. With no training job reporting, an idle or
busy node is "healthy" (exit 0); the report must list every GPU with a
measured utilization, and every GPU process the driver lists must be
attributed (at least by PID).
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


def test_doctor_measures_every_gpu_of_a_real_node(tmp_path: Path) -> None:
    config = tmp_path / "trainmon.yml"
    config.write_text(json.dumps({"collectors": {
        "gpu": {"enabled": True, "process_interval_seconds": 1},
        "training": {"socket": str(tmp_path / "steps.sock")},
    }}))
    env = {key: value for key, value in os.environ.items() if not key.startswith("FAKENVML")}
    env.pop("LD_LIBRARY_PATH", None)
    done = subprocess.run(
        [sys.executable, "-m", "trainmon", "doctor", "--config", str(config), "--seconds", "4",
         "--json"],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )
    report = json.loads(done.stdout)
    print(json.dumps(report, indent=1)[:4000])
    assert done.returncode == report["exit_code"]
    assert report["gpus"], report
    for gpu in report["gpus"]:
        assert 0.0 <= gpu["utilization_ratio"] <= 1.0
        assert gpu["memory_used_bytes"] is not None
        for process in gpu["processes"]:
            assert process["pid"].isdigit() and process["job"]
    assert report["status"] in ("healthy", "bottleneck")
