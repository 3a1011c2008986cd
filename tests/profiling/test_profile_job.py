"""``trainmon profile`` on real CPU training jobs, end to end: a running daemon, a
real torch job reporting over the step socket, the command, the trace kept beside the
ledger, the summary in the run's record; and a profile that fails in the job."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.daemon import Daemon, serve, trainmon_command
from testkit.exposition import parse
from testkit.prometheus import wait_until
from tests.training.training_support import line, send_datagram
from trainmon.runs.profile import ProfileClient
from trainmon.top.profiles import ProfileFollower

pytest.importorskip("torch")
pytestmark = pytest.mark.integration

#: The operators of ``testkit.profiled_job``'s model (conv, ReLU, linear layers, SGD).
MODEL_OPERATORS = {"aten::convolution", "aten::relu", "aten::addmm", "aten::mm"}


@pytest.fixture
def daemon(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Daemon]:
    """A daemon with its socket and ledger in ``tmp_path``; its requests wait
    ``request.param`` seconds for their ranks (60 unless the test says: a loaded CI
    machine may take a while to step, export and send)."""
    state = tmp_path / "state"
    state.mkdir()
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps({"collectors": {
        "training": {"socket": str(tmp_path / "run" / "steps.sock")},
        "ledger": {"path": str(state / "ledger.sqlite3"), "flush_seconds": 0.5},
        "gpu": {"enabled": False},
        "profiling": {"request_timeout_seconds": getattr(request, "param", 60)}}}))
    running = serve(config, tmp_path / "daemon.log", state_directory=state)
    yield running
    running.stop()


def start_job(tmp_path: Path, job: str, *extra: str) -> tuple[subprocess.Popen[str], Path]:
    stop = tmp_path / f"{job}.stop"
    process = subprocess.Popen(
        [sys.executable, "-m", "testkit.profiled_job", "--job", job, "--endpoint",
         f"unix://{tmp_path / 'run' / 'steps.sock'}", "--stop", str(stop), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return process, stop


def steps_of(daemon: Daemon, job: str) -> float:
    series = parse(daemon.metrics()).samples.get("trainmon_training_steps_total", {})
    return sum(value for labels, value in series.items() if dict(labels).get("job") == job)


def counted(daemon: Daemon, name: str, result: str, expected: float) -> None:
    """Until ``name{result=…}`` reads ``expected`` (derived families are evaluated on the
    daemon's clock, a moment behind)."""
    wait_until(lambda: parse(daemon.metrics()).value(name, result=result) == expected, 15,
               f"{name}{{result={result!r}}} to read {expected}", interval=0.2)


def profile(daemon: Daemon, job: str, *options: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*trainmon_command(), "profile", job, "--url", daemon.url, *options],
                          capture_output=True, text=True, timeout=120)


def finish(process: subprocess.Popen[str], stop: Path) -> dict[str, int]:
    stop.touch()
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0, out
    ended: dict[str, int] = json.loads(out.strip().splitlines()[-1])
    return ended


def test_a_running_job_is_profiled_on_demand(daemon: Daemon, tmp_path: Path) -> None:
    process, stop = start_job(tmp_path, "mlp")
    try:
        wait_until(lambda: steps_of(daemon, "mlp") > 0, 60, "the job's first report")
        done = profile(daemon, "mlp", "--steps", "3", "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        status = json.loads(done.stdout)
        rank = status["ranks_state"]["0"]
        assert rank["state"] == "stored" and rank["steps"] == 3

        # the trace: valid JSON (Chrome/Perfetto) holding the model's operators
        trace = json.loads(gzip.decompress(Path(rank["trace"]).read_bytes()))
        names = {event.get("name") for event in trace["traceEvents"]}
        assert names >= MODEL_OPERATORS
        assert Path(rank["trace"]).is_relative_to(tmp_path / "state" / "profiles")
        top = [operator["name"] for operator in rank["top_cpu"]]
        assert top and set(top) & MODEL_OPERATORS
        assert 0 < sum(operator["share"] for operator in rank["top_cpu"]) <= 1.0 + 1e-9

        # the summary in the run's ledger record (trainmon runs --json)
        def recorded() -> list[dict[str, object]]:
            runs = subprocess.run([*trainmon_command(), "runs", "--url", daemon.url, "--json",
                                   "--job", "mlp"], capture_output=True, text=True,
                                  timeout=60, check=True)
            records = json.loads(runs.stdout)["runs"]
            return records[0]["summary"].get("profiles") or [] if records else []

        wait_until(lambda: recorded() != [], 30, "the profile in the ledger")
        entry = recorded()[0]
        assert (entry["id"], entry["trace"], entry["top_cpu"]) == (
            status["id"], rank["trace"], rank["top_cpu"])

        # doctor's compute verdict names the operators (and where the trace is)
        doctor = subprocess.run(
            [*trainmon_command(), "doctor", "--url", daemon.url, "--seconds", "2",
             "--ledger", str(tmp_path / "state" / "ledger.sqlite3")],
            capture_output=True, text=True, timeout=120)
        assert "COMPUTE" in doctor.stdout, doctor.stdout + doctor.stderr
        assert f"Top operators by CPU time: {top[0]} " in doctor.stdout, doctor.stdout
        assert rank["trace"] in doctor.stdout

        # a second profile, of the human kind, while the job goes on
        again = profile(daemon, "mlp", "--steps", "2")
        assert again.returncode == 0, again.stderr
        assert "top operators (cpu self time): " in again.stdout
        counted(daemon, "trainmon_profile_results_total", "stored", 2)

        # a third, from trainmon top's p: its line names the same kind of operators
        follower = ProfileFollower(ProfileClient(daemon.url))
        assert follower.start("mlp")
        wait_until(lambda: (notice := follower.notice()) is not None
                   and notice.key not in ("asked", "running"), 90, "top's profile")
        notice = follower.notice()
        assert notice is not None and notice.key == "stored", notice
        text = notice.text("en")  # the first may be a record_function: Optimizer.step#…
        assert text.startswith("profile of mlp rank 0 (CPU self time): ") and "aten::" in text
        counted(daemon, "trainmon_profile_results_total", "stored", 3)
    finally:
        ended = finish(process, stop)
    assert ended["sent"] == 3 and ended["failed"] == 0


@pytest.mark.gpu
def test_a_cuda_job_is_profiled_with_its_kernels_and_doctor_reads_gpu_time(
        daemon: Daemon, tmp_path: Path) -> None:
    """The CUDA half of a profile (``ProfilerActivity.CUDA``): the trace holds the
    model's kernels, the summary its operators by GPU self time, and doctor says so."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    process, stop = start_job(tmp_path, "cuda-mlp", "--device", "cuda:0")
    try:
        wait_until(lambda: steps_of(daemon, "cuda-mlp") > 0, 120, "the job's first report")
        done = profile(daemon, "cuda-mlp", "--steps", "3", "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        rank = json.loads(done.stdout)["ranks_state"]["0"]
        assert rank["state"] == "stored", rank
        trace = json.loads(gzip.decompress(Path(rank["trace"]).read_bytes()))
        kernels = [event for event in trace["traceEvents"] if event.get("cat") == "kernel"]
        assert kernels, "no CUDA kernel in the trace"
        device = [operator["name"] for operator in rank["top_device"]]
        assert device and set(device) & MODEL_OPERATORS, rank["top_device"]
        print(f"top by GPU self time: {rank['top_device']}")
        doctor = subprocess.run(
            [*trainmon_command(), "doctor", "--url", daemon.url, "--seconds", "2",
             "--ledger", str(tmp_path / "state" / "ledger.sqlite3")],
            capture_output=True, text=True, timeout=120)
        assert "Top operators by GPU time: " in doctor.stdout, doctor.stdout + doctor.stderr
    finally:
        ended = finish(process, stop)
    assert ended["sent"] == 1 and ended["failed"] == 0


def test_a_profile_that_cannot_run_fails_once_and_training_goes_on(
        daemon: Daemon, tmp_path: Path) -> None:
    """The job runs a torch.profiler of its own: ours cannot start. The job says so
    once, the daemon counts it, and the job keeps stepping."""
    process, stop = start_job(tmp_path, "busy", "--own-profiler")
    try:
        wait_until(lambda: steps_of(daemon, "busy") > 0, 60, "the job's first report")
        done = profile(daemon, "busy", "--steps", "2")
        assert done.returncode == 1, done.stdout + done.stderr
        assert "rank 0: " in done.stdout and "rank 0: 2 step(s)" not in done.stdout
        counted(daemon, "trainmon_profile_results_total", "failed", 1)
        before = steps_of(daemon, "busy")
        wait_until(lambda: steps_of(daemon, "busy") > before, 30, "the job to step on")
        unknown = profile(daemon, "no-such-job")
        assert unknown.returncode == 2 and "no rank of job" in unknown.stderr
        counted(daemon, "trainmon_profile_requests_total", "not_found", 1)
    finally:
        ended = finish(process, stop)
    assert ended["failed"] == 1 and ended["sent"] == 0
    assert "a torch.profiler of the job's own is running" in daemon.log()


@pytest.mark.parametrize("daemon", [5], indirect=True)
def test_a_request_no_rank_answers_expires(daemon: Daemon, tmp_path: Path) -> None:
    """A rank that reports but no longer steps never reaches a step boundary."""
    send_datagram(tmp_path / "run" / "steps.sock", line(job="silent"))
    wait_until(lambda: steps_of(daemon, "silent") > 0, 30, "the report")
    started = time.monotonic()
    done = profile(daemon, "silent", "--wait", "60")
    assert done.returncode == 1 and "never answered" in done.stdout, done.stdout
    assert 4 <= time.monotonic() - started < 60
    counted(daemon, "trainmon_profile_results_total", "expired", 1)


def test_every_rank_of_a_ddp_job_is_profiled_with_its_collectives(
        daemon: Daemon, tmp_path: Path) -> None:
    """``--all``: both ranks of a real 2-rank DDP job (gloo) profile the same steps'
    worth, and their traces hold the gradient all-reduce beside the model's operators."""
    from testkit.daemon import free_port

    environment = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                   "MASTER_PORT": str(free_port()), "GLOO_SOCKET_IFNAME": "lo",
                   "TRAINMON_ENDPOINT": f"unix://{tmp_path / 'run' / 'steps.sock'}",
                   "TRAINMON_JOB": "ddp", "OMP_NUM_THREADS": "1"}
    ranks = [subprocess.Popen(
        [sys.executable, "-m", "testkit.ddp_job", "failslow", "--device-seconds", "0.02",
         "--timeout", "90"], env={**environment, "RANK": str(rank), "LOCAL_RANK": str(rank)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for rank in (0, 1)]
    try:
        wait_until(lambda: len(parse(daemon.metrics()).labelsets(
            "trainmon_training_steps_total")) == 2, 60, "both ranks reporting")
        done = profile(daemon, "ddp", "--all", "--steps", "3", "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        states = json.loads(done.stdout)["ranks_state"]
        assert sorted(states) == ["0", "1"]
        for state in states.values():
            names = {event.get("name") for event in json.loads(gzip.decompress(
                Path(state["trace"]).read_bytes()))["traceEvents"]}
            assert "aten::addmm" in names or "aten::mm" in names
            assert any("all_reduce" in str(name) or "allreduce" in str(name)
                       for name in names), sorted(str(name) for name in names)[:40]
    finally:
        for process in ranks:
            process.terminate()
        for process in ranks:
            process.wait(timeout=30)
