"""``trainmon runs`` and ``trainmon compare`` show the fail-slow changes a run's ledger
record holds (``summary.fail_slow``), over a real ledger file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.runs.runs_support import STARTED, record, summary, write_ledger
from trainmon.cli import main
from trainmon.runs.compare import compare
from trainmon.runs.view import RunView

#: 08:42 UTC on the runs' day.
AT = STARTED + 42 * 60


def change(rank: str, ratio: float, *, part: str = "compute", cause: str = "cpu_throttled",
           kind: str = "scheduling", start: float = AT, seconds: float = 300.0
           ) -> dict[str, object]:
    return {"rank": rank, "part": part, "kind": kind, "cause": cause, "ratio": ratio,
            "start": start, "seconds": seconds}


SLOWED = [change("", 0.12, part="data_wait", cause="data_loading", kind="storage",
                 start=AT - 600), change("1", 0.35)]


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    return write_ledger(tmp_path / "ledger.sqlite3", [
        record("run-a", summary_=summary(fail_slow=[])),
        record("run-b", started=STARTED + 7200, ended=STARTED + 10800,
               summary_=summary(samples_per_second_median=992.0, fail_slow=SLOWED)),
        record("run-c", started=STARTED + 14400, ended=STARTED + 18000,
               summary_=summary(fail_slow=[change("3", 0.2, part="comm",
                                                  cause="network_errors",
                                                  kind="communication")])),
    ])


def test_runs_shows_each_runs_largest_fail_slow(ledger: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", "--ledger", str(ledger)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "FAIL-SLOW" in lines[0].split()
    column = lines[0].index("FAIL-SLOW")
    cells = {line.split()[0]: line[column:].split("  ")[0] for line in lines[1:4]}
    assert cells == {"run-c": "rank 3 +20 % comm", "run-b": "rank 1 +35 % compute +1 more",
                     "run-a": "-"}


def test_runs_without_any_fail_slow_has_no_column(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = write_ledger(tmp_path / "ledger.sqlite3", [record("run-a")])  # an older record
    assert main(["runs", "--ledger", str(path)]) == 0
    assert "FAIL-SLOW" not in capsys.readouterr().out


def test_runs_json_carries_the_changes(ledger: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", "--json", "--ledger", str(ledger), "--job", "llama"]) == 0
    runs = {run["run"]: run for run in json.loads(capsys.readouterr().out)["runs"]}
    assert runs["run-b"]["summary"]["fail_slow"] == SLOWED
    assert runs["run-a"]["summary"]["fail_slow"] == []


def test_compare_says_which_run_slowed_during_the_run(ledger: Path,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    assert main(["compare", "run-a", "run-b", "--ledger", str(ledger)]) == 0
    text = capsys.readouterr().out
    assert ("run B slowed during the run, run A did not: rank 1 +35 % compute "
            "(cpu_throttled) at 08:42 UTC") in text.splitlines()[0]
    section = text[text.index("fail-slow (a rank or the job"):].splitlines()
    assert section[1:4] == [
        "  run A: none recorded",
        "  run B: the job +12 % data_wait (data_loading) at 08:32 UTC for 5m00s",
        "  run B: rank 1 +35 % compute (cpu_throttled) at 08:42 UTC for 5m00s"]
    assert main(["compare", "run-b", "run-a", "--json", "--ledger", str(ledger)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["fail_slow"] == {"a": SLOWED, "b": []}
    assert "run A slowed during the run, run B did not" in result["summary"]


def test_compare_of_two_runs_that_slowed_names_both(ledger: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "run-b", "run-c", "--ledger", str(ledger)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert ("both runs slowed during the run (A: rank 1 +35 % compute (cpu_throttled) at "
            "08:42 UTC; B: rank 3 +20 % comm (network_errors) at 08:42 UTC)") in first


def test_compare_of_runs_without_fail_slow_says_nothing_of_it(
        ledger: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "run-a", "run-a", "--ledger", str(ledger)]) == 0
    assert "slow" not in capsys.readouterr().out


def test_a_multi_node_run_shows_its_nodes_changes_together() -> None:
    nodes = [record("run-m", node="gpu-node-1", ranks=4,
                    summary_=summary(fail_slow=[change("1", 0.35)])),
             record("run-m", node="gpu-node-2", ranks=4,
                    summary_=summary(fail_slow=[change("6", 0.5, cause="gpu_thermal",
                                                       start=AT + 60)]))]
    merged = RunView.from_records(nodes)
    assert [(c["rank"], c["ratio"]) for c in merged.summary["fail_slow"]] == [
        ("1", 0.35), ("6", 0.5)]
    single = RunView.from_records([record("run-s")])
    assert "run B slowed during the run, run A did not: rank 6 +50 % compute " \
           "(gpu_thermal) at 08:43 UTC" in compare(single, merged).summary


def test_a_malformed_or_hostile_record_cannot_reach_the_terminal(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_ledger(tmp_path / "ledger.sqlite3", [
        record("run-a", summary_=summary(fail_slow=[{"rank": 1, "ratio": "big"}, "x"])),
        record("run-b", started=STARTED + 7200,
               summary_=summary(fail_slow=[change("1", 0.3, cause="x\x1b[2J\ny")])),
    ])
    assert main(["runs", "--ledger", str(path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "rank 1 +30 % compute" in out
    assert main(["compare", "run-a", "run-b", "--ledger", str(path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "run A: none recorded" in out
