"""Whole-stack scenarios: fake NVML + real daemon + real client/PyTorch loops + ``doctor``.

One daemon runs on a fake 10-GPU node (the compiled ``libnvidia-ml.so.1``
stand-in, through ``LD_LIBRARY_PATH``) while five workloads run at once:

==================  ======  ====================================================
job                 GPUs    behaviour                            expected verdict
==================  ======  ====================================================
storage-job         0       real PyTorch loop, slow Dataset      storage
comm-job            1, 2    comm phase ≈ 40 % of each step        communication
compute-job         3, 4    busy GPUs, short waits               compute
straggler-job       5–8     rank 3 computes 1.5× longer (synced)  scheduling
(no telemetry)      9       a process holding an idle GPU         scheduling
==================  ======  ====================================================

``trainmon doctor --url`` reads the daemon and must name each verdict, with
advice, in its ``--json`` output and its text; the daemon's own
``trainmon_bottleneck`` must agree.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testkit.daemon import Daemon
from testkit.exposition import parse
from testkit.workloads import Workload, ranks
from tests.diagnosis.diagnosis_support import doctor, fake_gpu_env, job_verdicts, wait_for_steps

pytestmark = pytest.mark.integration

# A node before Hopper (no `gpm` line: no GPM): the compute verdict rests on
# utilization alone (gpu_bound); test_gpm_scenarios.py covers GPUs with GPM.
NODE_SCENARIO = """\
gpus 10
steady * 95 2
saw 0 4 0.5 90 0
steady 1 60 5
steady 2 60 5
steady 9 0 0
process 9 {idle_pid} 2147483648
"""
TRAINING_JOBS = ("storage-job", "comm-job", "compute-job", "straggler-job")


def daemon_config(socket: Path) -> dict[str, object]:
    return {"collectors": {
        "gpu": {"enabled": True, "process_interval_seconds": 1, "window_seconds": 10},
        "training": {"socket": str(socket)},
        "diagnosis": {"window_seconds": 20},
    }}


@pytest.fixture
def idle_process() -> Iterator[int]:
    """A real process that holds 'GPU 9' in the fake NVML and does nothing."""
    process = subprocess.Popen(["sleep", "300"])
    yield process.pid
    process.kill()
    process.wait()


def test_each_bottleneck_is_named_by_doctor_and_the_daemon(
    start_daemon: Callable[..., Daemon],
    fake_nvml_library: Path,
    tmp_path: Path,
    idle_process: int,
    workload: Callable[[str], Workload],
) -> None:
    socket = tmp_path / "steps.sock"
    env = fake_gpu_env(fake_nvml_library, tmp_path / "node.txt",
                       NODE_SCENARIO.format(idle_pid=idle_process))
    daemon = start_daemon(config=daemon_config(socket), env=env)
    jobs = workload(daemon.url)  # HTTP push: POST /api/v1/steps on loopback
    jobs.torch_job("storage-job", gpu="0", seconds=120)
    jobs.job(ranks("comm-job", [1, 2], wait=0.002, compute=0.06, comm=0.04))
    jobs.job(ranks("compute-job", [3, 4], wait=0.002, compute=0.1, comm=0.004))
    jobs.job(ranks("straggler-job", [5, 6, 7, 8], wait=0.002, compute=0.08, comm=0.004,
                   slow_rank=3, slow_factor=1.5))
    wait_for_steps(daemon, TRAINING_JOBS)
    time.sleep(2)

    result = doctor("--url", daemon.url, "--seconds", "6", "--json")
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads(result.stdout)
    verdicts = {job["job"]: job for job in report["jobs"]}
    idle_holder = next(p["job"] for g in report["gpus"] if g["gpu"] == "9"
                       for p in g["processes"])
    expected = {
        "storage-job": ("storage", "data_wait"),
        "comm-job": ("communication", "comm_phase"),
        "compute-job": ("compute", "gpu_bound"),
        "straggler-job": ("scheduling", "straggler"),
        idle_holder: ("scheduling", "idle_held"),
    }
    assert {job: (v["kind"], v["findings"][0]["code"]) for job, v in verdicts.items()} == expected
    assert report["status"] == "bottleneck" and report["exit_code"] == 1
    assert report["source"]["kind"] == "url" and report["source"]["snapshots"] >= 6

    storage = verdicts["storage-job"]
    assert storage["evidence"]["data_wait_ratio"] > 0.5
    assert "num_workers" in storage["advice"]
    comm = verdicts["comm-job"]
    assert 0.3 <= comm["evidence"]["comm_ratio"] <= 0.6
    assert "NCCL" in comm["advice"]
    compute = verdicts["compute-job"]
    assert compute["evidence"]["gpu_utilization_ratio"] > 0.85
    assert compute["evidence"]["gpus"] == ["3", "4"]
    straggler = verdicts["straggler-job"]
    assert straggler["evidence"]["straggler_rank"] == "3"
    assert 1.3 <= straggler["evidence"]["straggler_ratio"] <= 1.8
    assert "throttl" in straggler["advice"]
    assert verdicts[idle_holder]["evidence"]["idle_gpus"] == ["9"]
    assert str(idle_process) in idle_holder or idle_holder.startswith(("pod:", "slurm:"))
    gpu0 = next(g for g in report["gpus"] if g["gpu"] == "0")
    assert gpu0["job"] == "storage-job"

    # the daemon's own verdicts (its window holds the doctor's scrapes and more)
    scrape = parse(daemon.metrics())
    assert job_verdicts(scrape) == {job: kind for job, (kind, _) in expected.items()}
    assert scrape.value("trainmon_gpu_process_info", gpu="9", pid=str(idle_process)) == 1

    # the human report, in both languages, in the order GPU → storage → network → verdict
    english = doctor("--url", daemon.url, "--seconds", "2")
    assert english.returncode == 1
    text = english.stdout
    positions = [text.index(h) for h in ("1. GPU", "2. Storage", "3. Network", "4. Verdict")]
    assert positions == sorted(positions)
    assert "storage-job: STORAGE" in text and "comm-job: COMMUNICATION" in text
    assert "straggler-job: SCHEDULING" in text and "compute-job: COMPUTE" in text
    assert "next: Feed the GPUs faster" in text
    assert text.rstrip().endswith("Bottleneck found.")
    chinese = doctor("--url", daemon.url, "--seconds", "2", "--lang", "zh")
    assert chinese.returncode == 1
    assert "storage-job: 存（数据加载与存储）" in chinese.stdout
    assert "下一步" in chinese.stdout and "2. 存储" in chinese.stdout


def test_local_sampling_without_a_daemon_reports_a_healthy_job(
    fake_nvml_library: Path, tmp_path: Path, workload: Callable[[str], Workload]
) -> None:
    socket = tmp_path / "steps.sock"
    config = tmp_path / "trainmon.yml"
    config.write_text(json.dumps(daemon_config(socket)))
    env = fake_gpu_env(fake_nvml_library, tmp_path / "node.txt", "gpus 2\nsteady * 95 2\n")
    jobs = workload(f"unix://{socket}")  # the ranks keep trying until doctor binds it
    jobs.job(ranks("compute-job", [0, 1], wait=0.002, compute=0.05, comm=0.002))
    result = doctor("--config", str(config), "--seconds", "5", "--json", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["source"]["kind"] == "local"
    assert [gpu["gpu"] for gpu in report["gpus"]] == ["0", "1"]
    # The step reports reach doctor only through the unix socket's receiver, which
    # must hand each datagram to the store promptly (not wait for a full batch).
    assert [(job["job"], job["kind"]) for job in report["jobs"]] == [("compute-job", "compute")]
    assert report["status"] == "healthy"


def test_doctor_cannot_measure_an_unreachable_daemon() -> None:
    result = doctor("--url", "127.0.0.1:9", "--seconds", "1", "--json")
    assert result.returncode == 2
    report = json.loads(result.stdout)
    assert report["status"] == "unmeasured"
    assert "cannot read http://127.0.0.1:9/metrics" in report["reason"]
    text = doctor("--url", "127.0.0.1:9", "--seconds", "1")
    assert text.returncode == 2 and "Could not measure" in text.stdout


def test_doctor_without_gpu_or_jobs_cannot_measure(tmp_path: Path) -> None:
    config = tmp_path / "trainmon.yml"
    config.write_text(json.dumps({"collectors": {"training": {"socket": str(tmp_path / "s")}}}))
    # no NVML library there; a ledger without runs (the machine's could show recent jobs'
    # last runs, which would be an answer: doctor after the job)
    result = doctor("--config", str(config), "--seconds", "1", "--json",
                    "--ledger", str(tmp_path / "no-ledger.sqlite3"),
                    env={"LD_LIBRARY_PATH": str(tmp_path)})
    assert result.returncode == 2, result.stdout + result.stderr
    assert "no GPU and no training job" in json.loads(result.stdout)["reason"]


def test_doctor_rejects_bad_arguments(tmp_path: Path) -> None:
    assert doctor("--seconds", "0").returncode == 2
    bad = tmp_path / "bad.yml"
    bad.write_text("collectors: {diagnosis: {comm_ratio: 2}}\n")
    result = doctor("--config", str(bad))
    assert result.returncode == 2
    assert "collectors.diagnosis.comm_ratio" in result.stderr


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-v"]))
