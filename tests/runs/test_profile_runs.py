"""``trainmon runs`` and ``trainmon compare`` show the profiles a run's ledger record
holds (``summary.profiles``: ``trainmon profile``), over a real ledger file; the words
of the top operators are ``trainmon.runs.profiles``'."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.runs.runs_support import STARTED, record, summary, write_ledger
from trainmon.cli import main
from trainmon.runs.profiles import latest_profile, operators_text, top_operators
from trainmon.runs.view import RunView

#: 08:30 UTC on the runs' day.
AT = STARTED + 30 * 60
TRACE = "/var/lib/trainmon/profiles/llama/p-2.rank0.pt.trace.json.gz"


def operator(name: str, share: float, calls: int = 120) -> dict[str, object]:
    return {"name": name, "self_seconds": round(share * 2.0, 6), "share": share,
            "calls": calls}


CPU = [operator("aten::mm", 0.41), operator("aten::addmm", 0.12),
       operator("aten::convolution", 0.1), operator("aten::relu", 0.05),
       operator("aten::add_", 0.04), operator("aten::copy_", 0.003)]
DEVICE = [operator("aten::mm", 0.52), operator("aten::convolution", 0.3)]


def profile(request: str, *, rank: int = 0, time: float = AT, steps: int = 5,
            top_cpu: list[dict[str, object]] | None = None,
            top_device: list[dict[str, object]] | None = None, trace: str | None = TRACE,
            error: str | None = None) -> dict[str, object]:
    """A profile as the ledger records it (``trainmon.ledger.summary.profile_entries``)."""
    return {"id": request, "rank": rank, "time": time, "steps": steps, "seconds": 1.2,
            "trace": trace, "trace_bytes": None if trace is None else 48_213,
            "error": error, "self_cpu_seconds": None if error else 2.0,
            "self_device_seconds": 1.5 if top_device else None,
            "top_cpu": list(CPU if top_cpu is None else top_cpu),
            "top_device": list(top_device or [])}


FAILED = profile("p-1", time=AT - 600, trace=None, error="the step timed out",
                 top_cpu=[])
PROFILED = [FAILED, profile("p-2", top_device=DEVICE)]


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    return write_ledger(tmp_path / "ledger.sqlite3", [
        record("run-a", summary_=summary()),  # an older record: no profiles
        record("run-b", started=STARTED + 7200, ended=STARTED + 10800,
               summary_=summary(samples_per_second_median=992.0, profiles=PROFILED)),
        record("run-c", started=STARTED + 14400, ended=STARTED + 18000,
               summary_=summary(profiles=[profile("p-3", rank=1, time=AT + 14400)])),
        record("run-d", started=STARTED + 21600, ended=STARTED + 25200,
               summary_=summary(profiles=[FAILED])),
    ])


def test_the_words_name_five_operators_and_their_shares() -> None:
    assert operators_text(CPU) == ("aten::mm 41 %, aten::addmm 12 %, aten::convolution 10 %, "
                                   "aten::relu 5 %, aten::add_ 4 %, …")
    assert operators_text(CPU[-1:]) == "aten::copy_ <1 %"
    assert operators_text([]) == "-"
    assert top_operators(profile("p", top_device=DEVICE)) == (
        "device", "aten::mm 52 %, aten::convolution 30 %")
    assert top_operators(profile("p"))[0] == "cpu"  # a CPU-only job


def test_the_latest_profile_is_the_newest_with_operators() -> None:
    newer_failure = profile("p-9", time=AT + 60, trace=None, error="no steps", top_cpu=[])
    found = latest_profile({"profiles": [*PROFILED, newer_failure]})
    assert found is not None and found["id"] == "p-2"
    assert latest_profile({"profiles": [FAILED]}) is None
    assert latest_profile({}) is None


def test_runs_json_carries_the_profiles(ledger: Path, capsys: pytest.CaptureFixture[str]
                                        ) -> None:
    assert main(["runs", "--json", "--ledger", str(ledger), "--job", "llama"]) == 0
    runs = {run["run"]: run for run in json.loads(capsys.readouterr().out)["runs"]}
    assert runs["run-b"]["summary"]["profiles"] == PROFILED
    assert "profiles" not in runs["run-a"]["summary"]


def test_runs_text_keeps_its_columns(ledger: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", "--ledger", str(ledger)]) == 0
    header = capsys.readouterr().out.splitlines()[0].split()
    assert not any("PROFILE" in cell or "OPERATOR" in cell for cell in header)


def test_a_run_over_two_nodes_keeps_both_nodes_profiles() -> None:
    rank_0 = profile("p-all", rank=0, time=AT)
    rank_8 = profile("p-all", rank=8, time=AT + 1)
    view = RunView.from_records([
        record("run-x", node="gpu-node-1", world_size=16,
               summary_=summary(profiles=[rank_0])),
        record("run-x", node="gpu-node-2", world_size=16,
               summary_=summary(profiles=[rank_8, rank_0]))])
    assert view.to_json()["summary"]["profiles"] == [rank_0, rank_8]  # type: ignore[index]


def test_compare_shows_each_runs_latest_profile(ledger: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "run-a", "run-b", "--ledger", str(ledger)]) == 0
    text = capsys.readouterr().out
    assert "aten::" not in text.splitlines()[0]  # a profile is no change: not in the sentence
    section = text[text.index("profiles (the latest of each run"):].splitlines()
    assert section[1:3] == [
        "  run A: none recorded",
        "  run B: rank 0, 5 steps (1.20 s) at 2025-12-01 08:30 UTC: CPU aten::mm 41 %, "
        "aten::addmm 12 %, aten::convolution 10 %, aten::relu 5 %, aten::add_ 4 %, …; "
        f"GPU aten::mm 52 %, aten::convolution 30 %; trace {TRACE}"]


def test_compare_of_a_cpu_job_and_a_failed_profile(ledger: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "run-c", "run-d", "--ledger", str(ledger)]) == 0
    text = capsys.readouterr().out
    section = text[text.index("profiles (the latest of each run"):].splitlines()
    assert section[1].startswith("  run A: rank 1, 5 steps (1.20 s) at 2025-12-01 12:30 UTC: "
                                 "CPU aten::mm 41 %,")
    assert "GPU" not in section[1]
    assert section[2] == ("  run B: rank 0 at 2025-12-01 08:20 UTC: failed: "
                          "the step timed out")


def test_compare_without_profiles_has_no_section(ledger: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "run-a", "run-a", "--ledger", str(ledger)]) == 0
    out = capsys.readouterr().out
    assert "profiles (" not in out


def test_compare_json_carries_the_profiles_and_their_words(
        ledger: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "run-a", "run-b", "--json", "--ledger", str(ledger)]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["profiles"] == {"a": [], "b": PROFILED}
    assert document["top_operators"] == {"a": None, "b": {
        "id": "p-2", "rank": 0, "time": AT,
        "cpu": "aten::mm 41 %, aten::addmm 12 %, aten::convolution 10 %, aten::relu 5 %, "
               "aten::add_ 4 %, …",
        "device": "aten::mm 52 %, aten::convolution 30 %"}}
