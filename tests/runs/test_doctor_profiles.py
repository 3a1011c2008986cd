"""``trainmon doctor``'s next step of a compute verdict names the top operators of the
latest profile of the job's latest run in the ledger (``summary.profiles``: ``trainmon
profile``), in English and Chinese; without one, the ``trainmon profile`` to run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.diagnosis.diagnosis_support import WALL, PlatformNode
from tests.runs.runs_support import english_sentences, history, record, summary
from trainmon.doctor import ledger_history
from trainmon.report.document import report_json
from trainmon.report.model import Report, with_history
from trainmon.report.render import render_text

#: doctor's clock: a while after ``PlatformNode``'s window.
NOW = WALL + 3000
TRACE = "/var/lib/trainmon/profiles/llm/p-2.rank0.pt.trace.json.gz"


def operator(name: str, share: float) -> dict[str, object]:
    return {"name": name, "self_seconds": share * 2.0, "share": share, "calls": 40}


CPU = [operator("aten::mm", 0.41), operator("aten::convolution", 0.2),
       operator("aten::relu", 0.1), operator("aten::add_", 0.06),
       operator("aten::copy_", 0.05), operator("aten::fill_", 0.01)]
DEVICE = [operator("aten::mm", 0.52), operator("aten::convolution", 0.3)]


def profile(request: str, *, time: float, top_device: list[dict[str, object]] | None = None,
            error: str | None = None) -> dict[str, object]:
    return {"id": request, "rank": 0, "time": time, "steps": 5, "seconds": 1.2,
            "trace": None if error else TRACE, "trace_bytes": None if error else 48_213,
            "error": error, "self_cpu_seconds": None if error else 2.0,
            "self_device_seconds": 1.5 if top_device else None,
            "top_cpu": [] if error else list(CPU), "top_device": list(top_device or [])}


#: 12 minutes before doctor's clock; a later failure that has no operators.
PROFILED = [profile("p-2", time=NOW - 720, top_device=DEVICE),
            profile("p-3", time=NOW - 60, error="the step timed out")]


def llm_run(run: str, **summary_values: Any) -> Any:
    """A run of ``llm`` (the job ``PlatformNode`` trains) that goes on."""
    return record(run, job="llm", started=NOW - 3600, ended=None, end_reason=None,
                  summary_=summary(**summary_values))


def compute_report(tmp_path: Path, lang: str, *runs: Any) -> Report:
    """doctor's report of a compute-bound ``llm`` with a ledger holding ``runs`` (none: no
    ledger)."""
    report = PlatformNode().diagnosed(lang)
    assert [verdict.kind for verdict in report.verdicts] == ["compute"]
    if not runs:
        return report
    tmp_path.mkdir(exist_ok=True)
    return with_history(report, ledger_history(history(tmp_path, list(runs)), ["llm"], NOW))


def next_steps(report: Report) -> str:
    [line] = [line for line in render_text(report).splitlines()
              if line.startswith(("      next:", "      下一步:"))]
    return line


def test_the_compute_step_names_the_latest_profiles_top_operators(tmp_path: Path) -> None:
    report = compute_report(tmp_path, "en", llm_run("llm-1", profiles=PROFILED))
    line = next_steps(report)
    assert ("Top operators by GPU time: aten::mm 52 %, aten::convolution 30 % (profile of "
            f"rank 0, 5 steps, 12 min ago; trace: {TRACE}).") in line
    assert "torch.profiler" in line.split("Top operators")[0]  # after the compute advice
    document = report_json(report)
    [job] = document["jobs"]
    assert "Top operators by GPU time: aten::mm 52 %" in job["advice"]
    [entry] = document["previous_runs"]
    assert entry["profiles"] == PROFILED


def test_a_cpu_only_profile_names_its_cpu_operators(tmp_path: Path) -> None:
    line = next_steps(compute_report(tmp_path, "en", llm_run(
        "llm-1", profiles=[profile("p-1", time=NOW - 7200)])))
    assert ("Top operators by CPU time: aten::mm 41 %, aten::convolution 20 %, aten::relu "
            "10 %, aten::add_ 6 %, aten::copy_ 5 %, … (profile of rank 0, 5 steps, 2 h ago; "
            f"trace: {TRACE}).") in line


def test_the_profile_in_chinese(tmp_path: Path) -> None:
    line = next_steps(compute_report(tmp_path, "zh", llm_run("llm-1", profiles=PROFILED)))
    assert ("GPU 耗时最多的算子：aten::mm 52 %, aten::convolution 30 %（rank 0 的 profile，"
            f"5 步，12 分钟前；trace：{TRACE}）。") in line
    assert english_sentences(line) == []


@pytest.mark.parametrize(("lang", "step"), [
    ("en", "To see which operators take the time, profile a few steps of one rank: "
           "`trainmon profile llm`."),
    ("zh", "要查看哪些算子耗时最多，可对一个 rank 分析几步：`trainmon profile llm`。")])
def test_without_a_profile_the_step_is_to_take_one(tmp_path: Path, lang: str,
                                                   step: str) -> None:
    failed_only = llm_run("llm-1", profiles=PROFILED[1:])
    for report in (compute_report(tmp_path / "failed", lang, failed_only),
                   compute_report(tmp_path / "older", lang, llm_run("llm-1")),
                   compute_report(tmp_path, lang)):  # no ledger
        line = next_steps(report)
        assert line.endswith(step) or f"{step} " in line, line
        assert "aten::" not in line
        if lang == "zh":
            assert english_sentences(line) == []
    [job] = report_json(compute_report(tmp_path / "json", lang, failed_only))["jobs"]
    assert step in job["advice"]


def test_only_the_latest_run_counts(tmp_path: Path) -> None:
    earlier = record("llm-0", job="llm", started=NOW - 9000, ended=NOW - 5400,
                     summary_=summary(profiles=PROFILED[:1]))
    line = next_steps(compute_report(tmp_path, "en", earlier, llm_run("llm-1")))
    assert "aten::" not in line and "`trainmon profile llm`" in line


def test_a_verdict_other_than_compute_has_no_profile_step(tmp_path: Path) -> None:
    report = PlatformNode(data_wait=0.3).diagnosed("en")
    assert [verdict.kind for verdict in report.verdicts] == ["storage"]
    report = with_history(report, ledger_history(
        history(tmp_path, [llm_run("llm-1", profiles=PROFILED)]), ["llm"], NOW))
    text = render_text(report)
    assert "trainmon profile" not in text and "Top operators" not in text
    [job] = report_json(report)["jobs"]
    assert "Top operators" not in job["advice"] and "trainmon profile" not in job["advice"]
    assert job["run"]["profiles"] == PROFILED  # the run that goes on, as the ledger has it
