"""``trainmon doctor``'s run history names the fail-slow changes the ledger recorded for
the job's run and the run it is measured against, in English and Chinese."""

from __future__ import annotations

import json
from pathlib import Path

from tests.runs.runs_support import (
    DOCTOR_NOW,
    current,
    doctor,
    earlier,
    english_sentences,
    history,
    summary,
    text_of,
)
from trainmon.ledger import RunRecord

#: 10:45:00 UTC, a quarter of an hour before doctor's clock.
AT = DOCTOR_NOW - 900
THROTTLED = {"rank": "1", "part": "compute", "kind": "scheduling", "cause": "cpu_throttled",
             "ratio": 0.35, "start": AT, "seconds": 300.0}
SLOWER_DATA = {"rank": "", "part": "data_wait", "kind": "storage", "cause": "data_loading",
               "ratio": 0.12, "start": AT - 600, "seconds": 60.0}


def with_fail_slow(run: RunRecord, *changes: dict[str, object]) -> RunRecord:
    return RunRecord(**{**run.__dict__, "summary": {**run.summary, "fail_slow": list(changes)}})


def lines_with(text: str, word: str) -> list[str]:
    return [line for line in text.splitlines() if word in line]


def test_the_running_runs_fail_slow_is_under_its_history_line(
        tmp_path: Path, daemon_url: str) -> None:
    ledger = history(tmp_path, [earlier("vit-1", 1000.0),
                                with_fail_slow(current(780.0), SLOWER_DATA, THROTTLED)])
    text = text_of(daemon_url, ledger)
    lines = text.splitlines()
    index = lines.index("Run history (this node's ledger)")
    assert lines[index + 2] == (
        "      fail-slow in run vit-2: rank 1 became 35% slower at 10:45:00 UTC for 5m00s: "
        "its compute per step grew; its cgroup's CPU quota throttles it "
        "(and 1 more: trainmon compare)")
    assert len(lines_with(text, "fail-slow in run")) == 1  # the baseline had none
    [entry] = json.loads(doctor(daemon_url, ledger, json_out=True)[1])["previous_runs"]
    assert entry["fail_slow"] == [SLOWER_DATA, THROTTLED]
    assert entry["baseline"]["fail_slow"] == []


def test_the_fail_slow_in_chinese(tmp_path: Path, daemon_url: str) -> None:
    ledger = history(tmp_path, [earlier("vit-1", 1000.0),
                                with_fail_slow(current(780.0), THROTTLED)])
    [line] = lines_with(text_of(daemon_url, ledger, lang="zh"), "fail-slow")
    assert line == ("      运行 vit-2 中出现 fail-slow：rank 1 从 10:45:00 UTC 起慢了 35%，"
                    "持续 5m00s：每步计算时间变长了；它所在 cgroup 的 CPU 配额在限流")
    assert english_sentences(line) == []


def test_after_the_job_both_runs_fail_slow_in_either_language(
        tmp_path: Path, idle_url: str) -> None:
    ended = RunRecord(**{**earlier("vit-2", 780.0, started=DOCTOR_NOW - 3600 - 720).__dict__,
                         "summary": summary(samples_per_second_median=780.0,
                                            fail_slow=[THROTTLED])})
    baseline = with_fail_slow(earlier("vit-1", 1000.0), SLOWER_DATA)
    ledger = history(tmp_path, [baseline, ended])
    code, text = doctor(idle_url, ledger)
    assert code == 0
    assert lines_with(text, "fail-slow") == [
        "      fail-slow in run vit-2: rank 1 became 35% slower at 10:45:00 UTC for 5m00s: "
        "its compute per step grew; its cgroup's CPU quota throttles it",
        "      fail-slow in run vit-1: the job became 12% slower at 10:35:00 UTC for 1m00s: "
        "its data wait per step grew; its data loading got slower"]
    code, text = doctor(idle_url, ledger, lang="zh")
    assert code == 0 and len(lines_with(text, "fail-slow")) == 2
    assert english_sentences(text) == []
    [entry] = json.loads(doctor(idle_url, ledger, json_out=True)[1])["recent_runs"]
    assert (entry["fail_slow"], entry["baseline"]["fail_slow"]) == ([THROTTLED], [SLOWER_DATA])


def test_a_run_without_fail_slow_adds_no_line(tmp_path: Path, daemon_url: str) -> None:
    ledger = history(tmp_path, [earlier("vit-1", 1000.0), current(780.0)])
    assert "fail-slow" not in text_of(daemon_url, ledger)
