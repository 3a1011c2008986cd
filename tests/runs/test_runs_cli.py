"""``trainmon runs`` and ``trainmon compare`` over a real ledger file: output and exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testkit.daemon import free_port
from tests.runs.runs_support import STARTED, description, record, summary, write_ledger
from trainmon.cli import main


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    cost = {"currency": "CNY", "price_per_gpu_hour": 20.0, "total": 160.0,
            "per_million_samples": 36.76}
    return write_ledger(tmp_path / "ledger.sqlite3", [
        record("run-a", summary_=summary(cost=cost)),
        record("run-b", started=STARTED + 7200, ended=None, end_reason=None,
               description_=description(environment={"NCCL_IB_DISABLE": "1",
                                                      "OMP_NUM_THREADS": "8"}),
               summary_=summary(samples_per_second_median=992.0, cost=None,
                                verdicts={"communication": 900.0, "none": 10.0})),
        record("bert-1", job="bert", started=STARTED - 86400),
    ])


def test_runs_lists_newest_first_as_json(ledger: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", "--json", "--ledger", str(ledger)]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert [run["run"] for run in runs] == ["run-b", "run-a", "bert-1"]
    assert runs[1]["summary"]["cost"]["per_million_samples"] == 36.76
    assert runs[0]["end_reason"] is None and runs[1]["end_reason"] == "finished"


def test_runs_filters_by_job_and_since(ledger: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", "--json", "--ledger", str(ledger), "--job", "llama"]) == 0
    assert [r["run"] for r in json.loads(capsys.readouterr().out)["runs"]] == ["run-b", "run-a"]
    assert main(["runs", "--json", "--ledger", str(ledger),
                 "--since", "2025-12-01T09:00:00Z"]) == 0
    assert [r["run"] for r in json.loads(capsys.readouterr().out)["runs"]] == ["run-b"]


def test_runs_text_has_the_columns_and_cost(ledger: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", "--ledger", str(ledger)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["RUN", "JOB", "STARTED", "DURATION", "RANKS", "SAMPLES/S",
                                "STEP", "P50", "VERDICT", "GOODPUT", "LARGEST", "LOSS",
                                "END", "COST/M", "SAMPLES"]
    assert lines[1].split()[:2] == ["run-b", "llama"]
    assert "communication" in lines[1] and "running" in lines[1]
    assert "1 210" in lines[2] and "1h00m00s" not in lines[2] and "1h00m" in lines[2]
    assert "36.76 CNY" in lines[2] and "compute" in lines[2] and "finished" in lines[2]
    assert lines[2].split()[5:7] == ["1h00m", "8"]  # RANKS: all 8 of the job's ranks
    assert not any("ranks:" in line for line in lines)  # no note: every run is whole


def test_compare_json_names_the_change(ledger: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "run-a", "run-b", "--json", "--ledger", str(ledger)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["changes"] == [
        {"key": "NCCL_IB_DISABLE", "kind": "environment", "a": "0", "b": "1"}]
    assert result["throughput"] == {"a": 1210.0, "b": 992.0, "change_ratio": -0.1802,
                                    "basis": "job", "key": "samples_per_second_median"}
    assert result["summary"].startswith("samples/s −18 % (1 210 → 992); NCCL_IB_DISABLE 0 → 1")
    assert result["a"]["run"] == "run-a" and result["b"]["description"]["environment"]
    assert set(result) >= {"step_seconds_p50", "step_seconds_p95", "phases"}


def test_compare_text_leads_with_the_sentence(ledger: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "run-a", "run-b", "--ledger", str(ledger)]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0].startswith("samples/s −18 % (1 210 → 992)")
    assert "environment  NCCL_IB_DISABLE  0 → 1" in text
    assert "samples/s (median)" in text and "(−18 %)" in text


def test_an_unknown_run_is_a_usage_error(ledger: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "run-a", "nope", "--ledger", str(ledger)]) == 2
    assert "run 'nope' is not in the ledger" in capsys.readouterr().err


def test_a_missing_ledger_is_reported_and_not_created(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "absent" / "ledger.sqlite3"
    assert main(["runs", "--ledger", str(path)]) == 2
    assert str(path) in capsys.readouterr().err
    assert not path.exists()


def test_a_foreign_file_is_reported_and_left_alone(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ledger.sqlite3"
    path.write_bytes(b"not a database, just some bytes\n" * 100)
    before = path.read_bytes()
    assert main(["compare", "a", "b", "--ledger", str(path)]) == 2
    assert capsys.readouterr().err.startswith("trainmon: ")
    assert path.read_bytes() == before


def test_a_bad_since_names_the_accepted_forms(ledger: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", "--ledger", str(ledger), "--since", "yesterday"]) == 2
    assert "90m, 12h, 2d" in capsys.readouterr().err


def test_an_unreachable_prometheus_is_a_runtime_failure_in_one_clear_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["runs", "--prometheus", url]) == 1
    captured = capsys.readouterr()
    assert captured.err == f"trainmon: cannot reach Prometheus at {url}: connection refused\n"
    assert captured.out == ""


def test_doctor_takes_the_ledger_from_the_command_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The flag reaches the history line (the line itself: test_doctor_history)."""
    from testkit.loopback import LoopbackHTTPServer, Reply, Request
    from tests.diagnosis.diagnosis_support import StarvedNode

    path = write_ledger(tmp_path / "ledger.sqlite3", [
        record("vit-1", job="vit"),
        record("vit-2", job="vit", started=STARTED + 7200, ended=None, end_reason=None,
               summary_=summary(samples_per_second_median=600.0)),
    ])
    node = StarvedNode()

    def answer(request: Request) -> Reply:
        return Reply(200, node.text(), "text/plain; version=0.0.4")

    with LoopbackHTTPServer(answer) as server:
        main(["doctor", "--url", server.address, "--seconds", "1", "--json",
              "--ledger", str(path)])
    report = json.loads(capsys.readouterr().out)
    assert [(r["previous_run"], r["run"]) for r in report["previous_runs"]] == [
        ("vit-1", "vit-2")]


def test_figures_of_part_of_a_job_say_so_and_compare_per_rank(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One node's ledger holds 4 of the 16 ranks of run-b: the table says 4 of 16, and
    compare weighs samples/s per rank instead of reading a quarter as a slowdown."""
    path = write_ledger(tmp_path / "ledger.sqlite3", [
        record("run-a", world_size=16, ranks=16),
        record("run-b", started=STARTED + 7200, ended=STARTED + 9000, end_reason="crashed",
               world_size=16, ranks=4,
               summary_=summary(samples_per_second_median=290.0, checkpoints=1,
                                final_verdict="storage", last_checkpoint={
                                    "time": STARTED + 8000, "duration_seconds": 3.0,
                                    "path": "/ckpt/step-100.pt", "mountpoint": "/ckpt",
                                    "fstype": "nfs4", "storage": "network_fs"})),
    ])
    assert main(["runs", "--ledger", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:1] == ["run-b"] and " 4 of 16 " in lines[1]
    assert "crashed" in lines[1]
    assert lines[-1].startswith("N of M ranks: the figures cover only the ranks")
    assert main(["compare", "run-a", "run-b", "--json", "--ledger", str(path)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["throughput"] == {"a": 1210.0 / 16, "b": 290.0 / 4,
                                    "change_ratio": round(290 / 4 / (1210 / 16) - 1, 4),
                                    "basis": "per_rank", "key": "samples_per_second_median"}
    assert result["summary"].startswith(
        "samples/s per rank −4 % (75.6 → 72.5; run B: 4 of 16 ranks recorded)")
    assert result["summary"].endswith("; run B ended: crashed")
    assert (result["b"]["ranks"], result["b"]["world_size"]) == (4, 16)
    assert main(["compare", "run-a", "run-b", "--ledger", str(path)]) == 0
    text = capsys.readouterr().out
    assert "samples/s per rank" in text
    assert ("ended: crashed; world size 16; ranks recorded 4 of 16; nodes gpu-node-1; final "
            "verdict storage; 1 checkpoint save by its ranks, the last at /ckpt/step-100.pt "
            "(CFS/NFS))") in text
    assert "ended: finished; world size 16; nodes gpu-node-1)" in text


TORCHRUN_IDS = ("4cf45b15-3a0e-4f5e-9d1b-0c2a7b6e1f00", "4cf45b15-9b77-41c2-8e0d-5a3f2c1d4e99",
                "2249a018-7c6d-4e1f-a0b2-c3d4e5f60718")


@pytest.fixture
def torchrun_ledger(tmp_path: Path) -> Path:
    """Three runs with torchrun's 36-character ids, two of them sharing 8 characters."""
    return write_ledger(tmp_path / "ledger.sqlite3", [
        record(run, started=STARTED + 3600 * index,
               summary_=summary(samples_per_second_median=1000.0 - 100 * index))
        for index, run in enumerate(TORCHRUN_IDS)])


def test_compare_takes_a_unique_prefix_of_each_run_id(
        torchrun_ledger: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "4cf45b15-3", "2249a018", "--json",
                 "--ledger", str(torchrun_ledger)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["a"]["run"], result["b"]["run"]) == (TORCHRUN_IDS[0], TORCHRUN_IDS[2])
    assert result["throughput"]["change_ratio"] == -0.2
    # a whole id that is also the prefix of nothing else is itself
    assert main(["compare", TORCHRUN_IDS[1], "2249", "--ledger", str(torchrun_ledger)]) == 0


def test_an_ambiguous_prefix_lists_the_candidates(
        torchrun_ledger: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "4cf45b15", "2249a018", "--ledger", str(torchrun_ledger)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f"trainmon: run '4cf45b15' is ambiguous: it begins 2 run ids: "
                            f"{TORCHRUN_IDS[0]}, {TORCHRUN_IDS[1]}; give more of the id\n")
    assert main(["compare", "ffff", "2249a018", "--ledger", str(torchrun_ledger)]) == 2
    assert "run 'ffff' is not in the ledger" in capsys.readouterr().err
