"""GPM through the whole stack: fake NVML + real daemon + client ranks + ``doctor``.

A fake 4-GPU Hopper node where every GPU reads 100 % utilization by NVML,
but the GPM activity (``gpm GPU SM_ACTIVE% SM_OCCUPANCY% TENSOR% DRAM%`` in the
fake's scenario) tells two jobs apart:

===============  ======  ======================================  =====================
job              GPUs    GPM (SM, occupancy, tensor, DRAM)       expected
===============  ======  ======================================  =====================
launch-job       0, 1    20 %, 15 %, 0 %, 10 %                   compute, launch_bound
efficient-job    2, 3    85 %, 60 %, 70 %, 40 %                  compute, gpu_efficient
===============  ======  ======================================  =====================

The daemon's exported findings and evidence gauges and ``doctor --url``'s
JSON and text must name both, with the numbers.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from testkit.daemon import Daemon
from testkit.exposition import parse
from testkit.workloads import Workload, ranks
from tests.diagnosis.diagnosis_support import doctor, fake_gpu_env, job_verdicts, wait_for_steps

pytestmark = pytest.mark.integration

GPM_SCENARIO = """\
gpus 4
steady * 100 0
gpm 0 20 15 0 10
gpm 1 20 15 0 10
gpm 2 85 60 70 40
gpm 3 85 60 70 40
"""
JOBS = ("launch-job", "efficient-job")


def test_gpm_activity_tells_a_launch_bound_job_from_an_efficient_one(
    start_daemon: Callable[..., Daemon],
    fake_nvml_library: Path,
    tmp_path: Path,
    workload: Callable[[str], Workload],
) -> None:
    env = fake_gpu_env(fake_nvml_library, tmp_path / "node.txt", GPM_SCENARIO)
    daemon = start_daemon(config={"collectors": {
        "gpu": {"enabled": True, "window_seconds": 10, "gpm_interval_seconds": 0.5},
        "training": {"socket": str(tmp_path / "steps.sock")},
        "diagnosis": {"window_seconds": 20},
    }}, env=env)
    jobs = workload(daemon.url)
    jobs.job(ranks("launch-job", [0, 1], wait=0.002, compute=0.05, comm=0.002))
    jobs.job(ranks("efficient-job", [2, 3], wait=0.002, compute=0.05, comm=0.002))
    wait_for_steps(daemon, JOBS)

    # the daemon: the verdict kinds stay compute, the findings tell them apart.
    # It evaluates on scrapes: scrape until its window holds enough steps.
    deadline = time.monotonic() + 30
    scrape = parse(daemon.metrics())
    while (set(job_verdicts(scrape)) != set(JOBS) or "none" in job_verdicts(scrape).values()
           ) and time.monotonic() < deadline:
        time.sleep(0.5)
        scrape = parse(daemon.metrics())
    assert scrape.value("trainmon_gpu_sm_active_ratio", gpu="0") == pytest.approx(0.2, abs=0.01)
    assert job_verdicts(scrape) == {"launch-job": "compute", "efficient-job": "compute"}
    found = {(row["job"], row["finding"])
             for row in scrape.labelsets("trainmon_diagnosis_finding_info")}
    assert found == {("launch-job", "launch_bound"), ("launch-job", "tensor_idle"),
                     ("efficient-job", "gpu_efficient")}
    for job, sm_active, tensor, dram in (("launch-job", 0.2, 0.0, 0.1),
                                         ("efficient-job", 0.85, 0.7, 0.4)):
        assert scrape.value("trainmon_diagnosis_sm_active_ratio", job=job) == pytest.approx(
            sm_active, abs=0.01)
        assert scrape.value("trainmon_diagnosis_tensor_active_ratio", job=job) == pytest.approx(
            tensor, abs=0.01)
        assert scrape.value("trainmon_diagnosis_dram_active_ratio", job=job) == pytest.approx(
            dram, abs=0.01)

    # doctor --json: the same verdicts, the evidence, and the advice
    result = doctor("--url", daemon.url, "--seconds", "4", "--json")
    assert result.returncode == 0, result.stdout + result.stderr  # compute needs no action
    report = json.loads(result.stdout)
    verdicts = {job["job"]: job for job in report["jobs"]}
    assert {job: (v["kind"], [f["code"] for f in v["findings"]])
            for job, v in verdicts.items()} == {
        "launch-job": ("compute", ["launch_bound", "tensor_idle"]),
        "efficient-job": ("compute", ["gpu_efficient"]),
    }
    launch = verdicts["launch-job"]["evidence"]
    assert launch["gpm_gpus"] == ["0", "1"]
    assert launch["gpu_utilization_ratio"] > 0.95
    assert launch["sm_active_ratio"] == pytest.approx(0.2, abs=0.01)
    assert "CUDA graphs" in verdicts["launch-job"]["advice"]
    assert verdicts["efficient-job"]["evidence"]["tensor_active_ratio"] == pytest.approx(
        0.7, abs=0.01)
    gpu2 = next(gpu for gpu in report["gpus"] if gpu["gpu"] == "2")
    assert gpu2["sm_active_ratio"] == pytest.approx(0.85, abs=0.01)
    assert gpu2["job"] == "efficient-job"

    # doctor's text, in both languages
    english = doctor("--url", daemon.url, "--seconds", "2")
    assert english.returncode == 0, english.stdout + english.stderr
    text = english.stdout
    assert "SM active 20%" in text and "tensor 70%" in text
    assert "launch-job: COMPUTE — GPUs 0,1 look 100% busy but their SMs are active only 20%" \
        in text, text
    assert "efficient-job: COMPUTE — GPUs 2,3 compute efficiently" in text
    assert "utilization alone" not in text
    chinese = doctor("--url", daemon.url, "--seconds", "2", "--lang", "zh")
    assert chinese.returncode == 0
    assert "launch-job: 算（计算） — GPU 0,1 利用率显示 100%，但 SM 只有 20% 在活跃" in chinese.stdout
    assert "下一步" in chinese.stdout and "CUDA Graphs" in chinese.stdout
